"""Reading the next epoch's first pieces as an epoch ends (zarrtorch.early), and the shuffle buffer's
arrays kept between epochs: the next epoch's batches must be exactly a fresh start's, whatever epoch comes."""

from __future__ import annotations

import os
import pickle
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from zarrtorch import ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch.buffer import SlotBuffer
from zarrtorch.early import EarlyReads
from zarrtorch.pool import Pool
from zarrtorch.reader import PieceReader

CHUNK, CHUNKS, THREADS = 16, 12, 2
READS: list[tuple[int, int]] = []  # every piece read in this process
USED: list[int] = []  # reads each epoch took from those started early, in this process


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rows = CHUNK * CHUNKS - 3
    path = tmp_path_factory.mktemp("early") / "d.zarr"
    prepare_zarr({"x": np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)}, path, chunk_rows=CHUNK, progress=False)
    return str(path)


@pytest.fixture()
def recorded(monkeypatch):
    read_piece, take_leading = PieceReader.read_piece, EarlyReads.take_leading

    def record(self, start, stop):
        READS.append((int(start), int(stop)))
        return read_piece(self, start, stop)

    def record_taken(self, pieces):
        taken = take_leading(self, pieces)
        USED.append(len(taken))
        return taken

    monkeypatch.setattr(PieceReader, "read_piece", record)
    monkeypatch.setattr(EarlyReads, "take_leading", record_taken)
    READS.clear()
    USED.clear()
    return READS


def dataset(store, **kw):
    return ZarrIterableDataset(store, buffer_chunks=3, decode_threads=THREADS, return_index=True, **kw)


def epoch_batches(loader, epoch):
    loader.set_epoch(epoch)
    return [{k: v.clone() for k, v in b.items()} for b in loader]


def fresh_batches(store, epoch, **loader_kw):
    return epoch_batches(ZarrDataLoader(dataset(store), batch_size=8, **loader_kw), epoch)


def assert_same(got, want):
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def first_pieces(ds, epoch, n):
    return [tuple(int(v) for v in p) for p in ds.plan(epoch=epoch).workers[0].pieces[:n]]


def wait_for_early_reads(ds):
    for _, read in ds._early._reads:
        read.result()


def test_the_next_epoch_starts_from_reads_made_as_this_one_ended(store, recorded):
    ds = dataset(store)
    loader = ZarrDataLoader(ds, batch_size=8)
    epoch_batches(loader, 0)
    ahead = ds.in_flight(THREADS)
    expected = first_pieces(ds, 1, ahead)
    assert ds._early is not None and ds._early.pieces == expected
    wait_for_early_reads(ds)
    assert sorted(recorded[-ahead:]) == sorted(expected)  # read after all of epoch 0's

    recorded.clear()
    got = epoch_batches(loader, 1)
    assert USED == [ahead]
    assert recorded[: CHUNKS - ahead] == first_pieces(ds, 1, CHUNKS)[ahead:]  # nothing read twice or skipped
    assert_same(got, fresh_batches(store, 1))


def test_an_unexpected_next_epoch_reads_everything_itself(store, recorded):
    """After epoch 0 the early reads are for epoch 1; another epoch that starts with another piece drops them
    and reads all its pieces, with the batches of a fresh start."""
    ds = dataset(store)
    loader = ZarrDataLoader(ds, batch_size=8)
    epoch_batches(loader, 0)
    other = next(e for e in range(2, 50) if first_pieces(ds, e, 1) != first_pieces(ds, 1, 1))
    wait_for_early_reads(ds)
    recorded.clear()
    got = epoch_batches(loader, other)
    assert USED == [0]
    assert recorded[:CHUNKS] == first_pieces(ds, other, CHUNKS)
    assert_same(got, fresh_batches(store, other))


def early_reads_used_here(batch):
    """A transform, run in the worker: how many reads this process's epochs took from early ones so far."""
    return {**batch, "early": torch.tensor(sum(USED))}


@pytest.mark.parametrize("persistent", [True, False])
def test_workers_read_early_only_when_they_live_on(store, recorded, persistent):
    """Persistent workers read the next epoch's first pieces as the epoch ends, and yield a fresh start's
    batches; workers that exit with the epoch read nothing early."""
    ds = dataset(store, transform=early_reads_used_here)
    loader = ZarrDataLoader(ds, batch_size=8, num_workers=2, persistent_workers=persistent,
                            multiprocessing_context="fork")  # fmt: skip
    for epoch in range(3):
        got = epoch_batches(loader, epoch)
        early = [int(b.pop("early")) for b in got]
        assert min(early) > 0 if persistent and epoch > 0 else set(early) == {0}
        assert_same(got, fresh_batches(store, epoch, num_workers=2))


def test_early_reads_belong_to_one_process(store):
    """A pickled copy (a spawned worker's dataset) or a forked one has no early reads: their threads are not
    there, so nothing of them is waited on or touched."""
    ds = dataset(store)
    loader = ZarrDataLoader(ds, batch_size=8)
    epoch_batches(loader, 0)
    assert ds._early is not None and ds._early.pieces
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._early is None or copy._early.pieces == []
    early = ds._early
    early._pid = os.getpid() + 1  # as in a forked child
    assert early.take_leading(np.array(first_pieces(ds, 1, 3))) == []
    assert early.pieces == []


def test_early_read_errors_wait_for_the_piece():
    """A failing early read raises only where the next epoch takes that piece."""

    def read(start, stop):
        if start == 16:
            raise OSError("unreachable")
        return {"x": np.full(stop - start, start)}

    pool = ThreadPoolExecutor(1)
    early = EarlyReads(pool.submit, read, np.array([[0, 16], [16, 32]]))
    pool.shutdown(wait=False)
    taken = early.take_leading(np.array([[0, 16], [16, 32], [32, 48]]))
    assert len(taken) == 2 and taken[0].result()["x"][0] == 0
    with pytest.raises(OSError, match="unreachable"):
        taken[1].result()


def test_the_shuffle_buffer_is_reused_between_epochs(store, monkeypatch):
    seen = []
    init = SlotBuffer.__init__

    def record(self, capacity, columns, slots=None):
        init(self, capacity, columns, slots)
        if "x" in self.slots:
            x = self.slots["x"]
            while isinstance(x.base, np.ndarray):
                x = x.base
            seen.append(id(x))

    monkeypatch.setattr(SlotBuffer, "__init__", record)
    loader = ZarrDataLoader(dataset(store), batch_size=8)
    for epoch in range(3):
        epoch_batches(loader, epoch)
    assert len(seen) == 3 and len(set(seen)) == 1


def test_early_reads_stay_within_the_reads_in_flight(store, monkeypatch):
    """Over several epochs a process never holds more decoded pieces than its reads in flight plus the one
    being consumed: each early read is freed once its piece is in the buffer, as any other read."""
    read_piece, live, peak = PieceReader.read_piece, [0], [0]

    def freed():
        live[0] -= 1

    def tracked(self, start, stop):
        out = read_piece(self, start, stop)
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        weakref.finalize(out["x"], freed)
        return out

    take, chunk_buffers = Pool.take, set()

    def tracked_take(self):
        item, lease = take(self)
        if isinstance(item, np.ndarray) and item.shape == (CHUNK, 4):
            chunk_buffers.add(id(item))  # pooled buffers live on: ids are not reused
        return item, lease

    monkeypatch.setattr(PieceReader, "read_piece", tracked)
    monkeypatch.setattr(Pool, "take", tracked_take)
    ds = dataset(store)
    loader = ZarrDataLoader(ds, batch_size=8)
    for epoch in range(4):
        epoch_batches(loader, epoch)
    assert ds._early is not None and ds._early.pieces  # the reads for epoch 4 are under way
    assert 0 < peak[0] <= ds.in_flight(THREADS) + 1
    # nor more chunk buffers in all: a segment copied into the buffer lets its chunk go before the next read
    assert 0 < len(chunk_buffers) <= ds.in_flight(THREADS) + 1
