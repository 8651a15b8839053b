"""Unit tests of zarrtorch/readplan.py: the default decode threads."""

import numpy as np

import zarrtorch._util.process
from zarrtorch import ReadOptions, ReadPlan, ZarrIterableDataset, prepare_zarr


def dataset(tmp_path, chunk_rows: int, **options) -> ZarrIterableDataset:
    x = np.zeros((64, 16, 64), dtype=np.float32)  # 4 KiB a row
    prepare_zarr({"x": x}, tmp_path / f"c{chunk_rows}.zarr", chunk_rows=chunk_rows, progress=False, overwrite=True)
    return ZarrIterableDataset(tmp_path / f"c{chunk_rows}.zarr", **options)


def test_a_local_store_of_small_chunks_is_decoded_in_one_thread_by_default(tmp_path, monkeypatch):
    """Issue 43 (rows of one-row-chunk stores, 0 workers): two or more threads decoding 4-64 KiB chunks only wait
    for each other's GIL (one thread read a 10-array WeatherBench2-like group 1.3-2x faster). Larger chunks keep
    the process's share of the CPUs, and a number set is kept."""
    monkeypatch.setattr(zarrtorch._util.process, "available_cpus", lambda: 4)
    assert ReadPlan.of(dataset(tmp_path, 1), 0).decode_threads == 1  # 4 KiB chunks
    assert ReadPlan.of(dataset(tmp_path, 16), 0).decode_threads == 1  # 64 KiB
    larger = dataset(tmp_path, 32)  # 128 KiB chunks: decoding outweighs the rest
    assert ReadPlan.of(larger, 0).decode_threads == 4
    assert ReadPlan.of(larger, 2).decode_threads == 2
    assert ReadPlan.of(dataset(tmp_path, 1, read=ReadOptions(decode_threads=3)), 0).decode_threads == 3
