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
