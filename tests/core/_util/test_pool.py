"""Pooled buffers (zarrtorch._util.pool): a buffer is reused only once nothing references it any more, whatever
holds it (a slice, a tensor made by torch.from_numpy, that tensor's .numpy()); a pool never waits; the
decoded chunks of the direct read path and the batches of a loader without workers come from pools."""

from __future__ import annotations

import gc
import pickle
import time
import weakref

import numpy as np
import pytest
import torch

import zarrtorch._util.pool
from zarrtorch import ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch._read.fastpath import direct_decoder
from zarrtorch._util.pool import POOLED_CHUNK_BYTES, Lease, LeasedArray, Pool, Pools, array_pool, batch_pool
from zarrtorch.buffer import RowCursor


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


HOLDERS = {
    "a slice": lambda a: a[1:],
    "a tensor": lambda a: torch.from_numpy(a[2:]),
    "the tensor's .numpy()": lambda a: torch.from_numpy(a).numpy()[:1],
}


def test_buffer_returns_only_after_its_last_reference():
    take = array_pool((4, 3), np.float32, keep=1)
    for name, make_holder in HOLDERS.items():
        first = take()
        where = address(first)
        holder = make_holder(first)
        del first
        gc.collect()
        other = take()  # the holder alone keeps the buffer out of the pool: a new one
        assert address(other) != where, name
        del holder
        gc.collect()
        again = take()
        assert address(again) == where, name  # free again: reused
        del again, other


def test_pool_makes_a_new_buffer_instead_of_waiting_and_keeps_at_most_keep():
    made = []
    pool = Pool(lambda: made.append(1) or np.zeros(2), keep=2)
    items = [pool.take() for _ in range(5)]
    assert len(made) == 5
    del items
    gc.collect()
    [pool.take() for _ in range(2)]
    assert len(made) == 5  # two came back and were reused (keep=2), the others were dropped
    assert len(pool._free) <= 2


def test_batch_pool_one_lease_for_all_columns():
    out = batch_pool(8, {"index": ((), np.dtype("int64")), "x": ((3,), np.dtype("float32"))})
    batch = out(5)
    assert batch["x"].shape == (5, 3) and batch["index"].shape == (5,)
    where = address(batch["x"])
    x_only = torch.from_numpy(batch["x"])
    del batch
    gc.collect()
    assert address(out(8)["x"]) != where  # the index column is gone, the x tensor still holds the batch
    del x_only
    gc.collect()
    assert address(out(8)["x"]) == where


def test_pools_do_not_travel_to_another_process():
    pools, shape = Pools(), (POOLED_CHUNK_BYTES // 4,)
    pools.chunks(shape, np.float32)()
    copy = pickle.loads(pickle.dumps(pools))
    assert copy._pools == {}
    assert copy.chunks(shape, np.float32) is copy.chunks(shape, np.float32)


def test_a_small_decoded_chunk_is_a_new_array_and_a_large_one_pooled():
    """A WeatherBench2-style row is a 4 KiB chunk per variable: its lease (a view subclass, a finalizer) cost
    more than a new array from the C allocator's heap, for every chunk of an epoch, and there are no page
    faults to save at that size."""
    small = Pools().chunks((1, 32, 32), np.float32)()
    assert type(small) is np.ndarray and small.shape == (1, 32, 32) and small.dtype == np.float32
    large = Pools().chunks((1, POOLED_CHUNK_BYTES // 4), np.float32)()
    assert isinstance(large, LeasedArray)


def test_a_chunk_pool_keeps_every_free_chunk_and_makes_no_more_than_were_in_use_at_once():
    """With one-row chunks the shuffle buffer holds its rows as decoded chunks (zarrtorch/ref_buffer.py): a
    buffer's worth of them is freed every few batches, and a pool keeping only 8 gave the rest back to the C
    allocator, whose next chunk faulted its pages in again (about one page fault a 128 KiB row, issue 43)."""
    take = Pools().chunks((1, POOLED_CHUNK_BYTES // 4), np.float32)
    held = [take() for _ in range(40)]
    buffers = [weakref.ref(a.base) for a in held]  # the pooled arrays the leased views are of
    del held
    gc.collect()
    assert all(b() is not None for b in buffers)  # every free one kept
    again = [take() for _ in range(40)]
    assert {id(a.base) for a in again} == {id(b()) for b in buffers}  # and reused: none made anew


def test_direct_decoder_reuses_a_chunk_buffer_once_freed(tmp_path, monkeypatch):
    import zarr

    monkeypatch.setattr(zarrtorch._util.pool, "POOLED_CHUNK_BYTES", 0)  # these small chunks pooled too

    prepare_zarr(
        {"x": np.arange(64 * 5, dtype=np.float32).reshape(64, 5)}, tmp_path / "s.zarr", chunk_rows=16, progress=False
    )
    arr = zarr.open_group(tmp_path / "s.zarr", mode="r")["x"]
    decode = direct_decoder(arr, pools=Pools())
    a = decode("x/c/0/0")
    where, expected = address(a), a.copy()
    b = decode("x/c/1/0")
    assert address(b) != where and np.array_equal(b, np.asarray(arr[16:32]))
    del a
    gc.collect()
    c = decode("x/c/2/0")
    assert address(c) == where and np.array_equal(c, np.asarray(arr[32:48]))
    assert np.array_equal(expected, np.asarray(arr[:16]))


def test_stream_yields_what_read_returns():
    pieces = np.array([[0, 5], [5, 7], [7, 20]])
    one, two = RowCursor(pieces), RowCursor(pieces)
    for n in (3, 6, 1, 10):
        a, b = one.read(n), list(two.stream(n))
        assert len(a) == len(b) and all(np.array_equal(x["index"], y["index"]) for x, y in zip(a, b, strict=True))


def test_kept_batches_without_workers_are_never_overwritten(tmp_path):
    """A loader without workers gathers into pooled batches: keeping every batch (list) forces new buffers,
    and the kept batches equal those of a loader whose consumer drops each one at once."""
    rows = 16 * 9
    prepare_zarr(
        {"x": np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)},
        tmp_path / "s.zarr",
        chunk_rows=16,
        progress=False,
    )
    ds = ZarrIterableDataset(tmp_path / "s.zarr", seed=3, return_index=True, buffer_chunks=2)
    kept = list(ZarrDataLoader(ds, batch_size=8))
    dropped = [{k: v.clone() for k, v in b.items()} for b in ZarrDataLoader(ds, batch_size=8)]
    assert len(kept) == len(dropped) == rows // 8
    for k, d in zip(kept, dropped, strict=True):
        assert torch.equal(k["index"], d["index"]) and torch.equal(k["x"], d["x"])
        assert torch.equal(k["x"][:, 0], 4 * k["index"].float())  # each row is the row it names


def test_a_ctrl_c_that_lands_while_a_buffer_is_given_back_still_interrupts():
    """A KeyboardInterrupt raised while a lease gives its buffer back (a Ctrl-C landing in ``Lease.__del__``, which
    runs at every chunk freed) was printed as "Exception ignored" and dropped: the user's Ctrl-C did nothing. It
    is given to the main thread again, and raised there."""

    def release() -> None:
        raise KeyboardInterrupt  # as the signal's handler raises it, there

    lease = Lease(release)
    with pytest.raises(KeyboardInterrupt):
        del lease
        for _ in range(2000):  # the interrupt, delivered again, is raised at one of these (10 s at most)
            time.sleep(0.005)
