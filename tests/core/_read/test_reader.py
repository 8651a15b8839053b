"""Small chunks of a local store are read several to a reading task: the same pieces, in the same order, with the
same errors at the same place, and the reads ahead counted in chunks by the memory budget."""

import threading
from pathlib import Path

import numpy as np
import pytest

import zarrtorch._util.sizes
from zarrtorch import ReadOptions, ReadPlan, ZarrDataLoader, ZarrIterableDataset, loader_memory, prepare_zarr
from zarrtorch._read.fastpath import read_buffer_bytes
from zarrtorch._read.reader import ChunkReadError, PieceReader

CHUNK, CHUNKS = 4, 40


@pytest.fixture
def store(tmp_path):
    x = np.arange(CHUNK * CHUNKS * 3, dtype=np.float32).reshape(-1, 3)
    return prepare_zarr({"x": x}, tmp_path / "s.zarr", chunk_rows=CHUNK, progress=False), x


def pieces() -> np.ndarray:
    return np.array([(a, a + CHUNK) for a in range(0, CHUNK * CHUNKS, CHUNK)], dtype=np.int64)


def test_each_task_reads_consecutive_pieces_and_hands_them_out_in_order(store, monkeypatch):
    group, x = store
    who: list[tuple[int, str]] = []
    read_piece = PieceReader.read_piece

    def recorded(self, start, stop):
        who.append((int(start), threading.current_thread().name))
        return read_piece(self, start, stop)

    monkeypatch.setattr(PieceReader, "read_piece", recorded)
    reader = PieceReader(dict(group.arrays()), CHUNK, threads=2, prefetch=3, pieces_per_read=8)
    got = [piece["x"].copy() for piece in reader.iter_pieces(pieces())]
    np.testing.assert_array_equal(np.concatenate(got), x)
    by_start = dict(who)
    for first in range(0, CHUNKS, 8):  # each run of 8 pieces was read by one task, in one thread
        threads = {by_start[(first + k) * CHUNK] for k in range(8)}
        assert len(threads) == 1 and next(iter(threads)).startswith("zarrtorch-read")


def test_a_damaged_piece_inside_a_task_comes_after_the_pieces_before_it(store):
    """The error is raised where a read one piece at a time would raise it: after pieces 0-12, not before."""
    group, x = store
    Path(group.store.root, "x", "c", "13", "0").write_bytes(b"not zstd")
    reader = PieceReader(dict(group.arrays()), CHUNK, threads=2, prefetch=3, pieces_per_read=8)
    got = []
    with pytest.raises(ChunkReadError, match=r"chunk 13 \(rows 52:56\) of array 'x'"):
        for piece in reader.iter_pieces(pieces()):
            got.append(piece["x"].copy())
    assert len(got) == 13
    np.testing.assert_array_equal(np.concatenate(got), x[: 13 * CHUNK])


def test_pieces_per_read_and_what_the_budget_counts(store, tmp_path):
    group, _ = store
    ds = ZarrIterableDataset(group.store.root, read=ReadOptions(decode_threads=2))
    plan = ReadPlan.of(ds, 0)
    per_read = plan.pieces_per_read
    assert per_read == zarrtorch._util.sizes.MOST_PIECES_PER_READ  # 48-byte chunks: as many as a task may take
    assert (plan.first_in_flight, plan.most_in_flight) == (3, 3) and plan.chunks_ahead == 3 * per_read
    set_reads = ZarrIterableDataset(group.store.root, read=ReadOptions(decode_threads=2, requests_in_flight=5))
    fixed = ReadPlan.of(set_reads, 0)
    assert fixed.pieces_per_read == 1 and fixed.chunks_ahead == 5  # a number set is chunks, as before
    big = prepare_zarr({"x": np.zeros((64, 256, 1024), np.float32)}, tmp_path / "b.zarr", chunk_rows=1, progress=False)
    assert ReadPlan.of(ZarrIterableDataset(big.store.root), 0).pieces_per_read == 1  # 1 MiB chunks: one a task
    budget = loader_memory(ZarrDataLoader(ds, batch_size=8))
    # a file buffer per reading thread: 2 threads for 3 reads in flight, not one per chunk those reads hold
    assert budget.read_buffers == 2 * read_buffer_bytes(ds.arrays["x"]) > 0
