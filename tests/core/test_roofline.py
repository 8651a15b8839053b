"""zarrtorch.roofline: the report's structure and consistency on a small store (no timing threshold: the
numbers only have to exist, be positive and agree with each other)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from zarrtorch import prepare_zarr
from zarrtorch.roofline import measure_loader, paced, roofline, warmup_batches


@pytest.fixture(scope="module", params=["zstd", "none"])
def store(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("roofline") / "data.zarr"
    x = np.random.default_rng(0).normal(size=(600, 8, 16)).astype(np.float32)
    prepare_zarr({"x": x, "y": np.arange(600)}, path, chunk_rows=50, codec=request.param, progress=False)
    return path


def test_report(store):
    report = roofline(store, batch_size=16, cpus=2, chunks=4, batches=10, step_ms=1.0)
    assert report.rows == 600 and report.chunk_rows == 50 and report.row_bytes == 8 * 16 * 4 + 8
    assert report.stored_row_bytes > 0 and report.read_rows_per_s > 0 and report.decode_rows_per_s_per_core > 0
    assert [(r["num_workers"], r["decode_threads"]) for r in report.loader] == [(0, 2), (2, 1)]
    assert all(r["rows_per_s"] > 0 for r in report.loader)
    name, rate = report.ceiling
    assert name in ("read", "decode") and rate == min(report.read_rows_per_s, 2 * report.decode_rows_per_s_per_core)
    assert report.binding in ("read", "decode", "loader")
    assert report.best in report.loader
    assert 0.0 <= report.step["data_wait_share"] <= 1.0
    text = report.summary()
    assert "binding limit" in text and "suggested for 2 CPU(s)" in text and "against a 1 ms step" in text


def slow_batches(n, seconds):
    """Batches that each take ``seconds`` to arrive, as from a loader that cannot keep up."""
    for _ in range(n):
        time.sleep(seconds)
        yield {"x": np.zeros(4)}


def test_data_wait_share_is_the_time_spent_in_next():
    """The share counts the time blocked in ``next()``, not the step: a consumer with no step only ever waits,
    one whose step is long against ready batches hardly does (margins of 10x the loop's own overhead at least;
    no loader involved, whose speed would decide the outcome)."""
    assert paced(slow_batches(5, 0.03), 0.0, limit=5)["data_wait_share"] > 0.9
    ready = iter([{"x": np.zeros(4)} for _ in range(5)])
    assert paced(ready, 0.03, limit=5)["data_wait_share"] < 0.1


def test_measure_loader_reports_the_share_of_a_paced_epoch(store):
    result = measure_loader(
        store, batch_size=16, num_workers=2, decode_threads=1, buffer_chunks=2, batches=8, step_s=0.01
    )
    assert result["rows_per_s"] > 0 and 0.0 <= result["data_wait_share"] <= 1.0
    assert result["steady_data_wait_share"] is not None  # 8 batches: past the 2 workers' warm-up


def test_warmup_batches_follow_the_buffer_doubling():
    # the buffer holds 1, 2, 4, 8 chunks before batches 0-3 of each worker: full from its 4th batch on
    assert [warmup_batches(b, 1) for b in (1, 2, 3, 4, 8, 9)] == [1, 2, 3, 3, 4, 5]
    assert warmup_batches(8, 2) == 8 and warmup_batches(8, 0) == 4


def test_paced_counts_every_batch_and_the_steady_part_only_when_there_is_one():
    result = paced(iter([{"x": np.zeros(3)} for _ in range(6)]), 0.0, limit=10, warmup=2)
    assert result["rows"] == 18 and 0.0 <= result["steady_data_wait_share"] <= 1.0
    assert paced(iter([{"x": np.zeros(3)}]), 0.0, limit=5, warmup=2)["steady_data_wait_share"] is None


def test_cli(store):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "zarrtorch",
            "roofline",
            str(store),
            "--batch-size",
            "16",
            "--chunks",
            "2",
            "--batches",
            "5",
            "--cpus",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["cpus"] == 1 and len(report["loader"]) == 1 and report["binding"] in ("read", "decode", "loader")


@pytest.mark.parametrize("damage", ["missing", "cut short"])
def test_a_bad_chunk_among_those_measured_is_named(tmp_path, capsys, damage):
    """A missing chunk read as empty bytes and a damaged one raised zstd's bare 'invalid input data' with a
    traceback; the command now names the array, the chunk and its key, and exits 1."""
    from zarrtorch.roofline import main

    path = tmp_path / "data.zarr"
    prepare_zarr({"x": np.arange(400 * 8, dtype=np.float32).reshape(400, 8)}, path, chunk_rows=50, progress=False)
    key = path / "x" / "c" / "3" / "0"
    if damage == "missing":
        key.unlink()
    else:
        key.write_bytes(key.read_bytes()[:20])
    assert main([str(path), "--chunks", "8", "--batches", "2"]) == 1
    said = capsys.readouterr().err
    assert "chunk 3 of array 'x'" in said and "x/c/3/0" in said, said
    assert ("missing" in said) == (damage == "missing")
