"""Batches through preallocated shared-memory slots (zarrtorch.ring): the same batches as DataLoader's
queue for every start method, persistent or not, across epochs and early breaks; the views' lifetime as
documented; a worker that finds no free slot says why instead of hanging."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from zarrtorch import ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch.ring import BatchRing, RingShape

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
def test_ring_gives_the_queues_batches(store, context, persistent):
    ds = ZarrIterableDataset(store, seed=1, buffer_chunks=2, return_index=True)
    kw = dict(batch_size=BATCH, num_workers=2, multiprocessing_context=context, persistent_workers=persistent)
    queue_loader = ZarrDataLoader(ds, **kw)
    assert queue_loader.ring is None  # the default without pinned memory
    via_queue = epochs(queue_loader)
    ring_loader = ZarrDataLoader(ds, transport="ring", **kw)
    assert ring_loader.ring is not None
    via_ring = epochs(ring_loader, copy=True)  # kept: copied, as documented
    assert_same(via_ring, via_queue)
    for epoch in via_ring:  # the batches are intact rows, paired
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
    loader = ZarrDataLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=True,
                            multiprocessing_context="fork", transport="ring")  # fmt: skip
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


def _slot_of(ring: BatchRing, column: torch.Tensor) -> tuple[int, int]:
    """(worker, slot) of a batch the ring handed out, from where its view starts."""
    base = ring.data["index"]
    k = (column.data_ptr() - base.data_ptr()) // (base.shape[2] * base.element_size())
    return divmod(int(k), base.shape[1])


@pytest.mark.parametrize("ahead", [0, 2])
def test_views_stay_valid_until_three_more_batches_were_handed_out(store, ahead):
    """With work_ahead, batches are received by a thread ahead of the consumer: the slots must still be
    held as long as the consumer may hold the batch."""
    ds = ZarrIterableDataset(store, seed=4, buffer_chunks=2, return_index=True)
    loader = ZarrDataLoader(ds, batch_size=BATCH, num_workers=1, transport="ring", work_ahead=ahead)
    it = iter(loader)
    first = next(it)
    ring, snapshot = loader.ring, first["index"].clone()
    slot, generation = _slot_of(ring, first["index"]), int(ring.generation)
    newer = [next(it) for _ in range(2)]  # the consumer holds the first batch and two newer ones
    time.sleep(0.5)  # the worker and the work-ahead thread run as far ahead as they are allowed to
    np.testing.assert_array_equal(first["index"].numpy(), snapshot.numpy())
    assert int(ring.busy[slot]) == generation  # still held: no worker may write into it
    if ahead == 0:  # without the thread, the third newer batch frees it at once
        newer.append(next(it))
        assert int(ring.busy[slot]) == 0
    planned = ds.batch_row_ids(epoch=0, num_workers=1, batch_size=BATCH, drop_last=False)
    got = [first, *newer]
    for b, rows in zip(got, planned, strict=False):
        np.testing.assert_array_equal(b["index"].numpy(), rows)
    del it


def test_a_worker_without_free_slots_explains_instead_of_hanging():
    ring = BatchRing(RingShape(workers=1, slots=2, batch_size=4, columns=(("x", (3,), "float32"),)), hold=1, wait_s=0.2)
    ring.start_epoch()
    writer = ring.writer(0)
    writer.out(4)
    writer.out(4)
    with pytest.raises(RuntimeError, match=r"none of its 2 batch slots freed.*copy batches you keep"):
        writer.out(4)


def test_no_ring_where_a_batch_changes_after_gathering(store):
    plain = ZarrIterableDataset(store)
    assert ZarrDataLoader(plain, batch_size=4, num_workers=0).ring is None  # no workers
    assert ZarrDataLoader(plain, batch_size=4, num_workers=1, transport="queue").ring is None
    with_transform = ZarrIterableDataset(store, transform=dict)
    assert ZarrDataLoader(with_transform, batch_size=4, num_workers=1, transport="ring").ring is None
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
