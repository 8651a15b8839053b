"""Batches gathered straight into page-locked slots with ``pin_memory=True`` and no workers
(zarrtorch._workers.pinned): no copy is made of a batch (its tensors lie inside their slot, by ``data_ptr``), a
slot is reused only once nothing references its batch (and, on a GPU, once the copies queued from it are done),
kept batches are never overwritten, and a resumed epoch is the same batches.

Without CUDA ``pin_memory()`` raises: the tests substitute an ordinary allocation for the page-locked one
(:func:`zarrtorch._workers.pinned.pinned_memory`), which is all the slots' logic depends on; with CUDA they run on
the real slots. The test that needs CUDA (the batch really pinned, copied to the device) is skipped without it."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest
import torch

from zarrtorch import ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch._workers import pinned
from zarrtorch._workers.pinned import PinnedSlots
from zarrtorch.windows import Windows

ROWS, CHUNK, BATCH = 203, 16, 8
KINDS = [{}, {"windows": Windows(history=2, lead=3)}, {"return_padding": True}]
KIND_IDS = ["rows", "windows", "padding"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("pinned") / "p.zarr"
    x = np.arange(ROWS * 6, dtype=np.float32).reshape(ROWS, 2, 3)
    prepare_zarr({"x": x, "y": np.arange(ROWS) * 5}, path, chunk_rows=CHUNK, progress=False)
    return path


def ordinary(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8)


@pytest.fixture
def substituted(monkeypatch):
    """An ordinary allocation where there is no CUDA (no CUDA events); on a GPU the real page-locked slots, which
    DataLoader's pinning passes on as they are (an ordinary slot would be copied there)."""
    if not torch.cuda.is_available():
        monkeypatch.setattr(pinned, "pinned_memory", lambda: (ordinary, False))


def loader_of(store, pin=True, **kw):
    ds = ZarrIterableDataset(store, seed=1, buffer_chunks=2, return_index=True, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DataLoader: "pin_memory ... no accelerator is found"
        return ZarrDataLoader(ds, batch_size=BATCH, pin_memory=pin)


def iterate(loader):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield from loader


def copied_epoch(loader, e):
    """Epoch ``e``'s batches, copied (a reference run's, or to compare after the slots are reused)."""
    loader.set_epoch(e)
    return [{k: v.clone() for k, v in b.items()} for b in iterate(loader)]


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name].numpy(), want[name].numpy(), err_msg=name)


@pytest.mark.parametrize("kw", KINDS, ids=KIND_IDS)
def test_each_batch_lies_in_its_slot_and_equals_the_unpinned_ones_over_epochs(store, substituted, kw):
    """A loop that uses each batch and drops it, three epochs: every tensor of every batch is the slot's memory
    (its data_ptr inside the slot: no copy), the batches are those of a loader without pin_memory, and the same
    few slots are reused."""
    loader, plain = loader_of(store, **kw), loader_of(store, pin=False, **kw)
    slots = loader.job.pinned
    assert slots is not None
    n, pointers = 0, set()
    for e in range(3):
        expected = copied_epoch(plain, e)
        loader.set_epoch(e)
        got = 0
        for batch, want in zip(iterate(loader), expected, strict=True):
            for name, t in batch.items():
                assert slots.holds(t), f"{name} of batch {got} of epoch {e} is not in a pinned slot: it was copied"
            assert_same(batch, want)
            pointers.add(batch["x"].data_ptr())
            got += 1
            del batch
        assert got == len(expected)
        n += got
    assert n > 3 * slots.slots
    assert len(pointers) <= slots.slots  # the same few slots, reused


@pytest.mark.parametrize("kw", KINDS[:2], ids=KIND_IDS[:2])
def test_kept_batches_keep_their_slots_and_the_rest_are_gathered_elsewhere(store, substituted, kw):
    """``list(loader)`` holds more batches than there are slots: none is overwritten (checked after a second
    epoch ran through the freed slots), and those that found no free slot went into ordinary memory
    (DataLoader's pinning copies those, as before)."""
    loader, plain = loader_of(store, **kw), loader_of(store, pin=False, **kw)
    slots = loader.job.pinned
    loader.set_epoch(0)
    kept = list(iterate(loader))
    expected = copied_epoch(plain, 0)
    assert len(kept) > 2 * slots.slots
    for got, want in zip(kept, expected, strict=True):
        assert_same(got, want)
    in_slots = [all(slots.holds(t) for t in b.values()) for b in kept]
    assert sum(in_slots) == slots.slots and not all(in_slots)
    del kept
    gc.collect()
    assert sorted(slots._free) == list(range(slots.slots))  # all free once dropped
    assert len(copied_epoch(loader, 1)) == len(copied_epoch(plain, 1))


@pytest.mark.parametrize("kw", KINDS[:2], ids=KIND_IDS[:2])
def test_a_resume_mid_epoch_gathers_the_remaining_batches_into_the_slots(store, substituted, kw):
    """Stopped after 5 batches (kept) and resumed by a new pinned loader: the rest of the epoch lands in its slots,
    and the kept batches and the rest together are the unpinned loader's epoch."""
    first = loader_of(store, **kw)
    first.set_epoch(0)
    it = iterate(first)
    before = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it
    rest = loader_of(store, **kw)
    rest.load_state_dict(state)
    rest.set_epoch(0)
    after = []
    for batch in iterate(rest):
        assert all(rest.job.pinned.holds(t) for t in batch.values())
        after.append({k: v.clone() for k, v in batch.items()})
        del batch
    expected = copied_epoch(loader_of(store, pin=False, **kw), 0)
    assert len(before) + len(after) == len(expected)
    for got, want in zip(before + after, expected, strict=True):
        assert_same(got, want)


def test_a_slot_is_written_again_only_after_its_copies_event(monkeypatch):
    """On a GPU the batch's last reference records an event on the current stream; the slot's next batch
    waits for it first (a non_blocking copy may still read the slot)."""
    log = []

    class Event:
        def record(self):
            log.append("record")

        def synchronize(self):
            log.append("synchronize")

    monkeypatch.setattr(pinned.torch.cuda, "Event", Event)
    slots = PinnedSlots(4, {"x": ((3,), np.float32)}, 1, allocate=ordinary, events=True)
    first = slots.out(4)
    assert slots.out(4) is None  # the one slot is held
    del first
    assert log == ["record"]
    second = slots.out(2)
    assert log == ["record", "synchronize"] and second["x"].shape == (2, 3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_without_cuda_pin_memory_makes_no_slots(store):
    """A CPU-only torch (this one) pins nothing: the loader gathers as before."""
    assert loader_of(store).job.pinned is None


def test_no_slots_with_workers_or_stacked_columns_or_without_pin_memory(store, substituted):
    ds = ZarrIterableDataset(store, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ZarrDataLoader(ds, batch_size=BATCH, pin_memory=True, num_workers=2).job.pinned is None
        stacked = ZarrIterableDataset(store, seed=1, variables=["x"], stack={"xs": ["x"]})
        assert ZarrDataLoader(stacked, batch_size=BATCH, pin_memory=True).job.pinned is None
        assert ZarrDataLoader(ds, batch_size=BATCH, pin_memory=False).job.pinned is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: page-locked memory")
@pytest.mark.parametrize("kw", KINDS[:2], ids=KIND_IDS[:2])
def test_on_a_gpu_each_batch_is_pinned_in_its_slot_and_copies_to_the_device_right(store, kw):
    """What a GPU node sees: DataLoader's pinning hands the slot's batch on as it is (pinned, data_ptr inside the
    slot), and a non_blocking copy to the device, its host batch dropped at once, carries the unpinned values."""
    loader, plain = loader_of(store, **kw), loader_of(store, pin=False, **kw)
    slots = loader.job.pinned
    for e in range(2):
        expected = copied_epoch(plain, e)
        loader.set_epoch(e)
        on_device = []
        for batch in iterate(loader):
            assert all(t.is_pinned() and slots.holds(t) for t in batch.values())
            on_device.append({k: v.to("cuda", non_blocking=True) for k, v in batch.items()})
            del batch
        torch.cuda.synchronize()
        assert len(on_device) == len(expected)
        for got, want in zip(on_device, expected, strict=True):
            assert_same({k: v.cpu() for k, v in got.items()}, want)
