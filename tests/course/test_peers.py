"""The peer benchmark's judging and reporting, without any peer: the guarantee verdicts on made-up row numbers,
and the table's row for a peer that could not be installed (``benchmarks/peers/``, ``make bench-peers``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PEERS = Path(__file__).resolve().parents[2] / "benchmarks" / "peers"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"peers_{name}", PEERS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checks, table = _load("checks"), _load("table")


def batches(rows, size=4):
    return [list(rows[i : i + size]) for i in range(0, len(rows), size)]


def test_every_row_once_and_equal_batches():
    r0, r1 = batches(range(0, 16)), batches(range(16, 32))
    assert checks.every_row_once([r0, r1], 32) == "yes"
    assert checks.every_row_once([r0, batches(range(16, 28))], 32, may_drop=7) == "yes: 4 dropped (drop_last)"
    assert checks.every_row_once([r0, r0], 32) == "wrong: 16 rows twice, 16 missing"
    assert checks.every_row_once([r0, batches(range(16, 28))], 32) == "wrong: 0 rows twice, 4 missing"
    assert checks.equal_batches([r0, r1]) == "yes"
    assert checks.equal_batches([r0, r1[:-1]]) == "wrong: 4 vs 3"


def test_reshuffled_across_ranks():
    e1 = [batches(range(0, 16)), batches(range(16, 32))]
    moved = [batches([*range(8, 16), *range(16, 24)]), batches([*range(0, 8), *range(24, 32)])]
    own_order = [batches(list(range(0, 16))[::-1]), batches(range(16, 32))]
    assert checks.reshuffled_across_ranks(e1, moved) == "yes"
    assert checks.reshuffled_across_ranks(e1, e1) == "no: same order"
    assert checks.reshuffled_across_ranks(e1, own_order) == "no: fixed share per rank"


def test_resume_verdicts():
    run = batches([5, 3, 9, 1, 0, 2, 8, 4, 7, 6, 11, 10])
    assert checks.resume_exact(run, run[:1], run[1:]) == "yes"
    assert checks.resume_exact(run, run[:1], [run[2], run[1]]) == "yes: same rows, other order"
    assert checks.resume_exact(run, run[:1], run[:2]) == "wrong: 4 rows not due, 4 due rows lost"
    before = [batches(range(0, 4)), batches(range(8, 12))]
    assert checks.resume_elsewhere(before, [batches([4, 5, 6, 7, 12, 13, 14, 15])], 16) == "yes"
    assert checks.resume_elsewhere(before, [batches(range(4, 16))], 16) == "wrong: 4 rows twice, 0 missing"


def test_table_reports_every_peer():
    epochs = [{"rows": 64, "seconds": 1.0, "rows_per_s": 64.0, "ttfb_s": 0.1, "held_mib": 10.0}] * 2
    half = [{"rows": 32, "seconds": 1.0, "rows_per_s": 32.0, "ttfb_s": 0.1, "held_mib": 9.0}] * 2
    ok = {"throughput": {"0": {"epochs": epochs}, "2": {"epochs": epochs}}, "status": "ok"}
    ok["throughput_2ranks"] = {"0": {"epochs": half}, "2": {"epochs": half}}
    g = {"workers": 2, "every_row_once": "yes", "resume_exact": "no API"}
    results = {
        "l0": {"rows_per_s": 128.0},
        "peers": [
            {"name": "zarrtorch", **ok, "guarantees": g},
            {"name": "Other", **ok, "conversion": {"conversion_s": 3.0, "disk_bytes": 2**21}, "guarantees": g},
            {"name": "Broken", "status": "not installable", "reason": "not installable: needs a CUDA torchvision"},
        ],
    }
    text = table.markdown(results)
    rows = {}  # each loader's first row: 1 rank, 0 workers
    for line in text.splitlines():
        rows.setdefault(line.split(" | ")[0].lstrip("| "), line)
    assert "| Broken | | | not installable: needs a CUDA torchvision |" in text
    assert "3 s, 2 MiB" in text and "no API" in text
    others = [line for line in text.splitlines() if line.startswith("| Other |")]
    assert [line.split(" | ")[1:3] for line in others] == [["1", "0"], ["1", "2"], ["2", "0"], ["2", "2"]]
    assert " | 0.50 | 1.00 | " in rows["zarrtorch"]  # 64 rows/s: half of L0, the same as itself
    assert " | 0.25 | 1.00 | " in others[2]  # rank 0 of 2: 32 rows/s, against zarrtorch's rank 0 of 2
    assert ["no API" in line for line in others] == [False, False, False, True]  # checks: 2 ranks x 2 workers


def test_torchvision_stand_ins_only_where_torchvision_does_not_import():
    """MosaicML Streaming imports ``torchvision.datasets.VisionDataset``; the stand-ins make that import work
    where no torchvision loads (the course's env has none), leave ``find_spec`` callers working, and raise as
    soon as anything uses them. A real torchvision would be kept (install() returns False)."""
    import importlib.util
    import sys

    import pytest

    stub = _load("torchvision_stub")
    saved = {k: v for k, v in sys.modules.items() if k == "torchvision" or k.startswith("torchvision.")}
    try:
        real = importlib.util.find_spec("torchvision") is not None
        assert stub.install() is (not real)
        if real:
            return
        from torchvision.datasets import VisionDataset
        from torchvision.transforms.functional import to_tensor

        assert importlib.util.find_spec("torchvision") is not None  # transformers asks this at import
        with pytest.raises(RuntimeError, match="stand-in"):
            VisionDataset("root")
        with pytest.raises(RuntimeError, match="stand-in"):
            to_tensor(None)
    finally:
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
        sys.modules.update(saved)
