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


CALLS_PER_SMALL_CHUNK = 66  # Python calls one 1-row Blosc chunk of a local v2 group costs (59 measured)


def one_row_blosc_group(path: Path, names: tuple[str, ...], rows: int) -> tuple[dict, dict[str, np.ndarray]]:
    """A WeatherBench2-like Zarr v2 group: one array per variable, one row per chunk, Blosc lz4 + shuffle."""
    import numcodecs
    import zarr

    group = zarr.open_group(path, mode="w", zarr_format=2)
    values = {}
    for k, name in enumerate(names):
        values[name] = np.random.default_rng(k).random((rows, 4, 8), dtype=np.float32)
        arr = group.create_array(
            name, shape=values[name].shape, chunks=(1, 4, 8), dtype="float32", compressors=numcodecs.Blosc("lz4")
        )
        arr[:] = values[name]
    reopened = zarr.open_group(path, mode="r")
    return {name: reopened[name] for name in names}, values


def test_a_one_row_chunk_of_a_blosc_group_costs_a_bounded_number_of_python_calls(tmp_path):
    """Issue 43 (rows of WeatherBench2-like stores, 0.42x zarr-beluga): a one-row chunk is mostly Python work,
    not decoding, so what the reading thread calls per chunk decides the rows per second. Counted, not timed:
    ``Blosc().decode``'s buffer checks and zarr's ``shape`` asked once per chunk made it 79 calls."""
    import sys

    names = ("u", "v", "t")
    arrays, values = one_row_blosc_group(tmp_path / "wb2.zarr", names, rows=24)
    reader = PieceReader(arrays, 1)
    first = reader.read_piece(0, 1)  # the pools and the thread's read buffer made outside the count
    calls = [0]

    def count(frame, event, arg):
        calls[0] += event in ("call", "c_call")

    got = [first]
    sys.setprofile(count)
    try:
        got += [reader.read_piece(row, row + 1) for row in range(1, 24)]
    finally:
        sys.setprofile(None)
    for name in names:
        np.testing.assert_array_equal(np.concatenate([piece[name] for piece in got]), values[name])
    assert calls[0] / (23 * len(names)) <= CALLS_PER_SMALL_CHUNK


def test_a_damaged_one_row_blosc_chunk_between_good_ones_is_named(tmp_path):
    """The Blosc header is read from the stored bytes themselves (no copy): a chunk cut short in the middle of
    a task of one-row chunks is an error naming that chunk and array, after the rows before it, equal to zarr's."""
    arrays, values = one_row_blosc_group(tmp_path / "wb2.zarr", ("u", "v"), rows=12)
    key = Path(tmp_path / "wb2.zarr" / "v" / "7.0.0")
    key.write_bytes(key.read_bytes()[:-3])
    reader = PieceReader(arrays, 1, threads=2, prefetch=3, pieces_per_read=4)
    got = []
    with pytest.raises(ChunkReadError, match=r"chunk 7 \(rows 7:8\) of array 'v'.*Blosc frame says"):
        for piece in reader.iter_pieces(np.array([(r, r + 1) for r in range(12)], dtype=np.int64)):
            got.append({name: column.copy() for name, column in piece.items()})
    assert len(got) == 7
    for name in ("u", "v"):
        np.testing.assert_array_equal(np.concatenate([piece[name] for piece in got]), values[name][:7])
