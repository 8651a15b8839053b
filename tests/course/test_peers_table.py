"""Appendix A2's reading of ``make bench-peers`` (``zarrtorch.course.peers_table``) on made-up results: the ratios
to zarrtorch per worker count, the verdicts, who keeps every guarantee, the figure; and the committed JSON is
the run that wrote ``benchmarks/peers.md``."""

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
        "l0": {"rows_per_s": 400.0},
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
