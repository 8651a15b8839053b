"""The shuffle buffer of references (zarrtorch/ref_buffer.py): the batches of the copying buffer, one copy fewer,
and no decoded row referenced once it is in a batch."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import zarrtorch._util.pool
from zarrtorch import ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch._read.reader import PieceReader
from zarrtorch._workers.dealt import DealtPieces
from zarrtorch.buffer import RowCursor, SlotBuffer, schedule
from zarrtorch.ref_buffer import RefBuffer, holds_rows_alone

COLUMNS = {"index": ((), np.dtype(np.int64)), "x": ((3,), np.dtype("f4"))}


def data_of(index: np.ndarray) -> np.ndarray:
    return np.stack([index * 1.0, -index, index + 0.5], axis=1).astype("f4")


def a_case(seed: int):
    """Random pieces (1 to 4 rows), batch sizes, buffer and warm-up: buffers that fill, run full, and drain."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 5, size=int(rng.integers(3, 40)))
    stops = np.cumsum(lengths) + 1000
    pieces = np.stack([stops - lengths, stops], axis=1)
    rows = int(lengths.sum())
    cuts = np.sort(rng.choice(np.arange(1, rows), size=min(rows - 1, int(rng.integers(0, 12))), replace=False))
    sizes = np.diff(np.concatenate([[0], cuts, [rows]]))
    return pieces, sizes, int(rng.integers(1, 30)), int(rng.integers(1, 5))


def batches_of(buf: SlotBuffer, pieces, sizes, capacity, warmup, seed, out=None):
    cursor = RowCursor(pieces)
    cursor.feed({"x": data_of(np.arange(a, b))} for a, b in pieces)
    steps = schedule(sizes, int(sizes.sum()), capacity=capacity, warmup_rows=warmup, rng=np.random.default_rng(seed))
    return [{n: a.copy() for n, a in buf.apply(step, cursor.stream, out).items()} for step in steps]


@pytest.mark.parametrize("into", [False, True])
@pytest.mark.parametrize("seed", range(16))
def test_batches_are_those_of_the_copying_buffer(seed, into):
    """Every batch, row ids and data, is the copying buffer's, gathered into new arrays or into given ones."""
    pieces, sizes, capacity, warmup = a_case(seed)
    capacity = max(capacity, int(sizes.max()))
    out = (lambda rows: {n: np.full((rows, *s), -7, dtype=d) for n, (s, d) in COLUMNS.items()}) if into else None
    copied = batches_of(SlotBuffer(capacity, COLUMNS), pieces, sizes, capacity, warmup, seed)
    by_ref = batches_of(RefBuffer(capacity, COLUMNS), pieces, sizes, capacity, warmup, seed, out)
    assert len(by_ref) == len(copied)
    for got, want in zip(by_ref, copied, strict=True):
        assert got.keys() == want.keys()
        for name in want:
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name])
        np.testing.assert_array_equal(got["x"], data_of(got["index"]))


@pytest.mark.parametrize("seed", range(6))
def test_a_row_in_a_batch_is_referenced_no_more(seed):
    """A decoded one-row piece stays alive only while its row waits in the buffer (or is the piece being read):
    once its row is in a batch, or the buffer drains past it, nothing holds its chunk."""
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(5, 120))
    pieces = np.stack([np.arange(rows), np.arange(1, rows + 1)], axis=1)
    cuts = np.sort(rng.choice(np.arange(1, rows), size=min(rows - 1, int(rng.integers(0, 10))), replace=False))
    sizes = np.diff(np.concatenate([[0], cuts, [rows]]))
    capacity = max(int(rng.integers(1, 40)), int(sizes.max()))
    alive: set[int] = set()
    latest = [-1]  # the piece last handed out, which a reader's generator may hold until asked for the next one

    def decoded():
        for a, _ in pieces:
            x = data_of(np.array([a]))
            alive.add(int(a))
            weakref.finalize(x, alive.discard, int(a))
            latest[0] = int(a)
            yield {"x": x}
            x = None

    buf, cursor = RefBuffer(capacity, COLUMNS), RowCursor(pieces)
    cursor.feed(decoded())
    emitted: set[int] = set()
    steps = schedule(sizes, rows, capacity=capacity, warmup_rows=1, rng=np.random.default_rng(seed))
    for step in steps:
        emitted.update(buf.apply(step, cursor.stream)["index"].tolist())
        gc.collect()
        assert not (alive - {latest[0]}) & emitted, "rows already in a batch still referenced"
        assert len(alive - {latest[0]}) <= capacity
    buf.flush()
    cursor.close()
    gc.collect()
    assert not alive - {latest[0]}
    assert emitted == set(range(rows))


def test_only_readers_of_one_row_chunks_of_their_own_hold_rows_by_reference(tmp_path):
    """Chunks of several rows would stay alive until their last row is drawn (past the buffer's size), rows kept in
    memory are another path, and the pieces the workers send with ``batch_order="rank"`` live in a ring of few
    slots the workers wait on: those are copied into slots, as before."""
    one = prepare_zarr({"x": np.zeros((8, 2), "f4")}, tmp_path / "one.zarr", chunk_rows=1, progress=False)
    four = prepare_zarr({"x": np.zeros((8, 2), "f4")}, tmp_path / "four.zarr", chunk_rows=4, progress=False)
    assert holds_rows_alone(PieceReader(dict(one.arrays()), 1))
    assert not holds_rows_alone(PieceReader(dict(four.arrays()), 4))
    assert not holds_rows_alone(PieceReader(dict(one.arrays()), 1, cache={}))
    assert not holds_rows_alone(DealtPieces(iter(()), dict(one.arrays()), 1, lambda: None))


def one_row_store(path, rows=96):
    x = np.arange(rows * 6, dtype="f4").reshape(rows, 2, 3)
    return prepare_zarr({"x": x, "y": np.arange(rows) * 10}, path, chunk_rows=1, progress=False)


@pytest.mark.parametrize("workers", [0, 2])
def test_one_row_chunks_reach_the_batch_without_a_copy_into_the_shuffle_buffer(tmp_path, monkeypatch, workers):
    """Issue 43 (the cheap codecs at 0.52-0.58x of the raw decode): every row was copied from its decoded chunk
    into a shuffle-buffer slot, then into the batch. With one-row chunks no slot array is allocated (the buffer
    holds references) and every row still comes once, with its own data."""

    def no_slots(self, capacity, columns):
        raise AssertionError("a shuffle buffer of row copies was allocated")

    monkeypatch.setattr(zarrtorch._util.pool.Pools, "slots", no_slots)
    store = one_row_store(tmp_path / "d.zarr")
    loader = ZarrDataLoader(ZarrIterableDataset(store, seed=1, return_index=True), batch_size=8, num_workers=workers)
    batches = list(loader)
    index = np.concatenate([b["index"].numpy() for b in batches])
    assert np.array_equal(np.sort(index), np.arange(96))
    assert not np.array_equal(index, np.arange(96))  # shuffled
    for b in batches:
        np.testing.assert_array_equal(b["x"][:, 0, 0].numpy(), 6 * b["index"].numpy())
        np.testing.assert_array_equal(b["y"].numpy(), 10 * b["index"].numpy())


def test_a_resumed_epoch_over_one_row_chunks_yields_the_rest_exactly(tmp_path):
    """The buffer rebuilt at the resume point holds references to the rows read again (``RefBuffer.load``): the
    batches after it are those of the uninterrupted epoch."""
    store = one_row_store(tmp_path / "d.zarr")
    loader = ZarrDataLoader(ZarrIterableDataset(store, seed=2, return_index=True, buffer_chunks=24), batch_size=8)
    loader.set_epoch(1)
    whole = [(b["index"].numpy(), b["x"].numpy()) for b in loader]
    loader.set_epoch(1)
    it, first = iter(loader), []
    for _ in range(5):
        first.append(next(it)["index"].numpy())
    state = loader.state_dict()
    del it
    loader.load_state_dict(state)
    rest = [(b["index"].numpy(), b["x"].numpy()) for b in loader]
    assert len(first) + len(rest) == len(whole)
    for (index, x), (want_index, want_x) in zip(rest, whole[5:], strict=True):
        np.testing.assert_array_equal(index, want_index)
        np.testing.assert_array_equal(x, want_x)


def test_a_piece_taken_whole_is_handed_on_as_read_and_a_part_of_one_as_its_rows():
    """The cursor makes no new view of a piece taken whole: with one-row chunks that was a view per array per row,
    the largest share of the gather's own time (issue 43, 10 arrays). A piece split between two reads still gives
    each read its own rows."""
    pieces = np.array([[0, 1], [5, 8]])
    data = [{"x": np.array([[10.0]])}, {"x": np.array([[50.0], [60.0], [70.0]])}]
    cursor = RowCursor(pieces)
    cursor.feed(iter(data))
    (whole,) = cursor.read(1)
    assert whole["x"] is data[0]["x"] and whole["index"].tolist() == [0]
    (part,) = cursor.read(2)
    assert part["index"].tolist() == [5, 6] and part["x"].tolist() == [[50.0], [60.0]]
    (rest,) = cursor.read(1)
    assert rest["index"].tolist() == [7] and rest["x"].tolist() == [[70.0]]
