"""Work ahead (zarrtorch.workahead): with num_workers=0, batches are assembled while the consumer is busy;
with workers, they are received there; errors reach the consumer; a consumer that stops early leaves no
thread behind; batches are unchanged, across epochs of persistent workers too."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

from zarrtorch import ChunkReadError, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch.workahead import WorkAhead

PRODUCED = []


def count_batches(batch):  # a transform runs where the batch is assembled: here, in the work-ahead thread
    PRODUCED.append(threading.current_thread().name)
    return batch


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("workahead") / "data.zarr"
    prepare_zarr({"x": np.arange(400, dtype=np.float32)}, path, chunk_rows=20, progress=False)
    return path


def wait_until(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def assert_done_where_expected(threads: list[str], ahead: int, what: str) -> None:
    """``threads``: the thread that did ``what`` for each batch, after the consumer took its first batch."""
    if ahead:
        assert wait_until(lambda: len(threads) >= 1 + ahead), f"nothing was {what} ahead"
        assert set(threads) == {"zarrtorch-work-ahead"}
    else:
        time.sleep(0.5)
        assert threads == ["MainThread"]


@pytest.mark.parametrize("ahead", [0, 2])
def test_batches_are_built_while_the_consumer_is_busy(store, ahead):
    PRODUCED.clear()
    ds = ZarrIterableDataset(store, seed=1, transform=count_batches)
    it = iter(ZarrDataLoader(ds, batch_size=8, work_ahead=ahead))
    next(it)
    assert_done_where_expected(PRODUCED, ahead, "assembled")


@pytest.mark.parametrize("ahead", [0, 2])
def test_with_workers_batches_are_received_while_the_consumer_is_busy(store, ahead):
    ds = ZarrIterableDataset(store, seed=1)
    loader = ZarrDataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork", work_ahead=ahead)
    received, receive = [], loader.receive

    def recording(batch):
        received.append(threading.current_thread().name)
        return receive(batch)

    loader.receive = recording
    it = iter(loader)
    next(it)
    assert_done_where_expected(received, ahead, "received")
    del it


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["queue", "ring"])
def test_persistent_workers_same_batches_with_and_without(store, transport):
    """Early breaks, then whole epochs: the thread of a broken epoch is stopped before DataLoader's
    iterator is reused, and every epoch gives the planned batches."""
    ds = ZarrIterableDataset(store, seed=5, buffer_chunks=2, return_index=True)
    kw = dict(batch_size=8, num_workers=2, persistent_workers=True, multiprocessing_context="fork")
    loader = ZarrDataLoader(ds, transport=transport, work_ahead=3, **kw)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for i, _ in enumerate(loader):
            if i == 2 + epoch:
                break
    for epoch in (3, 4):
        loader.set_epoch(epoch)
        got = [b["index"].clone() for b in loader]
        planned = ds.batch_row_ids(epoch=epoch, num_workers=2, batch_size=8, drop_last=False)
        assert len(got) == len(planned)
        for b, rows in zip(got, planned, strict=True):
            np.testing.assert_array_equal(b.numpy(), rows)


def test_same_batches_with_and_without(store):
    ds = ZarrIterableDataset(store, seed=3, buffer_chunks=2, return_index=True)
    rows = [[b["index"].numpy() for b in ZarrDataLoader(ds, batch_size=16, work_ahead=k)] for k in (0, 3)]
    assert len(rows[0]) == len(rows[1]) and all(np.array_equal(a, b) for a, b in zip(*rows, strict=True))


def test_a_consumer_that_stops_early_leaves_no_thread(store):
    it = iter(ZarrDataLoader(ZarrIterableDataset(store), batch_size=8))
    next(it)
    del it
    gc.collect()
    alive = lambda: [t for t in threading.enumerate() if t.name == "zarrtorch-work-ahead"]  # noqa: E731
    assert wait_until(lambda: not alive(), 5.0), alive()


def test_errors_reach_the_consumer(tmp_path):
    path = tmp_path / "data.zarr"
    prepare_zarr({"x": np.arange(400, dtype=np.float32)}, path, chunk_rows=20, progress=False)
    for chunk in (path / "x" / "c").iterdir():
        if chunk.name == "7":
            chunk.unlink()
    with pytest.raises(ChunkReadError, match="missing chunk 7"):
        for _ in ZarrDataLoader(ZarrIterableDataset(path, shuffle=False), batch_size=8, work_ahead=2):
            pass


def test_work_ahead_iterator_alone():
    def numbers():
        yield from range(3)
        raise KeyError("boom")

    it = WorkAhead(numbers(), depth=1)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(KeyError, match="boom"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)  # after the end, at once (no wait on an empty queue)
