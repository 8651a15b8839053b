"""The reading of ``make bench-peers`` (``zarrtorch.course.peers_table``) on made-up results: the ratios to
zarrtorch per worker count, the verdicts, who keeps every guarantee, the figure, and the reference page
``docs/peers.md`` (which says what its store cannot show); the committed JSON is the run that wrote
``benchmarks/peers.md``, and the committed page is what the generator writes from it."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from zarrtorch.course import peers_table  # noqa: E402
from zarrtorch.course.paths import repo_root  # noqa: E402


def _run(rows_per_s: float, held: float) -> dict:
    epoch = {"rows": 64, "seconds": 64 / rows_per_s, "rows_per_s": rows_per_s, "ttfb_s": 0.1, "held_mib": held}
    return {"epochs": [epoch, dict(epoch, held_mib=held + 1)]}


def _results() -> dict:
    every = {key: "yes" for _, key in peers_table.guarantee_columns()}
    return {
        "l0": {"rows_per_s": 400.0, "threads": 2},
        "peers": [
            {
                "name": "zarrtorch",
                "status": "ok",
                "throughput": {"0": _run(100.0, 10), "2": _run(200.0, 20)},
                "throughput_2ranks": {"0": _run(80.0, 8)},
                "guarantees": {"workers": 2, **every},
            },
            {
                "name": "Other",
                "status": "ok",
                "throughput": {"0": _run(50.0, 5), "2": _run(400.0, 30)},
                "throughput_2ranks": {"0": _run(120.0, 6)},
                "conversion": {"conversion_s": 3.0, "disk_bytes": 2**21},
                "guarantees": {
                    "workers": 2,
                    **every,
                    "resume_exact": "yes: same rows, other order",
                    "equal_batches": "no",
                },
            },
            {"name": "Broken", "status": "not installable", "reason": "not installable: needs a CUDA torchvision"},
        ],
    }


def test_records_verdicts_and_the_loaders_that_keep_every_guarantee():
    results = _results()
    records = {(r["loader"], r["ranks"], r["workers"]): r for r in peers_table.runs(results)}
    assert set(records) == {(name, 1, w) for name in ("zarrtorch", "Other") for w in (0, 2)} | {
        ("zarrtorch", 2, 0),
        ("Other", 2, 0),
    }
    assert records["Other", 1, 0]["x_zarrtorch"] == 0.5 and records["Other", 1, 2]["x_zarrtorch"] == 2.0
    assert records["Other", 2, 0]["x_zarrtorch"] == 1.5  # against zarrtorch's rank 0 of 2
    assert records["Other", 1, 2]["held_mib"] == 31 and records["Other", 1, 2]["conversion"]["conversion_s"] == 3.0
    assert {r["ranks"] for r in peers_table.runs(results, ranks=1)} == {1}
    assert peers_table.not_run(results) == {"Broken": "not installable: needs a CUDA torchvision"}
    assert peers_table.kept("yes: same rows, other order") and not peers_table.kept("no")
    assert peers_table.keeps_all(results) == ["zarrtorch"]
    assert peers_table.verdicts(results)["Other"]["equal batches per rank"] == "no"
    ax = peers_table.figure(results)
    assert len(ax.collections) >= 4 and "MiB" in ax.get_ylabel() and "rows/s" in ax.get_xlabel()


def test_the_committed_json_is_the_run_of_the_committed_page():
    results = peers_table.load()
    page = (repo_root() / "benchmarks" / "peers.md").read_text(encoding="utf-8")
    assert f"on {results['date']}:" in page  # the page's header names the run's date
    assert "| zarrtorch |" in peers_table.markdown(results)
    assert "zarrtorch" in peers_table.keeps_all(results)


def _run_results(rows: int = 2048, chunk_rows: int = 128, start_method: str | None = None) -> dict:
    """Made-up results with what the page's text reads besides the peers: the store, the settings, the run."""
    results = _results()
    results["store"] = {
        "rows": rows,
        "chunk_rows": chunk_rows,
        "sample_shape": [16, 32, 32],
        "dtype": "float32",
        "codec": "zstd",
        "level": 3,
        "decoded_bytes": rows * 2**16,
        "stored_bytes": rows * 2**15,
    }
    results["settings"] = {"rows": rows, "chunk_rows": chunk_rows, "batch_size": 64, "workers": [0, 2]}
    if start_method:
        results["settings"]["start_method"] = start_method
    results.update(date="2026-01-01T00:00", machine="m: 2 CPUs", wall_s=10.0)
    return results


def _words(text: str) -> str:
    """The page's text with its lines joined: its paragraphs are wrapped wherever their values fall."""
    return " ".join(text.split())


def test_the_page_says_when_its_store_cannot_trigger_the_failures_of_an_uneven_split_or_a_spawn_start():
    """Issue 45: A2 gave every loader "every row once" and "equal batches" from a store of 16 full chunks read by
    2 ranks x 2 forked workers, which no loader can fail by dealing unequal shares, and did not say so. The page
    says it whenever the split is even and the workers forked, and not otherwise."""
    even = _words(peers_table.page(_run_results()))
    assert "cannot trigger the failures of an uneven split or of a spawn start" in even
    assert "16 full chunks of 128 rows" in even and "2 ranks x 2 workers = 4 reading processes" in even
    for uneven in (_run_results(rows=2000), _run_results(rows=2048 + 128), _run_results(start_method="spawn")):
        text = _words(peers_table.page(uneven))
        assert "cannot trigger" not in text and "can trigger the failures" in text
    assert "a last chunk of 80 rows" in _words(peers_table.page(_run_results(rows=2000)))
    assert peers_table.guarantee_setting(_run_results(rows=2048 + 128))["even"] is False  # 17 chunks over 4 readers


def test_the_page_explains_every_guarantee_column_and_names_who_keeps_all_six():
    assert list(peers_table.GUARANTEE_MEANING) == [c for c, _ in peers_table.guarantee_columns()]
    text = peers_table.page(_run_results())
    assert "(1 of 2 loaders checked): zarrtorch." in text
    assert "- Other fails 2: mid-epoch resume exact: yes: same rows, other order" not in text  # a kept verdict
    assert "- Other fails 1: equal batches per rank: no." in text
    assert "Other with 2 workers (2.00x)" in text  # ahead of zarrtorch by more than a tie
    assert peers_table.markdown(_run_results()) in text


def test_docs_peers_md_is_what_the_generator_writes_from_the_committed_json(tmp_path):
    """The committed reference page, regenerated from the committed JSON, is unchanged: edit the generator (or
    rerun make bench-peers), never the page."""
    committed = (repo_root() / peers_table.PAGE).read_text(encoding="utf-8")
    assert committed == peers_table.page(peers_table.load()), (
        f"{peers_table.PAGE} is not what the generator writes: "
        f"python -m zarrtorch.course.peers_table --md {peers_table.PAGE} --png {peers_table.FIGURE}"
    )
    out = tmp_path / "peers.md"
    assert peers_table.main(["--md", str(out), "--png", str(tmp_path / "peers.png")]) == 0
    assert out.read_text(encoding="utf-8") == committed
    figure = repo_root() / peers_table.FIGURE
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and figure.stat().st_size < 200_000
    assert f"]({figure.name})" in committed


def _with_layouts() -> dict:
    """Made-up results with a beluga peer, an uncompressed zarrtorch copy, LitData, and a layouts part."""
    results = _run_results()
    every = {key: "yes" for _, key in peers_table.guarantee_columns()}
    no_resume = {"resume_exact": "no API", "resume_other_world": "no API", "resume_other_workers": "no API"}
    results["peers"] += [
        {
            "name": "zarr-beluga 0.3.0",
            "status": "ok",
            "throughput": {"0": _run(300.0, 4)},
            "guarantees": {"workers": 2, **every, **no_resume},
        },
        {"name": "zarrtorch, uncompressed copy", "status": "ok", "throughput": {"0": _run(150.0, 9)}},
        {"name": "LitData", "status": "ok", "throughput": {"0": _run(100.0, 3)}},
    ]

    def run(store, loader, per_s, *, setting="", batch=32, workers=0, refused=None, cut=None):
        """A layouts run of 3 rounds: ``per_s`` one rate for all or one per round."""
        rounds = []
        for v in per_s if isinstance(per_s, list) else [per_s] * 3:
            result = {"refused": refused} if refused else _run(v, 1)
            if cut:
                result["epochs"] = [dict(e, capped_after_s=cut) for e in result["epochs"]]
            rounds.append(result)
        return {
            "store": store,
            "setting": setting,
            "loader": loader,
            "frames": 6,
            "workers": workers,
            "batch": batch,
        } | {"rounds": rounds}

    beluga = "zarr-beluga 0.3.0"
    results["layouts"] = {
        "stores": {"course": {"stored_bytes": 2**20}, "sharded": {"stored_bytes": 2**21}, "wb2": {"stored_bytes": 1}},
        "described": {"course": "the peers' store", "sharded": "Zarr v3 shards", "wb2": "a Zarr v2 group"},
        "window_frames": 6,
        "window_batch": 32,
        "row_batch": 64,
        "runs": [
            run("course", beluga, [5.0, 4.0, 10.0], cut=20),
            run("course", beluga, 6.0, batch=0, cut=20),
            run("course", "zarrtorch", [500.0, 600.0, 700.0]),
            run("course", "zarrtorch", [800.0, 400.0, 1000.0], workers=2),
            run("sharded", beluga, 400.0),
            run("sharded", "zarrtorch", None, refused="LayoutError: sharded ... pass allow_shards=True"),
            run("sharded", "zarrtorch", 200.0, setting="allow_shards"),
            run("wb2", beluga, 100.0),
            run("wb2", "zarrtorch", None, refused="LayoutError: array 'u' is chunked along axis 1"),
            run("wb2", "zarrtorch", 50.0, setting="decode_cf"),
        ],
    }
    results["layouts"]["layout_rounds"] = 3
    results["layouts"]["rounds"] = [
        {"store": "course", "frames": 6, "round": k, "utc": [f"2026-11-29T03:0{k}:00Z", f"2026-11-29T03:0{k}:50Z"]}
        | {"load_average": [1.5, 2.5 + k]}
        for k in (1, 2, 3)
    ]
    results["layouts"]["load_average"] = [1.5, 5.5]
    results["settings"]["layout_cap"] = 20
    return results


def test_the_layouts_summary_compares_each_loader_s_best_and_names_refusals_and_cut_epochs():
    """A run with a setting zarrtorch has made its default since (allow_shards, issue 43) counts as its default
    figure; a refusal that names a setting still in force is a refusal."""
    course, sharded, wb2 = peers_table.layout_summary(_with_layouts())
    assert (course["beluga"], course["beluga_samples"], course["zarrtorch"]) == (5.0, 6.0, 800.0)  # medians
    assert course["beluga_cut"] and not course["zarrtorch_cut"]
    assert sharded["zarrtorch"] == 200.0 and sharded["x"] == 0.5 and sharded["zarrtorch_now_default"] == "allow_shards"
    assert wb2["zarrtorch"] is None and wb2["x"] is None and wb2["zarrtorch_with_setting"] == 50.0
    assert wb2["zarrtorch_refused"].startswith("LayoutError") and wb2["zarrtorch_now_default"] is None


def test_the_layouts_summary_takes_each_ratio_within_a_round_at_each_side_s_best_worker_count():
    """Issue 43, item 5: the page's ratios came from runs one after the other (0.81x for WeatherBench2-style rows
    where loaders alternating in the same minutes measured 1.08x-1.63x). A ratio is now taken within each round,
    zarrtorch's best worker count of the round over beluga's best batched one of the same round, and summed up by
    its median and range: here the rounds give 800/5, 600/4 and 1,000/10, so 150 [100-160], where the medians
    (800 and 5) would say 160; with 0 workers each, 500/5, 600/4 and 700/10: 100 [70-150]."""
    course = peers_table.layout_summary(_with_layouts())[0]
    assert (course["x"], course["x_range"]) == (150.0, (100.0, 160.0))
    assert (course["x_no_workers"], course["x_no_workers_range"]) == (100.0, (70.0, 150.0))
    said = " ".join(peers_table.page(_with_layouts()).split())
    assert "- course, windows of 6: zarrtorch 800/s: **150.00x** [100.00-160.00] beluga's best in batches" in said
    assert "**100.00x** [70.00-150.00] with 0 workers each" in said
    assert "For each store and sample kind, 3 rounds, from 2026-11-29T03:01:00Z to 2026-11-29T03:03:50Z" in said
    assert "1-minute load average 1.5-5.5 over the runs" in said


def test_the_page_shows_beluga_s_verdicts_its_layouts_and_uncompressed_against_uncompressed():
    text = peers_table.page(_with_layouts())
    words = _words(text)
    assert "- zarr-beluga 0.3.0 fails 3: mid-epoch resume exact: no API;" in text
    assert (
        "## zarr-beluga's layouts" in text
        and peers_table.table_module().layouts_markdown(_with_layouts()["layouts"]) in text
    )
    course = "- course, windows of 6: zarrtorch 800/s: **150.00x** [100.00-160.00] beluga's best in batches, "
    course += "**100.00x** [70.00-150.00] with 0 workers each; beluga 5/s in batches"
    assert course + ", 6/s one by one (epochs cut)." in text
    assert "- wb2, windows of 6: zarrtorch refuses it by default (with the setting its error names, 50/s)" in text
    sharded = "- sharded, windows of 6: zarrtorch 200/s (measured with allow_shards=True, the default since issue 43)"
    assert sharded + ": **0.50x** beluga's best in batches" in text
    assert "Epochs longer than 20 s are cut" in words
    assert "0 workers: 150 rows/s against LitData 100 (1.50x)" in text
    assert "## zarr-beluga's layouts" not in peers_table.page(_run_results())  # a run without the part


def _uneven_pass(start_method: str, peers: list[dict]) -> dict:
    """A made-up uneven pass: 2,150 rows in chunks of 128 (17 chunks, the last of 102 rows), workers started by
    ``start_method``."""
    return {
        "store": {"rows": 2150, "chunk_rows": 128},
        "settings": {"rows": 2150, "chunk_rows": 128, "batch_size": 64, "workers": [2], "start_method": start_method},
        "date": "2026-01-02T00:00" if start_method == "spawn" else "2026-01-03T00:00",
        "wall_s": 300.0,
        "peers": peers,
    }


TWICE = "wrong: 2075 rows twice, 1 missing"  # "Spawny"'s spawned ranks both read nearly every row
LOST = "wrong: 0 rows twice, 86 missing"  # its forked ranks deal whole chunks unequally


def _with_uneven() -> dict:
    """Made-up results with both uneven passes: 2,150 rows in 17 chunks, workers forked, then spawned; "Spawny"
    keeps all six on the even store, yields 16 and 17 batches and loses rows on the uneven one with forked
    workers, and reads rows twice with spawned ones; "Other" fails on every store, "Broken" is not installable."""
    results = _run_results()
    every = {key: "yes" for _, key in peers_table.guarantee_columns()}
    results["peers"].insert(2, {"name": "Spawny", "status": "ok", "throughput": {"0": _run(90.0, 9)}})
    results["peers"][2]["guarantees"] = {"workers": 2, "batches_per_rank": [16, 16], **every}
    ours = {"name": "zarrtorch", "status": "ok", "guarantees": {"workers": 2, "batches_per_rank": [16, 16], **every}}
    broken = {"name": "Broken", "status": "not installable", "reason": "not installable: needs a CUDA torchvision"}
    spawny = {"workers": 2, **every}
    results["uneven_fork"] = _uneven_pass(
        "fork",
        [
            ours,
            {"name": "Other", "status": "ok", "guarantees": {"workers": 2, **every, "equal_batches": "no"}},
            {
                "name": "Spawny",
                "status": "ok",
                "guarantees": spawny | {"batches_per_rank": [16, 17], "every_row_once": LOST, "equal_batches": "wrong"},
            },
            broken,
        ],
    )
    results["uneven_spawn"] = _uneven_pass(
        "spawn",
        [
            ours,
            {"name": "Other", "status": "ok", "guarantees": {"error": "exit 1: PicklingError: lambda"}},
            {
                "name": "Spawny",
                "status": "ok",
                "guarantees": spawny | {"batches_per_rank": [33, 33], "every_row_once": TWICE},
            },
            broken,
        ],
    )
    return results


def test_the_page_shows_every_loader_s_verdicts_on_the_even_store_and_on_the_uneven_spawned_one():
    """Issue 45: the guarantees came from an even store with forked workers, which cannot catch a loader dealing
    unequal shares or losing its rank in a spawned worker, and the page only said so. With the uneven pass in the
    JSON, the page shows both stores' verdicts per loader, with the batches per rank, says what each store
    measured instead of what it cannot show, and counts as keeping all six only the loaders that kept them on
    both."""
    results, twice = _with_uneven(), TWICE
    del results["uneven_fork"]
    text = peers_table.page(results)
    words = _words(text)
    assert "cannot trigger" not in words and "still to be made" not in words and "cannot show" not in words
    even = "even: 2,048 rows, 16 chunks | fork"
    uneven = "uneven: 2,150 rows, 17 chunks (the last of 102 rows) | spawn"
    assert f"| Spawny | {even} | 16 and 16 | yes | yes | yes | yes | yes | yes |" in text
    assert f"| Spawny | {uneven} | 33 and 33 | wrong: 2075 rows twice, 1 missing | yes |" in text
    assert f"| Other | {uneven} |  | failed: exit 1: PicklingError: lambda |" in text
    assert f"| Broken | {uneven} |  | not installable: needs a CUDA torchvision |" in text
    assert peers_table.keeps_all(results) == ["zarrtorch"]
    assert peers_table.verdicts(results, "uneven_spawn")["Spawny"]["every row once (2 ranks)"] == twice
    assert "(1 of 3 loaders checked on both stores, the uneven one with spawned workers): zarrtorch." in words
    assert (
        f"Spawny: every row once (2 ranks) yes on the even store, {twice} on the uneven one with spawned workers"
        in words
    )
    spawned = "- Spawny fails 1 on the uneven store, workers spawned: every row once (2 ranks): "
    assert spawned + twice + " (33 and 33 batches" in text
    assert "(33 and 33 batches per rank, zarrtorch 16 and 16). Its ranks read the same rows" in words
    assert "17 chunks over 2 ranks x 2 workers = 4 reading processes" in words
    assert "1,075 rows a rank" in words and "spawn" in words
    del results["uneven_spawn"]
    assert peers_table.keeps_all(results) == ["zarrtorch", "Spawny"]
    alone = _words(peers_table.page(results))
    assert "cannot trigger the failures of an uneven split or of a spawn start" in alone
    assert "--uneven" in alone and "still to be made" not in alone


def test_the_page_shows_the_uneven_store_read_by_forked_and_by_spawned_workers():
    """Issue 45: with spawned workers only, a loader whose ranks each read nearly every row yields equal batch
    counts from that overlap, so the page could not show what appendix A1 measures with forked workers (unequal
    batches per rank, a DDP job that stops). With both uneven passes in the JSON, every loader gets three lines
    (even store; uneven, forked; uneven, spawned), the findings give the forked pass's batches per rank and its
    rows lost or repeated, and the overlap note names what the forked pass measured."""
    results = _with_uneven()
    text, words = peers_table.page(results), _words(peers_table.page(results))
    assert peers_table.passes(results) == ["even", "uneven_fork", "uneven_spawn"]
    uneven = "uneven: 2,150 rows, 17 chunks (the last of 102 rows)"
    lines = [line for line in text.splitlines() if line.startswith("| Spawny | ")]
    assert [line.split(" | ")[1:3] for line in lines[-3:]] == [
        ["even: 2,048 rows, 16 chunks", "fork"],
        [uneven, "fork"],
        [uneven, "spawn"],
    ]
    assert f"| Spawny | {uneven} | fork | 16 and 17 | {LOST} | wrong | yes |" in text
    assert f"| Other | {uneven} | fork |  | yes | no | yes |" in text
    assert f"| Broken | {uneven} | fork |  | not installable: needs a CUDA torchvision |" in text
    assert peers_table.keeps_all(results) == ["zarrtorch"]
    assert peers_table.verdicts(results, "uneven_fork")["Spawny"]["equal batches per rank"] == "wrong"
    forked = "- Spawny fails 2 on the uneven store, workers forked: every row once (2 ranks): "
    assert forked + f"{LOST}; equal batches per rank: wrong (16 and 17 batches per rank)." in text
    assert f"every row once (2 ranks) yes on the even store, {LOST} on the uneven one with forked workers" in words
    assert "with forked workers it yields 16 and 17 batches per rank there" in words
    forked_line = next(
        line
        for line in text.splitlines()
        if line.startswith(f"- Spawny: every row once (2 ranks) yes on the even store, {LOST}")
    )
    assert "read the same rows" not in forked_line  # "0 rows twice": its forked ranks share nothing
    assert (
        "read in 2 passes, one per start method" in words and "**Forked workers** (`fork`, 2026-01-03 00:00)" in words
    )
    assert "**Spawned workers** (`spawn`, 2026-01-02 00:00): each begins in a fresh interpreter" in words
    assert "- Other fails 1 on the even store: equal batches per rank: no." in text
    assert "- Other fails 1 on the uneven store" not in text  # the same guarantee as on the even store: folded
    folded = "- In the uneven passes, every other loader that ran fails the guarantees it fails on the even store"
    assert folded in text
    assert (
        "(1 of 3 loaders checked on both stores, the uneven one with forked and spawned workers): zarrtorch." in words
    )


def test_the_committed_json_holds_the_uneven_forked_and_spawned_passes_of_every_peer():
    """The committed run's guarantees were measured on both stores: the uneven store, with a partial last chunk
    over 2 ranks x 2 workers, is read once with forked and once with spawned workers, for every loader of the
    main run, and the page shows both passes."""
    results = peers_table.load()
    committed = _words((repo_root() / peers_table.PAGE).read_text(encoding="utf-8"))
    assert "cannot trigger" not in committed
    for method in ("fork", "spawn"):
        uneven = results[f"uneven_{method}"]
        store, settings = uneven["store"], uneven["settings"]
        assert store["rows"] % store["chunk_rows"] and settings["start_method"] == method
        assert [p["name"] for p in uneven["peers"]] == [p["name"] for p in results["peers"]]
        for peer in uneven["peers"]:
            g = peer.get("guarantees") or {}
            assert peer["status"] != "ok" or "error" in g or g["start_method"] == method, peer["name"]
        assert f"uneven: {store['rows']:,} rows, 17 chunks (the last of 102 rows) | {method} |" in committed
    assert "| Grain | even: 8,192 rows, 64 chunks | spawn (`mp_prefetch` always spawns) |" in committed


def test_the_page_shows_the_cache_case_and_who_could_not_read_the_stand_in():
    """Issue 44's cache case on the page: the table of each loader's traffic and rates by epoch, then who fetched
    nothing again in epoch 2, whose order still changes every epoch and who could not read the stand-in, with
    the reason; cache.md is linked for zarrtorch's own measurements."""

    def cached(requests, mib, seconds, same=False):
        epochs = [{"epoch": e + 1, "rows": 640, "seconds": s, "rows_per_s": 640 / s} for e, s in enumerate(seconds)]
        for e in epochs[1:]:
            e["order_as_before"] = same
        traffic = {
            str(e + 1): {"requests": r, "bytes": int(m * 2**20)}
            for e, (r, m) in enumerate(zip(requests, mib, strict=True))
        }
        return {"remote": "s3://b/copy", "epochs": epochs, "traffic": traffic}

    results = _run_results() | {
        "cache_case": {
            "settings": {"epochs": 3, "delay_ms": 20.0, "batch_size": 64, "workers": 0},
            "date": "2026-01-02T03:04",
            "wall_s": 12.0,
            "load_average": [1.5, 2.25],
            "peers": [
                {"name": "zarrtorch", "status": "ok", "cache": cached((10, 2), (64, 0.01), (2.0, 1.0, 1.0))},
                {"name": "Other", "status": "ok", "cache": cached((10, 10), (64, 64), (2.0, 2.0, 2.0), same=True)},
                {"name": "Deaf", "status": "ok", "cache": {"remote": "s3://b/d", "epochs": [], "refused": "BadScheme"}},
            ],
            "not_run": {"Plain": "no remote cache"},
        }
    }
    page = peers_table.page(results)
    section = page[page.index("## A remote copy and the loader's local cache") :]
    said = " ".join(section.split())
    assert (
        "(2026-01-02 03:04, 12 s, load average 1.5-2.2)" in said
        and "20 ms per request" in said
        and "for 3 epochs" in said
    )
    assert "epoch 2 (metadata only): zarrtorch." in said and "every epoch: zarrtorch." in said
    assert "Could not read the stand-in: Deaf (BadScheme)." in said and "(cache.md#measured)" in said
    assert "| zarrtorch | s3://b/copy | 10 | 2 (0.20) | 64.0 | 0.0 (0.00) | 320 | 640 | 2.00 | yes |" in section
    assert (
        "| Other | s3://b/copy | 10 | 10 (1.00) |" in section and "| Plain |  | not run: no remote cache |" in section
    )
    assert page.index("## A remote copy") < page.index("## In one picture")
    assert "## A remote copy" not in peers_table.page(_run_results())
