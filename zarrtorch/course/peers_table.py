"""Appendix A2's reading of ``make bench-peers``: the committed results (``benchmarks/peers.json``, written with
``benchmarks/peers.md`` by ``benchmarks/peers/run.py --md``) as records, guarantee verdicts and one figure.

Nothing is run or measured here: a results dict in, numbers, text or a figure out. The markdown table and the
rows/s over two epochs are those of ``benchmarks/peers/table.py`` (the script that writes ``peers.md``),
loaded by path, so the notebook, the slides and the page show one computation.
"""

from __future__ import annotations

import importlib.util
import json
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


def verdicts(results: dict) -> dict[str, dict[str, str]]:
    """``{loader: {guarantee column: verdict}}`` for every loader whose guarantee checks ran."""
    out = {}
    for peer in results["peers"]:
        g = peer.get("guarantees") or {}
        if peer.get("status") == "ok" and g and "error" not in g:
            out[peer["name"]] = {column: str(g.get(key, "?")) for column, key in guarantee_columns()}
    return out


def kept(verdict: str) -> bool:
    """A verdict that keeps its guarantee: ``yes``, or ``yes: ...`` (e.g. rows dropped by ``drop_last``)."""
    return verdict == "yes" or verdict.startswith("yes:")


def keeps_all(results: dict) -> list[str]:
    """Loaders that kept every guarantee, in the table's order."""
    return [name for name, v in verdicts(results).items() if all(kept(x) for x in v.values())]


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
        label = f"{r['loader'].split(' ')[0]} ({r['workers']})"
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
        title="Right and low is fast and lean; filled: every guarantee kept",
    )
    ax.grid(True, which="major", color="0.9", lw=0.6, zorder=0)
    handles = [
        ax.scatter([], [], marker="o", facecolors="0.3", edgecolors="0.3", label="every guarantee, 0 workers"),
        ax.scatter([], [], marker="s", facecolors="0.3", edgecolors="0.3", label="every guarantee, with workers"),
        ax.scatter([], [], marker="o", facecolors="white", edgecolors="0.3", label="fails one or more"),
    ]
    ax.legend(handles=handles, fontsize=label_size, loc="lower left")
    return ax
