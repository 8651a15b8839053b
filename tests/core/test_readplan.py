"""Unit tests of zarrtorch/readplan.py: the default decode threads, and where a local store's small chunks are read."""

import threading

import numpy as np

import zarrtorch._util.process
from zarrtorch import ReadOptions, ReadPlan, ZarrDataLoader, ZarrIterableDataset, prepare_zarr


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


def test_a_local_store_of_small_chunks_is_read_in_the_thread_that_gathers_its_batches(tmp_path, monkeypatch):
    """Issue 43: a reading thread beside the one gathering the batches took the GIL back at every system call of
    every chunk (open, read, close) while the gatherer wanted it: a WeatherBench2-like group of one-row chunks gave
    1.17x the rows/s (0 workers, 20 alternating epochs in one process) read where it is gathered, a piece at a
    time. Larger chunks, decoded outside the GIL for longer, keep their reads in flight beside it."""
    monkeypatch.setattr(zarrtorch._util.process, "available_cpus", lambda: 4)
    for chunk_rows in (1, 16):  # 4 and 64 KiB
        small = ReadPlan.of(dataset(tmp_path, chunk_rows), 0)
        assert (small.threads, small.most_in_flight, small.pieces_ahead, small.chunks_ahead) == (1, 1, 1, 1)
    larger = ReadPlan.of(dataset(tmp_path, 32), 0)
    assert (larger.threads, larger.most_in_flight) == (4, 5)
    several = ReadPlan.of(dataset(tmp_path, 1, read=ReadOptions(decode_threads=3)), 0)
    assert (several.threads, several.most_in_flight) == (3, 4)


def test_an_epoch_of_small_local_chunks_starts_no_reading_thread(tmp_path):
    """What the plan above means in a loader: every row once, and no ``zarrtorch-read`` thread alive meanwhile."""
    ds = dataset(tmp_path, 1, shuffle=True, seed=3, return_index=True)
    seen, names = [], set()
    for batch in ZarrDataLoader(ds, batch_size=8):
        seen.extend(batch["index"].tolist())
        names.update(t.name for t in threading.enumerate())
    assert sorted(seen) == list(range(64))
    assert not any(name.startswith("zarrtorch-read") for name in names), names
