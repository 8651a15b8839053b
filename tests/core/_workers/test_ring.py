"""Batches through preallocated shared-memory slots (zarrtorch._workers.ring): the same batches as DataLoader's
queue for every start method, persistent or not, across epochs and early breaks, kept or dropped; a slot
held exactly as long as its batch is referenced; a worker that finds no free slot sends through the queue."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zarrtorch import ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch._workers.ring import FREE, HELD, BatchRing, RingShape

ROWS, CHUNK, BATCH = 203, 16, 8


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("ring") / "r.zarr"
    x = np.arange(ROWS * 6, dtype=np.float32).reshape(ROWS, 2, 3)
    prepare_zarr({"x": x, "y": np.arange(ROWS) * 5}, path, chunk_rows=CHUNK, progress=False)
    return path


def epochs(loader, n=2, copy=False):
    out = []
    for e in range(n):
        loader.set_epoch(e)
        out.append([{k: v.clone() if copy else v for k, v in b.items()} for b in loader])
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for ea, eb in zip(a, b, strict=True):
        assert len(ea) == len(eb)
        for ba, bb in zip(ea, eb, strict=True):
            assert ba.keys() == bb.keys()
            for k in ba:
                assert ba[k].dtype == bb[k].dtype
                np.testing.assert_array_equal(ba[k].numpy(), bb[k].numpy())


@pytest.mark.slow
@pytest.mark.parametrize("context,persistent", [("fork", False), ("fork", True), ("spawn", True)])
def test_ring_gives_the_queues_batches_kept_or_not(store, context, persistent):
    """The ring is the default with workers. ``list(loader)`` keeps every batch (more than the ring has
    slots): the held slots are never overwritten, the rest of the batches come through the queue."""
    ds = ZarrIterableDataset(store, seed=1, buffer_chunks=2, return_index=True)
    kw = dict(batch_size=BATCH, num_workers=2, multiprocessing_context=context, persistent_workers=persistent)
    queue_loader = ZarrDataLoader(ds, transport="queue", **kw)
    assert queue_loader.job.ring is None
    via_queue = epochs(queue_loader)
    ring_loader = ZarrDataLoader(ds, **kw)
    assert ring_loader.job.ring is not None
    assert len(via_queue[0]) > 2 * ring_loader.job.ring.shape.slots  # more batches than slots
    kept = epochs(ring_loader)  # every batch kept, no copy
    assert_same(kept, via_queue)
    assert_same(epochs(ring_loader, copy=True), via_queue)  # each batch dropped after its copy
    for epoch in kept:  # the batches are intact rows, paired
        for b in epoch:
            np.testing.assert_array_equal(b["y"].numpy(), b["index"].numpy() * 5)
            np.testing.assert_array_equal(b["x"].numpy()[:, 0, 0], b["index"].numpy() * 6)


def test_ring_batches_used_one_at_a_time_without_index(store):
    ds = ZarrIterableDataset(store, seed=2, buffer_chunks=2)
    loader = ZarrDataLoader(ds, batch_size=BATCH, num_workers=2, multiprocessing_context="fork", transport="ring")
    planned = ds.batch_row_ids(epoch=0, num_workers=2, batch_size=BATCH, drop_last=False)
    n = 0
    for b, rows in zip(loader, planned, strict=True):  # a training loop: each batch used, then dropped
        assert set(b) == {"x", "y"}
        np.testing.assert_array_equal(b["y"].numpy(), rows * 5)
        n += 1
    assert n == len(planned)


@pytest.mark.slow
def test_early_breaks_with_persistent_workers_leak_no_slot(store):
    ds = ZarrIterableDataset(store, seed=3, buffer_chunks=2, return_index=True)
    loader = ZarrDataLoader(
        ds, batch_size=BATCH, num_workers=2, persistent_workers=True, multiprocessing_context="fork", transport="ring"
    )
    for epoch in range(6):  # more epochs than slots: leaked slots would run the workers out of them
        loader.set_epoch(epoch)
        for i, _ in enumerate(loader):
            if i == 3:
                break
    loader.set_epoch(6)
    got = [b["index"].clone() for b in loader]
    planned = ds.batch_row_ids(epoch=6, num_workers=2, batch_size=BATCH, drop_last=False)
    assert len(got) == len(planned)
    for b, rows in zip(got, planned, strict=True):
        np.testing.assert_array_equal(b.numpy(), rows)


def _slot_of(ring: BatchRing, column: torch.Tensor) -> tuple[int, int] | None:
    """(worker, slot) of a batch the ring handed out, from where its memory lies; ``None`` if elsewhere."""
    base = ring.data["index"]
    k, rest = divmod(column.data_ptr() - base.data_ptr(), base.shape[2] * base.element_size())
    if rest or not 0 <= k < base.shape[0] * base.shape[1]:
        return None
    return divmod(int(k), base.shape[1])


@pytest.mark.parametrize("ahead", [0, 2])
def test_a_slot_stays_held_while_anything_references_its_batch(store, ahead):
    """A view of one column, or its .numpy(), keeps the slot; the last reference freed returns it."""
    ds = ZarrIterableDataset(store, seed=4, buffer_chunks=2, return_index=True)
    loader = ZarrDataLoader(ds, batch_size=BATCH, num_workers=1, work_ahead=ahead)
    planned = ds.batch_row_ids(epoch=0, num_workers=1, batch_size=BATCH, drop_last=False)
    it = iter(loader)
    first = next(it)
    ring = loader.job.ring
    slot = _slot_of(ring, first["index"])
    assert slot is not None and int(ring.busy[slot]) == HELD
    part, rows = first["x"][2:, 1], first["index"].numpy()  # a view of one column, an array of another
    snapshot = part.clone()
    del first
    got = [next(it)["index"].clone() for _ in range(len(planned) - 1)]  # the worker runs through its ring
    assert int(ring.busy[slot]) == HELD
    np.testing.assert_array_equal(part.numpy(), snapshot.numpy())
    np.testing.assert_array_equal(rows, planned[0])
    for b, want in zip(got, planned[1:], strict=True):
        np.testing.assert_array_equal(b.numpy(), want)
    del part
    assert int(ring.busy[slot]) == HELD  # the index array still references it
    del rows
    assert int(ring.busy[slot]) == FREE
    del it


def test_a_worker_without_free_slots_sends_through_the_queue():
    ring = BatchRing(RingShape(workers=1, slots=2, batch_size=4, columns=(("x", (3,), "float32"),)))
    ring.start_epoch()
    writer = ring.writer(0)
    assert writer.out(4) is not None and writer.out(4) is not None
    assert writer.out(4) is None  # both held: this batch is sent itself
    batch = {"x": np.ones((4, 3), np.float32)}
    assert writer.send(batch, to_torch=lambda b: ("itself", b)) == ("itself", batch)
    ring.start_epoch()  # written, never received: free for the next epoch
    assert ring.writer(0).out(4) is not None


def test_starting_an_epoch_stops_the_workers_of_an_earlier_one(store):
    """Workers of an unfinished epoch whose iterator is still referenced would write into the slots of the
    next epoch's workers."""
    ds = ZarrIterableDataset(store, seed=5, buffer_chunks=2, return_index=True)
    loader = ZarrDataLoader(ds, batch_size=BATCH, num_workers=2, multiprocessing_context="fork")
    old = iter(loader)
    next(old)
    old_workers = old.workers
    loader.set_epoch(1)
    got = [b["index"].clone() for b in loader]
    assert all(not w.is_alive() for w in old_workers)
    planned = ds.batch_row_ids(epoch=1, num_workers=2, batch_size=BATCH, drop_last=False)
    for b, rows in zip(got, planned, strict=True):
        np.testing.assert_array_equal(b.numpy(), rows)


def test_no_ring_where_a_batch_changes_after_gathering(store):
    plain = ZarrIterableDataset(store)
    assert ZarrDataLoader(plain, batch_size=4, num_workers=0).job.ring is None  # no workers
    assert ZarrDataLoader(plain, batch_size=4, num_workers=1, transport="queue").job.ring is None
    with_transform = ZarrIterableDataset(store, transform=dict)
    assert ZarrDataLoader(with_transform, batch_size=4, num_workers=1).job.ring is None  # the loader's choice
    with pytest.raises(ValueError, match="transport='ring' carries batches .* a transform"):  # once silently queued
        ZarrDataLoader(with_transform, batch_size=4, num_workers=1, transport="ring")
    with pytest.raises(ValueError, match="transport must be"):
        ZarrDataLoader(plain, batch_size=4, transport="pipe")


def test_pin_memory_without_an_accelerator_still_streams(store):
    ds = ZarrIterableDataset(store, seed=0)
    planned = ds.batch_row_ids(epoch=0, num_workers=1, batch_size=BATCH, drop_last=False)
    with pytest.warns(UserWarning, match="pin_memory"):
        loader = ZarrDataLoader(ds, batch_size=BATCH, num_workers=1, pin_memory=True, transport="ring")
        for b, rows in zip(loader, planned, strict=True):  # no accelerator: views, used one at a time
            assert isinstance(b["x"], torch.Tensor)
            np.testing.assert_array_equal(b["y"].numpy(), rows * 5)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers on 2 CPUs
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_consumer_that_keeps_up_never_falls_back_to_the_queue(store, workers, monkeypatch):
    """The ring has enough slots for a trainer that prefetches one batch and drops each after its step,
    while the workers and the work-ahead thread fill everything they may (a slow step)."""
    import time

    from zarrtorch._workers.ring import REF

    seen = {"ring": 0, "queue": 0}
    receive = BatchRing.receive

    def counted(self, batch, *args, **kwargs):
        seen["ring" if isinstance(batch, dict) and REF in batch else "queue"] += 1
        return receive(self, batch, *args, **kwargs)

    monkeypatch.setattr(BatchRing, "receive", counted)
    ds = ZarrIterableDataset(store, seed=4, buffer_chunks=2)
    loader = ZarrDataLoader(ds, batch_size=BATCH, num_workers=workers, multiprocessing_context="fork")
    it = iter(loader)
    ahead = next(it)  # what a trainer prefetches
    for batch in it:
        current, ahead = ahead, batch
        batch = None
        time.sleep(0.01)  # the step: meanwhile every slot that may fill does
        current = None  # noqa: F841 (dropped after its step)
    assert seen["queue"] == 0 and seen["ring"] == len(
        ds.batch_row_ids(epoch=0, num_workers=workers, batch_size=BATCH, drop_last=False)
    )
