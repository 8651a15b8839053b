"""Reading the next epoch's first pieces as an epoch ends (zarrtorch._read.early), and the shuffle buffer's
arrays kept between epochs: the next epoch's batches must be exactly a fresh start's, whatever epoch comes."""

from __future__ import annotations

import os
import pickle
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

import zarrtorch._read.cache as cache_module
import zarrtorch._util.pool
import zarrtorch._util.sizes
import zarrtorch.epoch
from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch._read.cache import ChunkCache, wait_for_writes
from zarrtorch._read.chunks import chunk_key
from zarrtorch._read.early import EarlyReads
from zarrtorch._read.reader import PieceReader
from zarrtorch._util.pool import Pool
from zarrtorch.buffer import SlotBuffer
from zarrtorch.course.servers import HttpStoreServer
from zarrtorch.plan import Topology

CHUNK, CHUNKS, THREADS = 16, 12, 2
USED: list[int] = []  # reads taken from those the last epoch started (in the buffer, in flight), in this process


@pytest.fixture(autouse=True)
def one_piece_per_read(monkeypatch):
    """These tests follow the reads piece by piece: the store's tiny chunks would otherwise be read many to a
    task (``pieces_per_read``, tested in test_reader.py), a whole epoch in one."""
    monkeypatch.setattr(zarrtorch._util.sizes, "MOST_PIECES_PER_READ", 1)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rows = CHUNK * CHUNKS - 3
    path = tmp_path_factory.mktemp("early") / "d.zarr"
    prepare_zarr({"x": np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)}, path, chunk_rows=CHUNK, progress=False)
    return str(path)


@pytest.fixture()
def recorded(monkeypatch):
    read_piece, take_leading, take_staged = PieceReader.read_piece, EarlyReads.take_leading, EarlyReads.take_staged
    started = zarrtorch.epoch._read_next_epoch_early
    reads: list[tuple[int, int]] = []  # this test's: an earlier test's early reads may still finish now

    def record(self, start, stop, **kw):
        reads.append((int(start), int(stop)))
        return read_piece(self, start, stop, **kw)

    def mark(*args):  # reads an epoch starts as it ends, not those an epoch starts for itself
        early = started(*args)
        early.by_last_epoch = True
        return early

    def record_staged(self, pieces):
        slots, k = take_staged(self, pieces)
        if getattr(self, "by_last_epoch", False):
            USED.append(k)
        return slots, k

    def record_taken(self, pieces):
        taken = take_leading(self, pieces)
        if getattr(self, "by_last_epoch", False):
            USED.append(len(taken))
        return taken

    monkeypatch.setattr(zarrtorch.epoch, "_read_next_epoch_early", mark)
    monkeypatch.setattr(PieceReader, "read_piece", record)
    monkeypatch.setattr(EarlyReads, "take_leading", record_taken)
    monkeypatch.setattr(EarlyReads, "take_staged", record_staged)
    USED.clear()
    return reads


def dataset(store, **kw):
    return ZarrIterableDataset(
        store, **{"buffer_chunks": 3, **kw}, return_index=True, read=ReadOptions(decode_threads=THREADS)
    )


def epoch_batches(loader, epoch, step_s=0.0):
    """One epoch's batches; ``step_s``: a pause after each, as a training step (the reads finish meanwhile)."""
    loader.set_epoch(epoch)
    out = []
    for b in loader:
        out.append({k: v.clone() for k, v in b.items()})
        time.sleep(step_s)
    return out


def fresh_batches(store, epoch, ds_kw=None, **loader_kw):
    return epoch_batches(ZarrDataLoader(dataset(store, **(ds_kw or {})), batch_size=8, **loader_kw), epoch)


def assert_same(got, want):
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def first_pieces(loader, epoch, n):
    """The first ``n`` pieces of worker 0's share of ``epoch``."""
    plan = loader.spec.plan(epoch, Topology(0, 1, loader.num_workers))
    return [tuple(int(v) for v in p) for p in plan.workers[0].pieces[:n]]


def early_of(loader):
    """The next epoch's reads the loader's process started (in the training process: no workers)."""
    return loader.dataset.process_state().early


def ahead_of(loader) -> int:
    """Chunks a reading process of the loader keeps read ahead."""
    return loader.job.read_plan.chunks_ahead


def wait_for_early_reads(loader):
    for _, read in early_of(loader)._reads:
        read.result()


def test_the_next_epoch_starts_from_reads_made_as_this_one_ended(store, recorded):
    """The reads started as epoch 0 ends are epoch 1's first pieces, in order: first those copied into the
    draining buffer (more than the reads in flight: the buffer's rows that epoch 0 no longer needed), then
    the reads in flight. Epoch 1 reads only the pieces after them, and yields a fresh start's batches."""
    ds = dataset(store)
    loader = ZarrDataLoader(ds, batch_size=8)
    epoch_batches(loader, 0, step_s=0.02)  # a step long enough for every early read to finish
    ahead = ahead_of(loader)
    early = early_of(loader).pieces
    assert early == first_pieces(loader, 1, len(early))
    staged_rows = sum(b - a for a, b in early_of(loader)._staged)
    assert ahead < len(early) <= len(early_of(loader)._staged) + ahead and 0 < staged_rows <= loader.data.buffer_rows
    wait_for_early_reads(loader)
    assert sorted(recorded[-len(early) :]) == sorted(early)  # read after all of epoch 0's

    recorded.clear()
    got = epoch_batches(loader, 1)
    assert sum(USED) == len(early)
    assert recorded[: CHUNKS - len(early)] == first_pieces(loader, 1, CHUNKS)[len(early) :]  # none twice or skipped
    assert_same(got, fresh_batches(store, 1))


def test_an_unexpected_next_epoch_reads_everything_itself(store, recorded):
    """After epoch 0 the early reads are for epoch 1; another epoch that starts with another piece drops them
    and reads all its pieces, with the batches of a fresh start."""
    ds = dataset(store)
    loader = ZarrDataLoader(ds, batch_size=8)
    epoch_batches(loader, 0)
    other = next(e for e in range(2, 50) if first_pieces(loader, e, 1) != first_pieces(loader, 1, 1))
    wait_for_early_reads(loader)
    recorded.clear()
    got = epoch_batches(loader, other)
    assert sum(USED) == 0
    assert recorded[:CHUNKS] == first_pieces(loader, other, CHUNKS)
    assert_same(got, fresh_batches(store, other))


def early_reads_used_here(batch):
    """A transform, run in the worker: how many reads this process's epochs took from early ones so far."""
    return {**batch, "early": torch.tensor(sum(USED))}


@pytest.mark.parametrize("persistent", [True, False])
def test_workers_read_early_only_when_they_live_on(store, recorded, persistent):
    """Persistent workers read the next epoch's first pieces as the epoch ends, and yield a fresh start's
    batches; workers that exit with the epoch read nothing early."""
    ds = dataset(store, transform=early_reads_used_here)
    loader = ZarrDataLoader(
        ds, batch_size=8, num_workers=2, persistent_workers=persistent, multiprocessing_context="fork"
    )
    for epoch in range(3):
        got = epoch_batches(loader, epoch, step_s=0.01)
        early = [int(b.pop("early")) for b in got]
        assert min(early) > 0 if persistent and epoch > 0 else set(early) == {0}
        assert_same(got, fresh_batches(store, epoch, num_workers=2))


def test_early_reads_belong_to_one_process(store):
    """A pickled copy (a spawned worker's dataset) or a forked one has no early reads: their threads are not
    there, so nothing of them is waited on or touched."""
    ds = dataset(store)
    loader = ZarrDataLoader(ds, batch_size=8)
    epoch_batches(loader, 0)
    assert early_of(loader) is not None and early_of(loader).pieces
    copy = pickle.loads(pickle.dumps(loader.dataset))  # what a spawned worker gets
    assert copy.process_state().early is None
    early = early_of(loader)
    early._pid = os.getpid() + 1  # as in a forked child
    assert early.take_staged(np.array(first_pieces(loader, 1, 3))) == (None, 0)
    assert early.take_leading(np.array(first_pieces(loader, 1, 3))) == []
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


@pytest.fixture()
def buffer_arrays(monkeypatch):
    """The id of the array under each shuffle buffer's data column, one per buffer made."""
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
    return seen


@pytest.mark.parametrize("unexpected", [False, True])
def test_the_shuffle_buffer_is_reused_between_epochs(store, buffer_arrays, unexpected):
    """One buffer for every epoch, whether the next epoch finds its first rows in it or not."""
    ds = dataset(store)
    loader = ZarrDataLoader(ds, batch_size=8)
    epochs = (
        [0, next(e for e in range(2, 50) if first_pieces(loader, e, 1) != first_pieces(loader, 1, 1))]
        if unexpected
        else [0, 1, 2]
    )
    for epoch in epochs:
        epoch_batches(loader, epoch, step_s=0.005)
    assert len(buffer_arrays) == len(epochs) and len(set(buffer_arrays)) == 1


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
    monkeypatch.setattr(zarrtorch._util.pool, "POOLED_CHUNK_BYTES", 0)  # these small chunks pooled too
    ds = dataset(store)
    loader = ZarrDataLoader(ds, batch_size=8)
    for epoch in range(4):
        epoch_batches(loader, epoch, step_s=0.005)  # early reads copied into the draining buffer
        assert epoch == 0 or early_of(loader)._staged
    assert early_of(loader) is not None and early_of(loader).pieces  # the reads for epoch 4 are under way
    assert 0 < peak[0] <= ahead_of(loader) + 1
    # nor more chunk buffers in all: a segment copied into the buffer lets its chunk go before the next read
    assert 0 < len(chunk_buffers) <= ahead_of(loader) + 1


def synchronous(fn, *args):
    """A ``submit`` that reads at once (a finished future, or a failed one)."""
    done = Future()
    try:
        done.set_result(fn(*args))
    except Exception as exc:
        done.set_exception(exc)
    return done


PIECES = np.array([[0, 16], [16, 32], [32, 48], [48, 64]])


def rows_of(start, stop):
    if start == 999:
        raise OSError("unreachable")
    return {"x": np.arange(start, stop, dtype=np.float32)}


def test_finished_reads_are_copied_into_the_rows_the_buffer_no_longer_needs():
    """Reads go into the buffer's end, the next epoch's first row last, as far as ``free_rows`` allows;
    each one copied starts the next read, so no more than ``in_flight`` are held as chunks."""
    early = EarlyReads(synchronous, rows_of, PIECES, in_flight=2)
    slots = {"index": np.zeros(40, np.int64), "x": np.full(40, -1, np.float32)}
    early.stage(slots, free_rows=10)
    assert early._staged == [] and len(early._reads) == 2  # no piece fits in 10 rows
    early.stage(slots, free_rows=40)
    assert early._staged == [(0, 16), (16, 32)] and [p for p, _ in early._reads] == [(32, 48), (48, 64)]
    assert early.pieces == [tuple(p) for p in PIECES.tolist()]
    np.testing.assert_array_equal(slots["x"][::-1][:32], np.arange(32))
    np.testing.assert_array_equal(slots["x"][:8], -1)  # the rows still in use are untouched

    taken, k = early.take_staged(PIECES)
    assert k == 2 and taken["x"].strides[0] < 0  # the next epoch reads the arrays the other way round
    np.testing.assert_array_equal(taken["x"][:32], np.arange(32))
    assert [f.result()["x"][0] for f in early.take_leading(PIECES[k:])] == [32, 48]


def test_staged_reads_are_used_only_by_an_epoch_starting_with_them():
    early = EarlyReads(synchronous, rows_of, PIECES, in_flight=2)
    early.stage({"index": np.zeros(64, np.int64), "x": np.zeros(64, np.float32)}, free_rows=64)
    assert early.take_staged(PIECES[[0, 2, 1, 3]]) == (None, 0)
    assert early.take_staged(PIECES) == (None, 0)  # once only


def test_a_failed_early_read_is_not_copied_and_raises_where_it_is_taken():
    pieces = np.array([[0, 16], [999, 1015], [1015, 1031]])
    early = EarlyReads(synchronous, rows_of, pieces, in_flight=2)
    early.stage({"index": np.zeros(64, np.int64), "x": np.zeros(64, np.float32)}, free_rows=64)
    assert early._staged == [(0, 16)]
    _, k = early.take_staged(pieces)
    taken = early.take_leading(pieces[k:])
    with pytest.raises(OSError, match="unreachable"):
        taken[0].result()


def test_a_share_that_ends_while_the_buffer_fills(tmp_path, recorded):
    """A worker's last piece can come in while its buffer still fills: the next epoch's rows copied early
    must stay clear of the rows this epoch has yet to append. Here 3 chunks of 64 rows, a buffer of 4: the
    third chunk comes in at the second batch, the third batch appends the rest of it."""
    path = tmp_path / "short.zarr"
    prepare_zarr({"x": np.arange(192 * 4, dtype=np.float32).reshape(192, 4)}, path, chunk_rows=64, progress=False)
    kw = {"buffer_chunks": 4}
    loader = ZarrDataLoader(dataset(str(path), **kw), batch_size=8, work_ahead=0)  # runs as the step asks
    for epoch in range(3):
        got = epoch_batches(loader, epoch, step_s=0.02)  # the reads are done before the next batch
        assert_same(got, fresh_batches(str(path), epoch, kw))
    assert sum(USED) >= 2 * 3  # every early read was used (in a buffer or in flight)


def test_a_resumed_epoch_drops_the_rows_copied_early(store, recorded):
    """Resuming mid-epoch rebuilds the buffer from the saved position: the rows copied for a fresh start
    of that epoch are not used, and the rest of the epoch is exactly the saved run's."""
    whole = ZarrDataLoader(dataset(store), batch_size=8)
    whole.set_epoch(1)
    it = iter(whole)
    for _ in range(3):
        next(it)
    state = whole.state_dict()
    want = [{k: v.clone() for k, v in b.items()} for b in it]

    loader = ZarrDataLoader(dataset(store), batch_size=8)
    epoch_batches(loader, 0, step_s=0.005)
    assert early_of(loader)._staged
    loader.load_state_dict(state)
    got = [{k: v.clone() for k, v in b.items()} for b in loader]
    assert_same(got, want)


def test_copying_never_waits_for_a_read():
    early = EarlyReads(lambda fn, *args: Future(), rows_of, PIECES, in_flight=2)  # reads that never finish
    early.stage({"index": np.zeros(64, np.int64), "x": np.zeros(64, np.float32)}, free_rows=64)
    assert early._staged == [] and len(early._reads) == 2


def test_an_epoch_starts_reading_when_its_iterator_is_made(store, recorded):
    """A DataLoader worker makes its iterator as it starts, before the first index reaches it: the first
    reads start then, not at the first batch, and are not read again."""
    ds = dataset(store)
    loader = ZarrDataLoader(ds, batch_size=8, work_ahead=0)  # nothing reads until a batch is asked for
    loader.set_epoch(0)
    it = iter(loader)
    ahead = ahead_of(loader)
    deadline = time.monotonic() + 10
    while len(recorded) < ahead and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(recorded) == sorted(first_pieces(loader, 0, ahead))
    got = [{k: v.clone() for k, v in b.items()} for b in it]
    assert sorted(recorded[:CHUNKS]) == sorted(first_pieces(loader, 0, CHUNKS))  # each once (then epoch 1's start)
    assert_same(got, fresh_batches(store, 0))


def chunk_requests(server) -> int:
    """Requests for chunks (not metadata) the server answered since it was last reset."""
    return sum(n for key, n in server.requests.items() if "/c/" in key)


def cached_dataset(url, cache_dir):
    """:func:`dataset` of the store at ``url``, read through the node's chunk cache at ``cache_dir``."""
    read = ReadOptions(decode_threads=THREADS, cache_dir=cache_dir)
    return ZarrIterableDataset(url, buffer_chunks=3, return_index=True, read=read)


def test_a_warm_epoch_of_the_chunk_cache_starts_from_reads_of_its_files_made_as_the_last_one_ended(
    store, recorded, tmp_path
):
    """Warm epochs from the node's chunk cache started with no piece read: early reads were for local stores only
    (on object storage an early read is a request), so each warm epoch's first pieces waited for their files
    (3-19 ms per worker and epoch with 2 workers, against 0.1 ms from the local disk, whose next epoch was read
    early: part of the warm epochs' 0.75x the local disk's rate, issue 44). The pieces the epoch's listing holds
    are read early from the cache's files, as a local store's: no request is made before the next epoch, and
    its batches are a fresh start's."""
    with HttpStoreServer(Path(store).parent) as server:
        loader = ZarrDataLoader(cached_dataset(f"{server.url}/{Path(store).name}", tmp_path / "cache"), batch_size=8)
        epoch_batches(loader, 0)  # the cold epoch fills the cache
        wait_for_writes()
        server.requests.clear()
        epoch_batches(loader, 1, step_s=0.02)  # warm; as it ends, epoch 2's first pieces are read from the files
        wait_for_early_reads(loader)
        assert chunk_requests(server) == 0, server.requests  # neither epoch 1 nor the early reads asked for one
        early = early_of(loader).pieces
        assert len(early) > 1 and early == first_pieces(loader, 2, len(early))
        USED.clear()
        got = epoch_batches(loader, 2)
        assert sum(USED) == len(early) and chunk_requests(server) == 0
    assert_same(got, fresh_batches(store, 2))


def test_the_cold_epoch_of_the_chunk_cache_ends_reading_the_next_epochs_first_pieces_from_the_files_it_wrote(
    store, recorded, tmp_path, monkeypatch
):
    """The epoch that filled the node's chunk cache read none of the next epoch's pieces early: its listing, made
    at its start, held nothing, and the packs it wrote meanwhile were neither listed nor waiting to be written, so
    the early reads stopped at the first piece (epoch 2 of benchmarks/cache.py started cold, issue 44). The
    listing is made again as the epoch ends: the next epoch's first pieces are read early from the files this
    epoch wrote, with no request to the store, and its batches are a fresh start's. (Packs of one chunk, so that
    each is written during the epoch, as most of a store's are: 16 chunks a pack, 12 chunks here.)"""
    monkeypatch.setattr(cache_module, "PACK_CHUNKS", 1)
    with HttpStoreServer(Path(store).parent) as server:
        loader = ZarrDataLoader(cached_dataset(f"{server.url}/{Path(store).name}", tmp_path / "cache"), batch_size=8)
        server.requests.clear()  # the first chunk's first bytes were read for the cache's store id
        epoch_batches(loader, 0, step_s=0.02)  # cold: fills the cache; as it ends, epoch 1's first pieces are read
        wait_for_early_reads(loader)
        assert chunk_requests(server) == CHUNKS, server.requests  # each chunk once, none again for the early reads
        early = early_of(loader).pieces
        assert len(early) > 1 and early == first_pieces(loader, 1, len(early))
        server.requests.clear()
        USED.clear()
        got = epoch_batches(loader, 1)
        assert sum(USED) == len(early) and chunk_requests(server) == 0
    assert_same(got, fresh_batches(store, 1))


def test_the_pieces_read_early_from_the_chunk_cache_stop_at_the_first_it_did_not_list(store, tmp_path, monkeypatch):
    """A piece whose chunk the epoch's listing of the cache does not hold would be a request to the store, which
    the last epoch makes for nothing if another epoch comes: the next epoch's pieces read early end before it.
    (A pack of one chunk each, so that one chunk can be taken out of the cache by deleting its pack.)"""
    monkeypatch.setattr(cache_module, "PACK_CHUNKS", 1)
    with HttpStoreServer(Path(store).parent) as server:
        ds = cached_dataset(f"{server.url}/{Path(store).name}", tmp_path / "cache")
        loader = ZarrDataLoader(ds, batch_size=8)
        epoch_batches(loader, 0)
        wait_for_writes()
        pieces = np.array(first_pieces(loader, 1, CHUNKS))
        x = ds.arrays["x"]
        cache, store_id = ChunkCache(tmp_path / "cache"), x.store_path.store.store_id
        cache.pack_path(store_id, cache.where(store_id, chunk_key(x, pieces[2][0] // CHUNK))[0]).unlink()
        reader = PieceReader(ds.arrays, CHUNK, threads=THREADS, prefetch=4)
        reader._list_cached(pieces)
        lead, read = reader.early_reads(pieces)
        assert lead.tolist() == pieces[:2].tolist() and read == reader.read_held_piece
        server.requests.clear()
        assert [int(read(a, b)["x"][0, 0]) for a, b in lead] == [a * 4 for a, _ in lead]
        assert chunk_requests(server) == 0
