"""The reference page ``docs/peers.md`` (zarrtorch beside the loaders its users would pick instead), generated
from ``make bench-peers``'s committed results (``benchmarks/peers.json``, written with ``benchmarks/peers.md`` by
``benchmarks/peers/run.py --md``): records, guarantee verdicts, the page's text and its figure.

    python -m zarrtorch.course.peers_table --md docs/peers.md --png docs/peers.png   # make bench-peers runs it

Nothing is run or measured here: a results dict in, numbers, text or a figure out. The markdown table and the
rows/s over two epochs are those of ``benchmarks/peers/table.py`` (the script that writes ``peers.md``),
loaded by path, so the page, the slides and ``benchmarks/peers.md`` show one computation.
"""

from __future__ import annotations

import importlib.util
import json
import re
import textwrap
from functools import cache
from pathlib import Path

from zarrtorch.course.paths import repo_root

MiB = 2**20


def results_path() -> Path:
    """The last committed run: ``benchmarks/peers.json``."""
    return repo_root() / "benchmarks" / "peers.json"


def load(path: str | Path | None = None) -> dict:
    """The results of one ``make bench-peers`` run (default: the committed ``benchmarks/peers.json``)."""
    return json.loads(Path(path or results_path()).read_text(encoding="utf-8"))


@cache
def table_module():
    """``benchmarks/peers/table.py`` (a script folder, not a package), loaded by path."""
    path = repo_root() / "benchmarks" / "peers" / "table.py"
    spec = importlib.util.spec_from_file_location("_zarrtorch_bench_peers_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markdown(results: dict) -> str:
    """The table exactly as ``make bench-peers`` writes it into ``benchmarks/peers.md``."""
    return table_module().markdown(results)


def guarantee_columns() -> list[tuple[str, str]]:
    """``(column title, key)`` of the six guarantees, in the table's order."""
    return list(table_module().GUARANTEES)


def not_run(results: dict) -> dict[str, str]:
    """Loaders with no measurement, and why (``not installable: ...``, ``not run: ...``)."""
    return {p["name"]: p.get("reason") or p.get("status", "?") for p in results["peers"] if p.get("status") != "ok"}


def series() -> tuple[tuple[int, str], ...]:
    """``(ranks, key)`` of the throughput runs: rank 0 of 1 (every row), rank 0 of 2 (half), as table.py has them."""
    return table_module().SERIES


def runs(results: dict, ranks: int | None = None) -> list[dict]:
    """One record per (loader, ranks, workers) that ran: rows/s over epochs 1 and 2 together (``rows_per_s``, the
    table's measure), per epoch (``ep1``, ``ep2``), divided by zarrtorch's with as many ranks and workers in the
    same run (``x_zarrtorch``), time to the first batch, held MiB (the larger of the two epochs) and the peer's
    conversion (``None`` when it reads the Zarr store itself). ``ranks``: 1 (rank 0 of 1, which reads every
    row), 2 (rank 0 of 2 simulated ranks, half the rows; runs from before that series have none) or both."""
    rate = table_module().rate
    ours = next((p for p in results["peers"] if p["name"] == "zarrtorch"), {})
    records = []
    for world, key in series():
        if ranks not in (None, world):
            continue
        base = {int(w): rate(run) for w, run in (ours.get(key) or {}).items() if "error" not in run}
        for peer in results["peers"]:
            if peer.get("status") != "ok":
                continue
            for workers, run in sorted((peer.get(key) or {}).items(), key=lambda kv: int(kv[0])):
                if "error" in run:
                    continue
                eps, r = run["epochs"], rate(run)
                records.append(
                    {
                        "loader": peer["name"],
                        "ranks": world,
                        "workers": int(workers),
                        "rows_per_s": r,
                        "ep1": eps[0]["rows_per_s"],
                        "ep2": eps[1]["rows_per_s"],
                        "x_zarrtorch": r / base[int(workers)] if r and base.get(int(workers)) else None,
                        "ttfb_s": eps[0]["ttfb_s"],
                        "held_mib": max(e["held_mib"] for e in eps),
                        "conversion": peer.get("conversion"),
                    }
                )
    return records


def passes(results: dict) -> list[str]:
    """The guarantee passes of a run, in the page's order: ``even`` (the main run's store, forked workers), then
    the uneven passes it has (``uneven_fork``, ``uneven_spawn``: a store that splits unevenly, its workers started
    by that method; written by ``run.py``'s default run or ``--uneven only``)."""
    table = table_module()
    return ["even"] + [table.uneven_key(method) for method, _ in table.uneven_passes(results)]


def uneven_passes(results: dict) -> list[str]:
    """The keys of the run's uneven passes (:func:`passes` without ``even``); empty for a run without them."""
    return passes(results)[1:]


def guarantee_run(results: dict, which: str = "even") -> dict:
    """The results the guarantees of pass ``which`` (:func:`passes`) come from: ``results`` itself for ``even``,
    else that uneven pass (empty when the run does not have it)."""
    if which == "even":
        return results
    return results.get(which) or {"peers": []}


def verdicts(results: dict, which: str = "even") -> dict[str, dict[str, str]]:
    """``{loader: {guarantee column: verdict}}`` for every loader whose guarantee checks ran in pass ``which``."""
    out = {}
    for peer in guarantee_run(results, which)["peers"]:
        g = peer.get("guarantees") or {}
        if peer.get("status") == "ok" and g and "error" not in g:
            out[peer["name"]] = {column: str(g.get(key, "?")) for column, key in guarantee_columns()}
    return out


def kept(verdict: str) -> bool:
    """A verdict that keeps its guarantee: ``yes``, or ``yes: ...`` (e.g. rows dropped by ``drop_last``)."""
    return verdict == "yes" or verdict.startswith("yes:")


def keeps_all(results: dict) -> list[str]:
    """Loaders that kept every guarantee, in the table's order: in every pass of the run (the main store and the
    uneven passes it has; a loader a pass could not check does not count as keeping them)."""
    checked = [verdicts(results, which) for which in passes(results)]
    return [name for name in checked[0] if all(name in v and all(kept(x) for x in v[name].values()) for v in checked)]


def short_name(loader: str) -> str:
    """A loader's name on the figure: its first word, and ``uncompressed`` for zarrtorch's uncompressed copy."""
    first = loader.split(" ")[0].rstrip(",")
    return f"{first} uncompressed" if "uncompressed" in loader else first


def figure(results: dict, ax=None, label_size: float = 8):
    """Rows/s (epochs 1 and 2 together) against held MiB, both on log scales, one point per loader and worker
    count with one rank (every row): filled where the loader kept every guarantee, hollow where it failed one;
    circles for 0 workers, squares for more; a dashed line at L0 (every chunk decoded once, in order).
    ``label_size``: the points' and the legend's font size. Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 5.5))
    safe = set(keeps_all(results))
    records = runs(results, ranks=1)
    names = list(dict.fromkeys(r["loader"] for r in records))
    colours = {name: f"C{i % 10}" for i, name in enumerate(names)}
    for r in records:
        colour = colours[r["loader"]]
        ax.scatter(
            r["rows_per_s"],
            r["held_mib"],
            s=90,
            marker="o" if r["workers"] == 0 else "s",
            facecolors=colour if r["loader"] in safe else "white",
            edgecolors=colour,
            linewidths=2,
            zorder=3,
        )
        label = f"{short_name(r['loader'])} ({r['workers']})"
        ax.annotate(
            label, (r["rows_per_s"], r["held_mib"]), textcoords="offset points", xytext=(7, 4), fontsize=label_size
        )
    l0 = (results.get("l0") or {}).get("rows_per_s")
    if l0:
        ax.axvline(l0, color="0.5", ls="--", lw=1, zorder=1)
        ax.annotate(
            "L0: raw decode",
            (l0, 1),
            xycoords=("data", "axes fraction"),
            xytext=(-4, -12),
            textcoords="offset points",
            ha="right",
            fontsize=label_size,
            color="0.4",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    nice = [n * 10**e for e in range(0, 7) for n in (1, 2, 5)]
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(FixedLocator(nice))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        axis.set_minor_formatter(NullFormatter())
    xs = [r["rows_per_s"] for r in records] + ([l0] if l0 else [])
    ys = [r["held_mib"] for r in records]
    ax.set_xlim(min(xs) / 1.3, max(xs) * 1.5)
    ax.set_ylim(min(ys) / 1.4, max(ys) * 1.4)
    ax.set(
        xlabel="rows/s, epochs 1 and 2 together (log scale)",
        ylabel="held memory, MiB (larger epoch, log scale)",
        title="Right and low is fast and lean; filled: all six guarantees kept "
        + ("on both stores" if uneven_passes(results) else "on this store"),
    )
    ax.grid(True, which="major", color="0.9", lw=0.6, zorder=0)
    handles = [
        ax.scatter([], [], marker="o", facecolors="0.3", edgecolors="0.3", label="every guarantee, 0 workers"),
        ax.scatter([], [], marker="s", facecolors="0.3", edgecolors="0.3", label="every guarantee, with workers"),
        ax.scatter([], [], marker="o", facecolors="white", edgecolors="0.3", label="fails one or more"),
    ]
    ax.legend(handles=handles, fontsize=label_size, loc="best")
    return ax


# -- the reference page docs/peers.md -----------------------------------------------------------------------
PAGE = "docs/peers.md"
FIGURE = "docs/peers.png"
TIE = 1.25  # single figures move by tens of percent between runs: a smaller lead is a tie

# what each guarantee column checks, and what a DDP job sees when a loader fails it (keys: the table's titles)
GUARANTEE_MEANING = {
    "every row once (2 ranks)": (
        "over both ranks' epoch, no row twice and none missing beyond a `drop_last` remainder",
        "some rows trained twice in an epoch, others never",
    ),
    "equal batches per rank": (
        "both ranks yield as many batches",
        "one rank enters an all-reduce its peer never joins: gloo stops the job, NCCL hangs (lesson 02, A1)",
    ),
    "reshuffled across ranks": (
        "rows change rank between epochs 1 and 2",
        "each rank trains on the same share of the rows every epoch",
    ),
    "mid-epoch resume exact": (
        "a state saved after half of rank 0's epoch, restored into a new loader, yields the rows the "
        "uninterrupted run yielded",
        "a job requeued mid-epoch does not continue with the rows it would have had",
    ),
    "resume on 1 rank (saved on 2)": (
        "both ranks' states, resumed on one rank: the rows before plus those after make one epoch (less at most "
        "the `drop_last` remainder of the 2-rank epoch)",
        "a job restarted on fewer GPUs reads rows twice, or loses some, in that epoch",
    ),
    "resume on other worker count": (
        "a state saved with workers, resumed with 0: the rows before plus those after make one epoch",
        "the same after a change of `num_workers`",
    ),
}


def guarantee_setting(results: dict, which: str = "even") -> dict:
    """How the guarantees of pass ``which`` (:func:`guarantee_run`) were checked, and whether that store could trigger
    the failures of an uneven split: ``rows``, ``ranks``, ``workers`` (per rank), ``readers`` (ranks x workers),
    ``chunks`` (full ones), ``partial_rows`` (of a last, shorter chunk), ``batches_per_rank`` (full batches of a
    rank's equal share), ``even`` (whole chunks in equal number for every reader and whole batches for every rank:
    no loader can then be caught dealing unequal shares) and ``start_method`` (of DataLoader workers; ``None``
    when the run did not record it: the runs before the option forked them)."""
    run = guarantee_run(results, which)
    store, settings = run["store"], run["settings"]
    workers = {int(p["guarantees"]["workers"]) for p in run["peers"] if "workers" in (p.get("guarantees") or {})}
    ranks = 2  # the checks run ranks 0 and 1 of a world of 2 (benchmarks/peers/checks.py)
    readers = ranks * max(1, max(workers, default=0))
    chunks, partial = divmod(store["rows"], store["chunk_rows"])
    per_rank, batch = store["rows"] // ranks, settings["batch_size"]
    even = partial == 0 and chunks % readers == 0 and store["rows"] % ranks == 0 and per_rank % batch == 0
    return {
        "rows": store["rows"],
        "ranks": ranks,
        "workers": sorted(workers),
        "readers": readers,
        "chunks": chunks,
        "partial_rows": partial,
        "batches_per_rank": per_rank // batch,
        "even": even,
        "start_method": settings.get("start_method"),
    }


def page(results: dict) -> str:
    """The whole text of ``docs/peers.md`` for ``results``: what was run, the table, what its columns mean, what
    this store can and cannot show, what the run shows (every statement computed from ``results``), the figure
    and how to make it again."""
    parts = [
        _page_head(results),
        "## The table\n\n" + markdown(results) + "\n",
        _page_columns(),
        _page_two_stores(results) if uneven_passes(results) else _page_limits(results),
        _page_findings(results),
        _page_layouts(results),
        _page_workers(results),
        _page_mix(results),
        _page_cache_case(results),
        _page_figure(results),
        _page_reproduce(),
    ]
    return "\n".join(part for part in parts if part)


def _paragraph(text: str, width: int = 112) -> str:
    """``text`` as one markdown paragraph wrapped at ``width`` (the values put into it come from the JSON)."""
    return textwrap.fill(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)


def _page_head(results: dict) -> str:
    store, settings, l0 = results["store"], results["settings"], results.get("l0") or {}
    row_kib = store["decoded_bytes"] / store["rows"] / 1024
    chunk_mib = store["chunk_rows"] * store["decoded_bytes"] / store["rows"] / MiB
    workers = " and ".join(str(w) for w in settings["workers"])
    l0_text = (
        f"; L0, every chunk decoded once in order by {l0['threads']} threads, read {l0['rows_per_s']:,.0f} rows/s"
        if l0.get("rows_per_s")
        else ""
    )
    generated = f"""*Reference page, generated: `python -m zarrtorch.course.peers_table --md {PAGE} --png {FIGURE}`
    writes it from `benchmarks/peers.json`, the last committed run of `make bench-peers` (which runs that command
    too). Do not edit it by hand: `tests/course/test_peers_table.py` checks that it is what the generator writes
    from the committed JSON.*"""
    second = (
        f", there and again on a second store that splits unevenly, with {_workers_started(results)} workers"
        if uneven_passes(results)
        else ""
    )
    what = f"""zarrtorch is not the only way to feed PyTorch from chunked arrays. `make bench-peers` runs it beside the
    loaders a weather or imaging user would pick instead, on one generated Zarr store, each written the way its
    own documentation shows and run in fresh processes of its own environment; it measures rows/s, the time to the
    first batch and the memory held, and checks six guarantees by running two simulated ranks and three
    resumes{second}. Each loader's recipe, and the page of its documentation it follows, is in
    [`benchmarks/README.md`](../benchmarks/README.md#peers-zarrtorch-against-the-loaders-its-users-would-pick-instead-make-bench-peers)."""
    run = f"""**The run.** {results["date"].replace("T", " ")}, on {results["machine"]}; {results["wall_s"]:.0f} s in
    all. Store: {store["rows"]:,} rows of {row_kib:.0f} KiB ({store["dtype"]} {tuple(store["sample_shape"])}),
    chunks of {store["chunk_rows"]} rows ({chunk_mib:.0f} MiB), {store["decoded_bytes"] / MiB:.0f} MiB decoded and
    {store["stored_bytes"] / MiB:.0f} MiB stored ({store["codec"]} level {store["level"]}), warm page cache. Batch
    size {settings["batch_size"]}, DataLoader workers {workers}{l0_text}. One run on one machine: single figures
    move by tens of percent from run to run, so read a ratio far from 1 as a difference and one close to 1 as a
    tie."""
    body = "\n\n".join(_paragraph(x) for x in (generated, what, run))
    return f"# zarrtorch and the alternatives: the measured table\n\n{body}\n"


def _page_columns() -> str:
    rows = "\n".join(f"| {column} | {checks} | {fails} |" for column, (checks, fails) in GUARANTEE_MEANING.items())
    return f"""## What the columns mean

- **ranks**: 1 is rank 0 of 1, which reads every row; 2 is rank 0 of 2 simulated ranks, which reads half of
  them (its rows/s are that rank's).
- **rows/s ep1, ep2**: rows per second from `iter()` to the last batch, in epoch 1 (starting workers, opening
  the store, the first reads) and in epoch 2.
- **x L0**, **x zarrtorch**: rows/s over both epochs together, divided by L0 (every chunk decoded once, in
  order, by 2 threads through zarr: a loader that decodes the store every epoch comes at best about as far) and
  by zarrtorch's with as many ranks and workers in the same run.
- **TTFB s**: the time to the first batch of epoch 1. **held MiB**: the memory the loader's processes gained
  (the main process's growth plus each worker's private pages), the larger of the two epochs. Pages of a
  memory-mapped file belong to the page cache and are not counted.
- **conversion**: the time and disk space of the loader's own copy of the data, for the loaders that need one.
- **The six guarantees**, judged on what the loader delivered (every sample carries its row's number), with
  ranks 0 and 1 of a world of 2, each with DataLoader workers, for two epochs, then three resumes. Verdicts:
  `yes`; `no` (and what happens instead); `wrong` (with the counts); `refused` (the library raised: its error);
  `no API` (the library cannot save a position).

| guarantee | what the check asks | what a DDP job sees when a loader fails it |
|---|---|---|
{rows}
"""


def _page_limits(results: dict) -> str:
    s = guarantee_setting(results)
    store, batch = results["store"], results["settings"]["batch_size"]
    workers = " or ".join(str(w) for w in s["workers"]) or "?"
    forked = s["start_method"] in (None, "fork")
    start = (
        "`fork` (the run's JSON does not record it: `benchmarks/peers/common.py` forced it before `--start-method`)"
        if s["start_method"] is None
        else f"`{s['start_method']}`"
    )
    last = f" and a last chunk of {s['partial_rows']} rows" if s["partial_rows"] else ""
    setting = f"""The guarantees were checked on a store of {s["chunks"]} full chunks of {store["chunk_rows"]}
    rows{last}, read by {s["ranks"]} ranks x {workers} workers = {s["readers"]} reading processes, with DataLoader
    workers started by {start}."""
    if s["even"] and forked:
        text = f"""{setting} Every reading process can get {s["chunks"] // s["readers"]} whole chunks and every
        rank {s["batches_per_rank"]} full batches of {batch}, and a forked worker inherits what its rank knows.
        **Such a store cannot trigger the failures of an uneven split or of a spawn start** that appendix A1 shows
        zarr-torch-dataset 0.0.9 making on the course's data: ranks with unequal batches (and a DDP job that stops
        at the extra one) when the rows do not split evenly over ranks x workers (a partial last chunk, or a chunk
        count that does not divide), and every rank reading every row when workers are started by `spawn` or
        `forkserver` (the default on macOS, and what CUDA code often needs). So a `yes` under "every row once" and
        "equal batches per rank" says that a loader keeps them on an even split with forked workers, and no more:
        zarr-torch-dataset's `yes` there does not hold on an uneven split, as A1 measures, and no other peer has
        been run on one. zarrtorch's own tests check both cases (`tests/core/test_plan.py` on splits that do not
        divide, `tests/core/test_loader.py` and `tests/core/behaviour/test_ddp.py` with spawned workers); the
        peers' have not been checked there in this run: its JSON has no uneven pass, which `make bench-peers`
        makes by default (`--uneven`: guarantees only, on a store with a partial last chunk, workers forked in one
        pass and spawned in another)."""
    else:
        why = [
            "its rows do not split into whole chunks and whole batches evenly over the ranks and workers"
            if not s["even"]
            else "",
            "its workers do not inherit their rank's process state" if not forked else "",
        ]
        text = f"""{setting} This store can trigger the failures of an uneven split or of a spawn start:
        {" and ".join(w for w in why if w)}. A loader that deals unequal shares, or learns its rank only inside its
        workers, fails the first two guarantee columns here."""
    return "## What this store can and cannot show\n\n" + _paragraph(text) + "\n"


def store_label(results: dict, which: str) -> str:
    """The store of pass ``which`` in the guarantees table: ``even`` or ``uneven`` (as it splits), its rows and its
    chunks."""
    s = guarantee_setting(results, which)
    chunks = s["chunks"] + bool(s["partial_rows"])
    last = f" (the last of {s['partial_rows']} rows)" if s["partial_rows"] else ""
    return f"{'even' if s['even'] else 'uneven'}: {s['rows']:,} rows, {chunks} chunks{last}"


def _batches(g: dict) -> str:
    return " and ".join(str(b) for b in g.get("batches_per_rank", []))


def _guarantee_record(results: dict, which: str, name: str) -> dict | None:
    return next((p for p in guarantee_run(results, which)["peers"] if p["name"] == name), None)


# recipes that start their workers themselves, whatever the run's start method (benchmarks/peers/<peer>_peer.py)
OWN_START_METHOD = {
    "xbatcher": "forkserver (its recipe's `multiprocessing_context`)",
    "Grain": "spawn (`mp_prefetch` always spawns)",
}
STARTED = {"fork": "forked", "spawn": "spawned"}  # workers started by that method
# what a store that splits unevenly catches with workers started by that method
CATCHES = {
    "fork": """each inherits what its rank knows, so a loader that deals whole chunks unequally over ranks and
    workers yields unequal batch counts there, or loses or repeats rows""",
    "spawn": """each begins in a fresh interpreter that knows only what is pickled to it, so a loader that learns
    its rank inside its workers has its ranks read the same rows there""",
}


def _start_method(results: dict, which: str) -> str:
    return guarantee_setting(results, which)["start_method"] or "fork"


def _workers_started(results: dict) -> str:
    """How the uneven passes' workers were started, in words: ``forked and spawned``."""
    return " and ".join(STARTED[_start_method(results, which)] for which in uneven_passes(results))


def two_stores_markdown(results: dict) -> str:
    """Every loader's guarantees in every pass, one line per loader and pass: the store, how its workers were
    started, the batches each rank yielded in epoch 1, the six verdicts (or why there are none)."""
    cells_of = table_module().guarantee_cells
    head = ["loader", "store", "workers started by", "batches per rank", *(c for c, _ in guarantee_columns())]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    labels = {which: store_label(results, which) for which in passes(results)}
    starts = {which: _start_method(results, which) for which in passes(results)}
    for peer in results["peers"]:
        for which in passes(results):
            record = _guarantee_record(results, which, peer["name"]) or {"status": "not in this pass"}
            g = record.get("guarantees") or {}
            if record.get("status") != "ok":
                cells = ["", record.get("reason") or record["status"]] + [""] * (len(head) - 6)
            else:
                cells = [_batches(g), *cells_of(g)]
            start = OWN_START_METHOD.get(peer["name"], starts[which])
            lines.append("| " + " | ".join([peer["name"], labels[which], start, *cells]) + " |")
    return "\n".join(lines)


def rows_twice(verdict: str) -> int:
    """The rows read twice that an "every row once" verdict counts (``wrong: 2075 rows twice, 1 missing``)."""
    found = re.search(r"(\d+) rows twice", verdict)
    return int(found.group(1)) if found else 0


def _overlap_note(results: dict, which: str, name: str, uneven: dict[str, str]) -> str:
    """What "equal batches" and "reshuffled" say of a loader whose ranks read the same rows in uneven pass
    ``which``: equal counts and rows changing rank come from the overlap, not from how it deals shares; the forked
    pass, where the run has it and it is not ``which``, measures that."""
    if not rows_twice(uneven["every row once (2 ranks)"]):
        return ""
    note = " Its ranks read the same rows there: an equal batch count says nothing of how it deals shares"
    forked = (_guarantee_record(results, "uneven_fork", name) or {}).get("guarantees") or {}
    if which != "uneven_fork":
        measured = f"; with forked workers it yields {_batches(forked)} batches per rank there"
        unmeasured = " when its workers know their rank (forked workers; appendix A1 measures zarr-torch-dataset's)"
        note += measured if _batches(forked) else unmeasured
    if uneven["reshuffled across ranks"] == "yes":
        note += ", and a row that changes rank is one read by one rank in an epoch and by the other alone in the next"
    return note + "."


def _uneven_differences(results: dict, which: str, name: str, even: dict[str, str]) -> str:
    """One finding line: the guarantees loader ``name`` keeps on the even store and not in uneven pass ``which``
    (or keeps only there), with its batches per rank; "" when it keeps the same ones."""
    record = _guarantee_record(results, which, name) or {}
    workers = f"{STARTED[_start_method(results, which)]} workers"
    b = verdicts(results, which).get(name)
    if b is None:
        g = record.get("guarantees") or {}
        why = g.get("error") or record.get("reason") or record.get("status") or "not in the pass"
        return f"- {name}: no verdicts on the uneven store with {workers} ({why})."
    changed = [
        f"{c} {even[c]} on the even store, {b[c]} on the uneven one with {workers}"
        for c in even
        if kept(even[c]) != kept(b[c])
    ]
    if not changed:
        return ""
    batches = _batches(record.get("guarantees") or {})
    ours = _batches((_guarantee_record(results, which, "zarrtorch") or {}).get("guarantees") or {})
    against = f", zarrtorch {ours}" if ours and name != "zarrtorch" else ""
    per_rank = f" ({batches} batches per rank{against})" if batches else ""
    return f"- {name}: " + "; ".join(changed) + per_rank + "." + _overlap_note(results, which, name, b)


def _page_two_stores(results: dict) -> str:
    """What the guarantee passes measured: each store's split, each pass's start method, the table of every pass,
    and the loaders whose verdicts differ between the stores."""
    first = uneven_passes(results)[0]
    even, uneven = guarantee_setting(results, "even"), guarantee_setting(results, first)
    batch = results[first]["settings"]["batch_size"]
    workers = " or ".join(str(w) for w in uneven["workers"]) or "?"
    share = uneven["rows"] / uneven["ranks"]
    chunks = uneven["chunks"] + bool(uneven["partial_rows"])
    last = (
        f"{uneven['chunks']} full chunks and one of {uneven['partial_rows']} rows, " if uneven["partial_rows"] else ""
    )
    own = "; ".join(f"{name}, {how}" for name, how in OWN_START_METHOD.items())
    forced = "" if even["start_method"] else " (`benchmarks/peers/common.py` forced it then)"
    reads = " ".join(
        f"""**{STARTED[_start_method(results, which)].capitalize()} workers** (`{_start_method(results, which)}`,
        {results[which]["date"].replace("T", " ")}): {CATCHES[_start_method(results, which)]}."""
        for which in uneven_passes(results)
    )
    count = len(uneven_passes(results))
    text = f"""The six guarantees were checked on two stores, each time with ranks 0 and 1 of a world of 2, each
    with DataLoader workers. **The even store** is the table's: {even["chunks"]} full chunks of
    {results["store"]["chunk_rows"]} rows over {even["readers"]} reading processes, workers started by
    `{even["start_method"] or "fork"}`{forced}:
    every reading process can get {even["chunks"] // even["readers"]} whole chunks and every rank
    {even["batches_per_rank"]} full batches, and a forked worker inherits what its rank knows, so no loader can be
    caught there dealing unequal shares or losing its rank in a worker. **The uneven store** (guarantees only, no
    timing) holds {uneven["rows"]:,} rows:
    {last}{chunks} chunks over {uneven["ranks"]} ranks x {workers} workers = {uneven["readers"]} reading processes,
    which do not divide; {share:,.10g} rows a rank, {share / batch:.2f} batches of {batch}. It was read in
    {count} pass{"es" if count > 1 else ""}, one per start method of the DataLoader workers. {reads} Two recipes
    start their workers themselves in every pass: {own}. The loaders that read a copy of their own convert this
    store as they convert the even one."""
    lines = ["## The guarantees on two stores", "", _paragraph(text), "", two_stores_markdown(results), ""]
    differ, same = [], []
    for peer in results["peers"]:
        name = peer["name"]
        a = verdicts(results).get(name)
        if a is None:
            continue
        found = [line for which in uneven_passes(results) if (line := _uneven_differences(results, which, name, a))]
        differ += found
        if not found:
            same.append(name)
    if differ:
        lines += ["A guarantee kept on one store and not on the other:", "", *differ, ""]
    if same:
        text = f"""Every guarantee kept, or not, on both stores alike, in every pass: {", ".join(same)}. Their
        counts follow the store (a `drop_last` remainder of fewer than {uneven["ranks"]} x {batch} rows on the
        uneven one, and the rows a wrong resume reads twice or misses)."""
        lines += [_paragraph(text), ""]
    return "\n".join(lines)


def _pass_suffix(results: dict, which: str) -> str:
    """Where a finding was measured, when the run has more than one pass: `` on the even store``, `` on the
    uneven store, workers forked``; "" for a run with one pass."""
    if not uneven_passes(results):
        return ""
    if which == "even":
        return " on the even store"
    return f" on the uneven store, workers {STARTED[_start_method(results, which)]}"


def _failed_columns(row: dict[str, str]) -> set[str]:
    """The guarantee columns a loader's verdicts do not keep."""
    return {column for column, v in row.items() if not kept(v)}


def _page_findings(results: dict) -> str:
    verdict = verdicts(results)
    safe = keeps_all(results)
    both = bool(uneven_passes(results))
    where = "on both stores" if both else "on this store"
    checked = f" on both stores, the uneven one with {_workers_started(results)} workers" if both else ""
    lines = [
        "## What the run shows",
        "",
        f"- **All six guarantees kept {where}** ({len(safe)} of {len(verdict)} loaders checked{checked}): "
        + (", ".join(safe) or "none")
        + ".",
    ]
    folded = False
    for which in passes(results):
        for name, row in verdicts(results, which).items():
            failed = {c: v for c, v in row.items() if c in _failed_columns(row)}
            if which != "even" and name in verdict and set(failed) == _failed_columns(verdict[name]):
                folded = True  # the same guarantees as on the even store: the table has its counts
                continue
            if failed:
                g = (_guarantee_record(results, which, name) or {}).get("guarantees") or {}
                batches = f" ({_batches(g)} batches per rank)" if which != "even" and _batches(g) else ""
                listed = "; ".join(f"{c}: {v}" for c, v in failed.items())
                lines.append(f"- {name} fails {len(failed)}{_pass_suffix(results, which)}: {listed}{batches}.")
    if folded:
        lines.append(
            "- In the uneven passes, every other loader that ran fails the guarantees it fails on the even store, "
            "no more and no fewer (its counts, which follow the store, are in the table above)."
        )
    one_rank = runs(results, ranks=1)
    for w in sorted({r["workers"] for r in one_rank}):
        among = [r for r in one_rank if r["workers"] == w and r["loader"] in safe]
        if among:
            fast = max(among, key=lambda r: r["rows_per_s"])
            lean = min(among, key=lambda r: r["held_mib"])
            lines.append(
                f"- One rank, {w} workers, among those keeping all six: fastest {fast['loader']} "
                f"({fast['rows_per_s']:,.0f} rows/s over both epochs), leanest {lean['loader']} "
                f"({lean['held_mib']:.0f} MiB held)."
            )
    ahead = [r for r in one_rank if r["loader"] != "zarrtorch" and (r["x_zarrtorch"] or 0) > TIE]
    if ahead:
        lines.append(
            f"- Ahead of zarrtorch by more than a tie (x zarrtorch above {TIE}), one rank: "
            + "; ".join(f"{r['loader']} with {r['workers']} workers ({r['x_zarrtorch']:.2f}x)" for r in ahead)
            + "."
        )
    uncompressed = _uncompressed_line(one_rank)
    if uncompressed:
        lines.append(uncompressed)
    copies = {p["name"]: p["conversion"] for p in results["peers"] if (p.get("conversion") or {}).get("disk_bytes")}
    if copies:
        stored = results["store"]["stored_bytes"]
        lines.append(
            "- Loaders that read a copy of their own pay for it once: "
            + "; ".join(
                f"{n} {c['conversion_s']:.0f} s and {c['disk_bytes'] / MiB:.0f} MiB on disk "
                f"({c['disk_bytes'] / stored:.1f}x the Zarr store)"
                for n, c in copies.items()
            )
            + "."
        )
    lines += ["", _paragraph(HOW_PEERS_DIFFER.format(buffer=_buffer_share(results))), ""]
    return "\n".join(lines)


UNCOMPRESSED = ("zarrtorch, uncompressed copy", "LitData", "MosaicML Streaming")  # the loaders that read raw bytes


def _uncompressed_line(one_rank: list[dict]) -> str:
    """Uncompressed against uncompressed, one rank: zarrtorch's uncompressed copy beside LitData's and MosaicML's
    (each reads a copy of its own without a codec), per worker count."""
    ours = {r["workers"]: r for r in one_rank if r["loader"] == UNCOMPRESSED[0]}
    if not ours:
        return ""
    parts = []
    for w, r in sorted(ours.items()):
        others = [o for o in one_rank if o["loader"] in UNCOMPRESSED[1:] and o["workers"] == w]
        against = ", ".join(
            f"{o['loader']} {o['rows_per_s']:,.0f} ({r['rows_per_s'] / o['rows_per_s']:.2f}x)" for o in others
        )
        parts.append(f"{w} workers: {r['rows_per_s']:,.0f} rows/s" + (f" against {against}" if against else ""))
    return (
        "- Uncompressed against uncompressed (one rank), zarrtorch reading an uncompressed copy: "
        + "; ".join(parts)
        + "."
    )


HOW_PEERS_DIFFER = """How a peer gets ahead of zarrtorch, or holds less: it reads a copy of its own,
uncompressed (read by memory map: no decode, and the pages are the page cache's) or in a codec cheaper to
decode, and pays in conversion time and a second copy on disk; or it keeps its whole share decoded in memory,
which then grows with the data (A1 measures it); or it mixes less (a batch from one or two chunks, or a block
of consecutive rows, needs no buffer across chunks, and is that much less shuffled: lesson 03 measures what a
buffer buys). {buffer} A loader that saves a count of the batches it yielded resumes exactly on the same
topology but not on another (the `wrong` and `refused` verdicts); zarrtorch saves the rows each rank has
consumed, so a resume can be planned again on any topology (lesson 06)."""


def _buffer_share(results: dict) -> str:
    """What share of zarrtorch's held memory (one rank) its shuffle buffers are: ``buffer_chunks`` (the dataset's
    default, as the benchmark runs it) decoded chunks per reading process (each worker, or the rank itself)."""
    import inspect

    from zarrtorch import ZarrIterableDataset

    buffer_chunks = inspect.signature(ZarrIterableDataset).parameters["buffer_chunks"].default
    store = results["store"]
    chunk_mib = store["chunk_rows"] * store["decoded_bytes"] / store["rows"] / MiB
    ours = [r for r in runs(results, ranks=1) if r["loader"] == "zarrtorch"]
    if not ours:
        return ""
    shares = [
        f"{max(1, r['workers']) * buffer_chunks * chunk_mib / r['held_mib']:.0%} with {r['workers']} workers"
        for r in ours
    ]
    return (
        f"Of what zarrtorch holds, its shuffle buffers ({buffer_chunks} decoded chunks of {chunk_mib:.0f} MiB per "
        f"reading process, `buffer_chunks`'s default) are {' and '.join(shares)}: a setting, not the size of the data."
    )


def layout_records(results: dict) -> list[dict]:
    """The layouts part as records: ``store``, ``frames``, ``loader`` (with ``setting`` and ``batch``: 0 for
    beluga's samples one by one), ``workers``, ``rates`` (samples/s of each round, epochs 1 and 2 together;
    ``None`` for a round that refused or failed), ``per_s`` (their median; ``None`` where every round refused or
    failed), ``refused`` (the first round's refusal or error, where no round ran) and ``cut`` (epochs cut short in
    some round: the figure is that of the part read)."""
    layouts = results.get("layouts") or {}
    table = table_module()
    out = []
    for r in layouts.get("runs", []):
        rates = table.round_rates(r)
        first = r["rounds"][0] if r["rounds"] else {}
        out.append(
            {
                "store": r["store"],
                "frames": r["frames"],
                "loader": r["loader"],
                "setting": r.get("setting", ""),
                "batch": r.get("batch"),
                "workers": r["workers"],
                "rates": rates,
                "per_s": table.layout_rate(r),
                "refused": None if any(rates) else first.get("refused") or first.get("error"),
                "cut": any(e.get("capped_after_s") for result in r["rounds"] for e in result.get("epochs", [])),
            }
        )
    return out


def layout_summary(results: dict) -> list[dict]:
    """Per store and sample kind: zarr-beluga's best batched figure (the highest median over its worker counts)
    and its samples one by one, zarrtorch's best with default settings as they are now (``None`` where it
    refused; a run with a setting that is now the default counts, ``zarrtorch_now_default`` naming it) and with
    the setting its refusal named, whether each best figure comes from cut epochs; and the ratios, each taken
    within a round (the loaders of a round shared the machine's load) and summed up by their median [lowest,
    highest]: ``x`` (``x_range``), zarrtorch's best default figure of the round over beluga's best batched one,
    each over its worker counts, and ``x_no_workers`` (``x_no_workers_range``), the same with no DataLoader
    workers on either side (the course's default, where beluga's own threads still work and zarrtorch's decode
    threads too)."""
    table = table_module()
    records = layout_records(results)
    keys = list(dict.fromkeys((r["store"], r["frames"]) for r in records))

    def best(rows) -> dict:
        return max((r for r in rows if r["per_s"]), key=lambda r: r["per_s"], default={"per_s": None, "cut": False})

    def ratio(ours: list[dict], theirs: list[dict]) -> dict:
        rounds = table.ratio_per_round(
            table.best_per_round([r["rates"] for r in ours]), table.best_per_round([r["rates"] for r in theirs])
        )
        return table.spread(rounds) or {"median": None, "min": None, "max": None}

    out = []
    for store, frames in keys:
        rows = [r for r in records if (r["store"], r["frames"]) == (store, frames)]
        beluga = [r for r in rows if r["loader"].startswith("zarr-beluga")]
        ours = [r for r in rows if r["loader"] == "zarrtorch"]
        batched, defaults = [r for r in beluga if r["batch"]], [r for r in ours if table.counts_as_default(r)]
        b, one_by_one = best(batched), best([r for r in beluga if r["batch"] == 0])
        z = best(defaults)
        x = ratio(defaults, batched)
        x0 = ratio([r for r in defaults if r["workers"] == 0], [r for r in batched if r["workers"] == 0])
        out.append(
            {
                "store": store,
                "frames": frames,
                "beluga": b["per_s"],
                "beluga_samples": one_by_one["per_s"],
                "beluga_cut": b["cut"] or one_by_one["cut"],
                "zarrtorch": z["per_s"],
                "zarrtorch_cut": z["cut"],
                "zarrtorch_now_default": z.get("setting") or None,
                "zarrtorch_refused": next((r["refused"] for r in ours if r["refused"] and not r["setting"]), None),
                "zarrtorch_with_setting": best([r for r in ours if r["setting"]])["per_s"],
                "x": x["median"],
                "x_range": (x["min"], x["max"]),
                "x_no_workers": x0["median"],
                "x_no_workers_range": (x0["min"], x0["max"]),
            }
        )
    return out


def _layout_cap(results: dict) -> float:
    """Seconds after which a layouts epoch was cut: the layouts run's own setting, else the main run's."""
    layouts = results.get("layouts") or {}
    return layouts.get("layout_cap") or (results.get("settings") or {}).get("layout_cap", 30)


def _page_layouts(results: dict) -> str:
    layouts = results.get("layouts")
    if not layouts:
        return ""
    stores, described = layouts["stores"], layouts["described"]
    listing = "\n".join(
        f"- **{kind}**: {described[kind]}; {info['stored_bytes'] / MiB:,.0f} MiB stored"
        for kind, info in stores.items()
    )
    intro = f"""zarr-beluga 0.3.0 (`import beluga`) reads a single Zarr v3 array called `data`, sharded or not, and
    Zarr v2 or v3 groups of one array per variable with dimensions named `(time, [level,] lat, lon)`. It reads
    each sample's chunks on its own and is handed the epoch's whole order. For the peers' table above it reads
    its own frame-layout copy of the store (its conversion); here it and zarrtorch read the same
    {results["store"]["rows"]:,} rows in each layout it reads, {_layout_when(layouts)}: windows of
    {layouts["window_frames"]} steps (2 input + {layouts["window_frames"] - 2} target steps, batches of
    {layouts["window_batch"]}) and single rows (batches of {layouts["row_batch"]}), shuffled, one rank, 0 and 2
    DataLoader workers, warm page cache. zarrtorch runs with default settings; beluga as its package documents
    (`BelugaDataset` in a `DataLoader`, which stacks its samples into batches; with workers, each opens its own
    reader), and also with its samples one by one (no batches: what a GPU loop uploads one at a time and stacks
    on the device, as beluga's `WindowLoader` does). The peers' store is read as it is through a metadata-only
    view (`benchmarks/peers/beluga_layouts.py`, `write_view`: beluga needs other dimension names), its 128-row
    chunks untouched. Epochs longer than {_layout_cap(results):.0f} s are cut and their rate is that of the part
    read. {_layout_rounds(layouts)}"""
    if layouts.get("date"):  # run on its own (`run.py --layouts only`), later than the table above
        intro += f""" This part was run on its own, on {layouts["date"]} ({layouts["machine"]}), in
        {layouts["wall_s"]:.0f} s."""
    remote = layouts.get("remote") or {}
    if remote:
        intro += f""" Then the same stores over HTTP (`zarrtorch.course.servers.HttpStoreProcess`: aiohttp in a process
        of its own on this machine, answering each request after a delay of {" and ".join(remote)}), windows only,
        beluga in batches: beluga opens the URL as its package opens one (`objstore-rt` with `allow_http`),
        zarrtorch with default settings."""
    lines = [
        "## zarr-beluga's layouts",
        "",
        _paragraph(intro),
        "",
        listing,
        "",
        table_module().layouts_markdown(layouts),
        "",
    ]
    for s in layout_summary(results):
        sample = f"windows of {s['frames']}" if s["frames"] > 1 else "rows"
        if s["zarrtorch"] is None and s["zarrtorch_refused"]:
            with_setting = s["zarrtorch_with_setting"]
            ours = "zarrtorch refuses it by default" + (
                f" (with the setting its error names, {with_setting:,.0f}/s)" if with_setting else ""
            )
        else:
            ours = f"zarrtorch {_rate(s['zarrtorch'])}/s" + (" (epochs cut)" if s["zarrtorch_cut"] else "")
            if s["zarrtorch_now_default"]:
                setting = s["zarrtorch_now_default"]
                ours += f" (measured with {setting}=True, {table_module().NOW_DEFAULT[setting]})"
        one_by_one = f", {_rate(s['beluga_samples'])}/s one by one" if s["beluga_samples"] else ""
        beluga = f"beluga {_rate(s['beluga'])}/s in batches{one_by_one}" + (" (epochs cut)" if s["beluga_cut"] else "")
        ratio = f": **{s['x']:.2f}x**{_range(s['x_range'])} beluga's best in batches" if s["x"] else ""
        if s["x_no_workers"]:
            ratio += f", **{s['x_no_workers']:.2f}x**{_range(s['x_no_workers_range'])} with 0 workers each"
        lines.append(f"- {s['store']}, {sample}: {ours}{ratio}; {beluga}.")
    return "\n".join(lines) + "\n"


def _layout_when(layouts: dict) -> str:
    """When the loaders of a case ran: in the same minutes (rounds), or one after the other in one run."""
    return "in the same minutes" if layouts["layout_rounds"] > 1 else "in one run"


def _layout_rounds(layouts: dict) -> str:
    """How the layouts part's figures were taken: its rounds, their times (UTC) and the machine's load (a run
    that recorded neither says so)."""
    rounds = layouts["layout_rounds"]
    log = layouts.get("rounds") or []
    when = f", from {log[0]['utc'][0]} to {log[-1]['utc'][1]}" if log else ""
    load = layouts.get("load_average") or []
    load_text = f", 1-minute load average {load[0]:.1f}-{load[1]:.1f} over the runs" if load else " (no load recorded)"
    if rounds == 1:
        return f"""For each store and sample kind, 1 round{when}{load_text}: every loader of the case once, one
        after the other, each in a fresh process; a figure has no range, and a ratio compares runs a minute or so
        apart, which a load that changes in between moves (`--layout-rounds 3` takes medians of rounds)."""
    return f"""For each store and sample kind, {rounds} rounds{when}{load_text}: a round runs every loader of the
    case once, each in a fresh process, in the reverse order the round after, so the loaders of a round share the
    machine's load. A figure is the median of its rounds [lowest-highest]; a ratio is taken within each round
    and summed up the same way, so a load that changes between rounds moves both sides of it."""


def _range(bounds: tuple[float | None, float | None]) -> str:
    """`` [low-high]`` of a ratio over the rounds ("" when it did not move at two digits)."""
    low, high = (f"{v:.2f}" for v in bounds)
    return "" if low == high else f" [{low}-{high}]"


def _rate(v: float | None) -> str:
    return "?" if v is None else f"{v:,.0f}"


def _page_workers(results: dict) -> str:
    """The worker-count case (``run.py --workers-case``): which loaders give one rank the same batches whatever
    the number of DataLoader workers, every statement computed from the run."""
    case = results.get("workers_case")
    if not case:
        return ""
    ran = [p for p in case["peers"] if p.get("status") == "ok" and "error" not in (p.get("workers") or {})]
    same = [p["name"] for p in ran if p["workers"]["same_batches"] == "yes"]
    other = [p["name"] for p in ran if p["workers"]["same_batches"] != "yes"]
    counts = ", ".join(str(w) for w in case["settings"]["counts"])
    text = f"""A run debugged on a laptop with 0 workers should see the batches the cluster's run saw with more. Here
    rank 0 of 2 simulated ranks reads epochs 1 and 2 with a new loader for each of {counts} DataLoader workers
    ({case["date"].replace("T", " ")}, {case["wall_s"]:.0f} s); the verdict is "yes" when every count gives the
    same batches, row for row and in the same order. The same batches whatever the count (loaders separated by
    semicolons):
    {"; ".join(same) or "none"}. Other batches with another count: {"; ".join(other) or "none"}. zarrtorch's
    default lets each worker form batches from its own chunks (the fastest way, so the default);
    `batch_order="rank"` assembles them in one place per rank ([batch-order.md](batch-order.md))."""
    return f"""## One rank's batches and the worker count

{_paragraph(text)}

{table_module().workers_markdown(case)}
"""


def mix_runs(case: dict) -> list[dict]:
    """One record per loader, weight setting and variant of the mixing case that ran (``run.py --mix-case``):
    ``loader``, ``weights`` (as ``0.7/0.3``), ``variant`` and its verdicts (``benchmarks/peers/mix_case.py``)."""
    out = []
    for run in case["runs"]:
        if run.get("status") != "ok" or "error" in (run.get("mix") or {}):
            continue
        weights = "/".join(f"{w:g}" for w in run["weights"])
        for variant, result in run["mix"]["variants"].items():
            if "error" not in result:
                out.append({"loader": run["name"], "weights": weights, "variant": variant} | result)
    return out


def _mix_names(records: list[dict], keep, every: bool = True) -> str:
    """``loader (variant)`` of the records ``keep`` holds for in every weight setting (``every=False``: in at
    least one), in the run's order."""
    named: dict[str, list[bool]] = {}
    for r in records:
        named.setdefault(f"{r['loader']} ({r['variant']})", []).append(bool(keep(r)))
    return "; ".join(name for name, kept in named.items() if (all if every else any)(kept)) or "none"


def _load(case: dict) -> str:
    """The machine's 1-minute load average at the start and the end of a run (``?`` when not recorded)."""
    return " then ".join(f"{v:.1f}" for v in case.get("load_average") or []) or "?"


def _page_mix(results: dict) -> str:
    """The mixing case (``run.py --mix-case``): each loader that mixes stores by weight, checked by running,
    every statement computed from the run."""
    case = results.get("mix_case")
    if not case:
        return ""
    s, records = case["settings"], mix_runs(case)
    settings = ", ".join("/".join(f"{w:g}" for w in ws) for ws in s["weights"])
    on_target = _mix_names(records, lambda r: r["on_target"] == "yes")
    even = _mix_names(records, lambda r: r["quota_once"] == "yes")
    goes_on = _mix_names(records, lambda r: r["two_epochs_once"] == "yes")
    same_source = _mix_names(records, lambda r: r["same_source_per_step"] == "yes")
    one_store = _mix_names(records, lambda r: r.get("every_rank_every_source", "yes") != "yes", every=False)
    unequal = _mix_names(records, lambda r: r["equal_batches"] != "yes", every=False)
    text = f"""zarrtorch's promises for a mix are in [mix.md](mix.md). Here every loader that mixes stores reads
    stores of {" and ".join(map(str, s["rows"]))} rows with the weights {settings} of {s["epoch_rows"]} rows per
    epoch (a weight may ask for more rows than a store holds), as its documentation says, on {s["world"]}
    simulated ranks with {s["workers"]} DataLoader workers, epochs 1 and 2 ({case["date"].replace("T", " ")},
    {case["wall_s"]:.0f} s, 1-minute load average {_load(case)}); each row's store and row are read from the
    store itself. Rows/s are those of a small run on a shared machine, to tell a loader that stalls, not to
    rank. Loaders (variants) within one global batch of every target, in every setting: {on_target}. Every
    epoch's draws spread evenly over each store's rows (none twice while another is never drawn): {even}. The
    same over both epochs together (a store asked for less than it holds goes on where it stopped): {goes_on}.
    Per-source batches with every rank drawing the same source at each step (a head per source under DDP needs
    both): {same_source}. A rank that draws no row of a store asked for, in some setting: {one_store}. Unequal
    batch counts on the ranks in some setting (a DDP job waits at the longer rank's next collective):
    {unequal}. This part alone again: `make bench-peers PEERS_ARGS="--mix-case only"`."""
    return f"""## Several stores mixed by weight

{_paragraph(text)}

{table_module().mix_markdown(case)}
"""


def _page_cache_case(results: dict) -> str:
    """The cache case (``run.py --cache-case``): each loader's copy served by a stand-in with a delay per request,
    read for a few epochs through the loader's own local cache; which loaders fetch nothing again from epoch 2,
    which could not reach the stand-in and why, every statement computed from the run."""
    case = results.get("cache_case")
    if not case:
        return ""
    table = table_module()
    settings, ran, failed = case["settings"], [], []
    for peer in case["peers"]:
        result = peer.get("cache") or {}
        why = peer.get("reason") or result.get("error") or result.get("refused")
        if peer.get("status") != "ok" or why:
            failed.append(f"{peer['name']} ({_short_reason(why or peer.get('status'))})")
        else:
            ran.append((peer["name"], table.cache_summary(result)))
    quiet = [name for name, s in ran if s["bytes"][1] <= 0.01 * s["bytes"][0]]
    shuffled = [name for name, s in ran if s["order"] == "yes"]
    text = f"""Issue 44's cache case: rank 0 of 1 with {settings["workers"]} workers, each loader's own copy of the
    store above served by one stand-in server (`benchmarks/peers/cache_case.py`: a static bucket with
    {settings["delay_ms"]:g} ms per request, answering zarrtorch over HTTP and the others over S3 path-style
    requests) and read for {settings["epochs"]} epochs by one loader through its own local cache, a fresh
    folder each ({case["date"].replace("T", " ")}, {case["wall_s"]:.0f} s{_load_suffix(case)}). The server counts
    the requests and the bytes it sent in each epoch: those counts are exact; the rates move with the load.
    At most 1% of epoch 1's bytes fetched again in epoch 2 (metadata only):
    {"; ".join(quiet) or "none"}.
    The order still changes every epoch: {"; ".join(shuffled) or "none"}. Could not read the stand-in:
    {"; ".join(failed) or "none"}. zarrtorch's own measurements of its cache, with more epochs and repeats:
    [cache.md](cache.md#measured)."""
    notes = "".join(f"- {_paragraph(note, 110)}\n" for note in (case.get("notes") or {}).values())
    notes = "\n" + notes if notes else ""
    return f"""## A remote copy and the loader's local cache

{_paragraph(text)}

{table.cache_markdown(case)}
{notes}"""


def _load_suffix(case: dict) -> str:
    """``, load average a-b`` (the machine's 1-minute load before and after the case), or "" for a run without."""
    load = case.get("load_average")
    return f", load average {load[0]:.1f}-{load[1]:.1f}" if load else ""


def _short_reason(why: str) -> str:
    """A refusal as the page's sentence gives it: the cause in brackets that ``common.refusal`` adds, else the
    error's start (the table beside it has the whole text)."""
    return why[why.rindex("[") + 1 :].rstrip("]") if "[" in why else why[:120]


def _page_figure(results: dict) -> str:
    name = Path(FIGURE).name
    where = (
        f"on both stores, the even one and the uneven one with {_workers_started(results)} workers"
        if uneven_passes(results)
        else "on this store (see above for what that store cannot show)"
    )
    text = f"""One point per loader and worker count, with one rank: rows/s over both epochs across, held memory up
    (both on log scales); the dashed line is L0. Filled markers are the loaders that kept all six guarantees
    {where}, hollow ones failed at least one; circles are 0 workers, squares more. Fast and lean is bottom right."""
    return f"""## In one picture

![rows/s against held memory per loader and worker count, one rank; filled: all six guarantees kept]({name})

{_paragraph(text)}
"""


def _page_reproduce() -> str:
    return f"""## Making it again

```bash
make bench-peers          # every loader, then zarrtorch and zarr-beluga on beluga's layouts
make bench-peers PEERS_ARGS="--only litdata,zarrtorch"    # two loaders (this page then shows those two)
make bench-peers PEERS_ARGS="--rows 2048 --layouts no"    # a smaller store, no layouts part
```

`make bench-peers` writes `benchmarks/peers.json` and `benchmarks/peers.md` (the table alone), then this page
and its figure with `python -m zarrtorch.course.peers_table --md {PAGE} --png {FIGURE}`. The options
(`--rows`, `--chunk-rows`, `--workers`, ...) and how each number is measured are in `benchmarks/README.md`,
section "Peers".
"""


def write_figure(results: dict, path: str | Path) -> Path:
    """The page's figure as a PNG (about 60 KB), without the software stamp, so that a rerun on the same
    matplotlib writes the same bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    figure(results, ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Write the reference page docs/peers.md from make bench-peers's JSON.")
    p.add_argument("--json", type=Path, default=None, help="results (default: benchmarks/peers.json)")
    p.add_argument("--md", type=Path, default=None, help=f"write the page here (e.g. {PAGE}); else print it")
    p.add_argument("--png", type=Path, default=None, help=f"write its figure here (e.g. {FIGURE})")
    a = p.parse_args(argv)
    results = load(a.json)
    text = page(results)
    if a.md:
        a.md.parent.mkdir(parents=True, exist_ok=True)
        a.md.write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    if a.png:
        write_figure(results, a.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
