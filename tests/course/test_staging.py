"""benchmarks/staging.py on a tiny store: the copy holds every file, and the break-even is the copy time over
the time an epoch saves, or "never" when the copy is not faster to read (no timing thresholds)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import staging  # noqa: E402

from zarrtorch import prepare_zarr  # noqa: E402


def test_break_even_arithmetic():
    assert staging.break_even(3.0, 2.0, 0.5) == pytest.approx(2.0)
    assert staging.break_even(3.0, 1.0, 1.0) == "never"
    assert staging.break_even(3.0, 1.0, 1.5) == "never"


def test_measure_copies_every_file_and_the_figures_agree(tmp_path):
    rng = np.random.default_rng(0)
    source = tmp_path / "src" / "train.zarr"
    prepare_zarr({"x": rng.normal(size=(96, 3, 4)).astype(np.float32)}, source, chunk_rows=16, progress=False)
    (tmp_path / "node").mkdir()
    result = staging.measure(source, tmp_path / "node", batch_size=8, decode_threads=1, repeats=1)
    files = staging.store_files(source)
    assert result["copy_complete"] and result["files_copied"] == result["files"] == len(files) > 6
    assert result["bytes_copied"] == result["bytes"] == sum(files.values())
    assert not Path(result["dest"]).exists(), "the copy is removed afterwards"
    assert result["copy_s"] > 0
    for mode in ("cold", "warm"):
        m = result[mode]
        assert m["rows_per_epoch"] == 96 and m["in_place_s"] > 0 and m["from_copy_s"] > 0
        assert m["saved_per_epoch_s"] == pytest.approx(m["in_place_s"] - m["from_copy_s"])
        if m["saved_per_epoch_s"] > 0:
            assert m["break_even_epochs"] == pytest.approx(result["copy_s"] / m["saved_per_epoch_s"])
        else:
            assert m["break_even_epochs"] == "never"
    text = staging.table(result)
    assert text.count("\n") == 3 and "| cold |" in text and "| warm |" in text
