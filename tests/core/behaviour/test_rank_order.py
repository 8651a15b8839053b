"""``batch_order="rank"``: each rank's batches (rows, in order) depend on the seed, the epoch, the batch size and
the ranks only, never on ``num_workers``: the workers read the pieces of the rank's single stream, the training
process assembles the batches (:mod:`zarrtorch.epoch`). Every guarantee of the default order holds: every row
once, equal batches per rank, a new shuffle every epoch, exact and elastic resume, also onto another worker
count."""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import pytest
import torch

from zarrtorch import ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch.windows import Windows

ROWS, CHUNK, BATCH = 203, 10, 8  # 21 chunks, the last one 3 rows long; a partial last batch per rank


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("rank_order") / "data.zarr"
    x = (4 * np.arange(ROWS, dtype=np.float32)[:, None] + np.arange(4, dtype=np.float32)).reshape(ROWS, 2, 2)
    prepare_zarr({"x": x, "y": 10 * np.arange(ROWS, dtype=np.int64) + 3}, path, chunk_rows=CHUNK, progress=False)
    return path


def dataset(store, windows=None):
    return ZarrIterableDataset(store, seed=5, buffer_chunks=2, return_index=True, windows=windows)


def loader(ds, workers, *, rank=0, world=1, **extra):
    if workers:
        extra.setdefault("multiprocessing_context", "fork")
    return ZarrDataLoader(
        ds, batch_size=BATCH, num_workers=workers, rank=rank, world_size=world, batch_order="rank", **extra
    )


def checked(batch, windows=False) -> np.ndarray:
    """The batch's row ids, after checking that its data are those rows' (window start rows for windows)."""
    index = batch["index"].numpy()
    if windows:
        np.testing.assert_array_equal(batch["x"].numpy()[:, 0, 0, 0], 4 * index)
    else:
        np.testing.assert_array_equal(batch["y"].numpy(), 10 * index + 3)
        np.testing.assert_array_equal(batch["x"].numpy()[:, 0, 0], 4 * index)
    return index


def epoch_batches(dl, epoch, windows=False) -> list[np.ndarray]:
    dl.set_epoch(epoch)
    return [checked(b, windows) for b in dl]


def digest(batches) -> str:
    h = hashlib.sha256()
    for b in batches:
        h.update(np.asarray(b, dtype=np.int64).tobytes() + b"|")
    return h.hexdigest()


def test_rows_batches_hash_equal_for_zero_to_four_workers(store):
    """The sequence of batches of two epochs, rows in order, is the same with 0, 1, 2, 3 and 4 workers, and it is
    the 0-worker sequence of the default order; every row once per epoch, and the second epoch another order."""
    ds = dataset(store)
    runs = {}
    for workers in (0, 1, 2, 3, 4):
        dl = loader(ds, workers)
        runs[workers] = [epoch_batches(dl, e) for e in (0, 1)]
    digests = {w: [digest(e) for e in r] for w, r in runs.items()}
    assert len({tuple(d) for d in digests.values()}) == 1, digests
    default = ZarrDataLoader(ds, batch_size=BATCH, num_workers=0, rank=0, world_size=1)
    assert digest(epoch_batches(default, 0)) == digests[0][0]
    for epoch in runs[0]:
        assert sorted(np.concatenate(epoch).tolist()) == list(range(ROWS))
    assert digests[0][0] != digests[0][1]


def test_window_batches_hash_equal_for_zero_to_three_workers(store):
    """The same for windows of time steps (chunks held for the windows, read by the workers)."""
    ds = dataset(store, Windows(history=2, lead=1, stride=1))
    runs = {workers: epoch_batches(loader(ds, workers), 0, windows=True) for workers in (0, 1, 2, 3)}
    assert len({digest(r) for r in runs.values()}) == 1
    assert sorted(np.concatenate(runs[0]).tolist()) == list(range(ROWS - 2))


@pytest.mark.parametrize("resumed_workers", [3, 0])
def test_a_resume_saved_with_two_workers_continues_the_sequence_on_another_worker_count(store, resumed_workers):
    """A state saved after batch k of an epoch run with 2 workers, loaded by a loader with 3 (or 0): the batches
    after k are those of the uninterrupted run, with their data."""
    ds = dataset(store)
    whole = epoch_batches(loader(ds, 0), 1)
    first = loader(ds, 2)
    first.set_epoch(1)
    it = iter(first)
    taken = [checked(next(it)) for _ in range(5)]
    state = first.state_dict()
    del it
    second = loader(ds, resumed_workers)
    second.load_state_dict(state)
    assert len(second) == len(whole)
    rest = [checked(b) for b in second]
    assert digest(taken + rest) == digest(whole)


def test_windows_resume_on_another_worker_count(store):
    """The same for windows, saved with 2 workers and resumed with 3."""
    ds = dataset(store, Windows(history=2, lead=1, stride=1))
    whole = epoch_batches(loader(ds, 0), 0, windows=True)
    first = loader(ds, 2)
    it = iter(first)
    taken = [checked(next(it), windows=True) for _ in range(4)]
    state = first.state_dict()
    del it
    second = loader(ds, 3)
    second.load_state_dict(state)
    assert digest(taken + [checked(b, windows=True) for b in second]) == digest(whole)


def test_two_ranks_each_get_their_sequence_whatever_the_workers(store):
    """With 2 ranks, each rank's sequence is the same with 0 and 2 workers; together every row once, with equal
    batch counts on both ranks."""
    ds = dataset(store)
    runs = {w: [epoch_batches(loader(ds, w, rank=r, world=2), 0) for r in (0, 1)] for w in (0, 2)}
    for rank in (0, 1):
        assert digest(runs[0][rank]) == digest(runs[2][rank])
    assert len(runs[0][0]) == len(runs[0][1])
    rows = np.concatenate(runs[0][0] + runs[0][1])
    assert len(rows) - ROWS < 2 and set(rows.tolist()) == set(range(ROWS))


def test_persistent_workers_keep_the_sequence_across_epochs(store):
    """Persistent workers read every epoch's pieces again from the published epoch."""
    ds = dataset(store)
    plain = loader(ds, 0)
    kept = loader(ds, 2, persistent_workers=True)
    for epoch in (0, 1):
        assert digest(epoch_batches(kept, epoch)) == digest(epoch_batches(plain, epoch))


def test_a_checkpoint_says_the_order_not_the_workers(store):
    """A state saved with any number of workers is that of the rank's one stream (``num_workers`` 0): the same
    state, whatever ran it."""
    ds = dataset(store)
    states = []
    for workers in (0, 2):
        dl = loader(ds, workers)
        it = iter(dl)
        next(it)
        states.append(dl.state_dict())
        del it
    assert states[0] == states[1]
    assert states[0]["num_workers"] == 0


def test_transform_and_packing_run_once_per_batch_in_the_training_process(store):
    """The dataset's transform runs on the assembled batch (one call per batch, whatever the workers)."""
    calls = []

    def transform(batch):
        calls.append(len(batch["index"]))
        return {**batch, "y2": batch["y"] * 2}

    ds = ZarrIterableDataset(store, seed=5, buffer_chunks=2, return_index=True, transform=transform)
    batches = list(loader(ds, 2, work_ahead=0))
    assert len(calls) == len(batches)
    for b in batches:
        torch.testing.assert_close(b["y2"], 2 * b["y"])


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(batch_order="worker_count"), "batch_order must be"),
        (dict(batch_order="rank", transport="ring"), "transport='ring'"),
    ],
)
def test_unsupported_combinations_are_refused_at_construction(store, settings, message):
    with pytest.raises(ValueError, match=message):
        ZarrDataLoader(dataset(store), batch_size=BATCH, num_workers=2, **settings)


def test_keep_in_memory_with_workers_is_refused_at_construction(store):
    ds = ZarrIterableDataset(store, keep_in_memory=True)
    with pytest.raises(ValueError, match="keep_in_memory=True with batch_order='rank'"):
        ZarrDataLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True, batch_order="rank")
    ZarrDataLoader(ds, batch_size=BATCH, num_workers=0, batch_order="rank")  # one process: nothing to refuse


def test_a_worker_forked_while_another_thread_computes_a_plans_pieces_does_not_deadlock():
    """With batch_order="rank" the work-ahead thread of one loader computes its plan's pieces while the next
    loader forks its workers (a job of several ranks' loaders in one process: the model test hung there). A
    ``functools.cached_property`` on Python 3.11 holds one lock per class while it computes, so a worker forked
    meanwhile inherited it held by a thread it does not have, and hung on its first plan. A plan's row ranges are
    computed without a lock (two threads may both compute them: the same pure function)."""
    import multiprocessing
    import threading
    from functools import partial

    from zarrtorch.plan import WorkerPlan

    inside, release = threading.Event(), threading.Event()

    def slow_source():
        inside.set()
        release.wait()
        return np.zeros((0, 2), np.int64)

    def plan(source):
        return WorkerPlan(worker=0, first_batch=0, batch_sizes=np.zeros(0, np.int64), source=source)

    computing = threading.Thread(target=lambda: plan(slow_source).pieces, daemon=True)
    computing.start()
    assert inside.wait(60)
    try:
        other = plan(partial(np.ones, (1, 2), np.int64))
        child = multiprocessing.get_context("fork").Process(target=lambda: sys.exit(int(other.pieces.sum()) != 2))
        child.start()
        child.join(60)
        hung = child.exitcode is None
        if hung:
            child.kill()
            child.join()
        assert not hung, "the forked process hung computing a plan's pieces"
        assert child.exitcode == 0
    finally:
        release.set()
        computing.join()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_damaged_chunk_is_an_error_naming_it_whatever_reads_it(tmp_path, workers):
    """The pieces of ``batch_order="rank"`` are decoded in the workers and assembled in the training process: a chunk
    cut short and with a flipped byte still ends the epoch at once with a ChunkReadError naming its key, never a
    batch built around it or a training process waiting for a piece that will not come."""
    from zarrtorch import ChunkReadError

    path = tmp_path / "s.zarr"
    prepare_zarr({"x": np.random.default_rng(0).normal(size=(300, 64)).astype(np.float32)}, path, chunk_rows=16)
    chunk = path / "x" / "c" / "13" / "0"
    damaged = bytearray(chunk.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    chunk.write_bytes(bytes(damaged[:-7]))
    dl = ZarrDataLoader(ZarrIterableDataset(path, seed=3), batch_size=8, num_workers=workers, batch_order="rank")
    with pytest.raises(ChunkReadError, match="x/c/13/0"):
        for _ in dl:
            pass


@pytest.mark.parametrize(
    ("workers", "prefetch", "persistent"), [(1, 1, False), (2, 1, True), (3, 2, True)], ids=["1w", "2w-kept", "3w-kept"]
)
def test_pieces_through_the_reused_slots_give_the_zero_worker_batches_every_epoch(
    store, monkeypatch, workers, prefetch, persistent
):
    """The workers' pieces travel through a ring of shared-memory slots reused every epoch: over several epochs,
    with few slots per worker (``prefetch_factor`` 1) that the pieces cycle many times, the batches are row for
    row those of no worker (a slot written again before its rows were copied would give a wrong batch)."""
    from zarrtorch._workers.dealt import DealtPieces

    in_slots = []
    through_slot = DealtPieces._slot
    monkeypatch.setattr(DealtPieces, "_slot", lambda self, *a: in_slots.append(a) or through_slot(self, *a))
    ds = dataset(store)
    plain = loader(ds, 0)
    ringed = loader(ds, workers, prefetch_factor=prefetch, persistent_workers=persistent)
    for epoch in range(3):
        assert digest(epoch_batches(ringed, epoch)) == digest(epoch_batches(plain, epoch))
    assert len(in_slots) > 2 * 21  # most of the 21 pieces of each epoch came through a slot


def test_a_worker_killed_mid_epoch_ends_it_with_an_error_naming_it(store):
    """A worker killed while the training process assembles from its pieces (some in slots, some on their way)
    ends the epoch with an error naming its pid, never a hang (the loader's timeout bounds any wait: a hang would
    be a timeout error, not this one), and the next epoch gives the 0-worker batches again."""
    import os
    import signal

    ds = dataset(store)
    dl = loader(ds, 2, timeout=60, work_ahead=0)
    dl.set_epoch(0)
    it = iter(dl)
    next(it)
    victim = it.workers[1].pid
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=rf"DataLoader worker \(pid\(?s?\)? ?{victim}\)?.*(killed|exited)"):
        for _ in it:
            pass
    del it
    assert digest(epoch_batches(dl, 1)) == digest(epoch_batches(loader(ds, 0), 1))


def test_a_batch_spanning_more_pieces_than_the_ring_has_slots_is_still_the_zero_worker_one(tmp_path):
    """Unshuffled rows go straight from the pieces into a batch: a batch of 2-row chunks takes rows from more pieces
    than a worker has slots, all held until the batch is formed, while the workers write on (their next pieces go
    through the queue, never into a slot still held)."""
    path = tmp_path / "small_chunks.zarr"
    prepare_zarr({"y": 10 * np.arange(90, dtype=np.int64) + 3}, path, chunk_rows=2, progress=False)
    ds = ZarrIterableDataset(path, shuffle=False, return_index=True)
    runs = []
    for workers in (0, 2):
        extra = {"prefetch_factor": 1, "multiprocessing_context": "fork"} if workers else {}
        dl = ZarrDataLoader(ds, batch_size=24, num_workers=workers, batch_order="rank", **extra)
        runs.append([b["y"].numpy().copy() for epoch in (0, 1) for b in (dl.set_epoch(epoch) or dl)])
    assert digest(runs[1]) == digest(runs[0])
    np.testing.assert_array_equal(np.concatenate(runs[0]), np.tile(10 * np.arange(90) + 3, 2))


def test_persistent_workers_read_the_next_epochs_first_pieces_as_an_epoch_ends(store, monkeypatch):
    """As in the default order, a persistent worker starts reading its turn of the next epoch's pieces once it
    has read its last one of this epoch (the next epoch found them read or under way: before, it started cold,
    0.42x the default order's rate in a second epoch); the batches stay those of no worker."""
    import multiprocessing

    import zarrtorch.epoch
    from zarrtorch import ReadOptions
    from zarrtorch._read.early import EarlyReads

    taken = multiprocessing.get_context("fork").Value("i", 0)  # early reads the workers' next epochs took
    started = getattr(zarrtorch.epoch, "_read_next_dealt_early", None)
    take_leading = EarlyReads.take_leading

    def mark(*args):  # reads started as an epoch ends, not those an epoch starts for itself
        early = started(*args)
        early.by_last_epoch = True
        return early

    def counted(self, pieces):
        reads = take_leading(self, pieces)
        if getattr(self, "by_last_epoch", False):
            with taken.get_lock():
                taken.value += len(reads)
        return reads

    monkeypatch.setattr(zarrtorch.epoch, "_read_next_dealt_early", mark, raising=False)
    monkeypatch.setattr(EarlyReads, "take_leading", counted)
    ds = ZarrIterableDataset(store, seed=5, buffer_chunks=2, return_index=True, read=ReadOptions(decode_threads=2))
    kept = loader(ds, 2, persistent_workers=True)
    for epoch in range(3):
        assert digest(epoch_batches(kept, epoch)) == digest(epoch_batches(loader(ds, 0), epoch))
    assert taken.value > 0
