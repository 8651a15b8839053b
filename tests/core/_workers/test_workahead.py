"""Work ahead (zarrtorch._workers.workahead): with num_workers=0, batches are assembled while the consumer is busy;
with workers, they are received there; errors reach the consumer; a consumer that stops early leaves no
thread behind; batches are unchanged, across epochs of persistent workers too."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import zarrtorch.epoch
from zarrtorch import ChunkReadError, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch._workers import workahead
from zarrtorch._workers.workahead import Handoff, WorkAhead

PRODUCED = []
TRANSFORMED = []


def count_batches(batch):  # a transform runs where it draws from torch's generator in order: the consumer's thread
    TRANSFORMED.append(threading.current_thread().name)
    return batch


@pytest.fixture()
def assembled(monkeypatch):
    """The thread that assembles each batch (the dataset turns it into tensors there)."""
    PRODUCED.clear()
    to_torch = zarrtorch.epoch.as_tensors

    def recorded(self, batch):
        PRODUCED.append(threading.current_thread().name)
        return to_torch(self, batch)

    monkeypatch.setattr(zarrtorch.epoch, "as_tensors", recorded)
    return PRODUCED


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
def test_batches_are_built_while_the_consumer_is_busy(store, ahead, assembled):
    TRANSFORMED.clear()
    ds = ZarrIterableDataset(store, seed=1, transform=count_batches)
    it = iter(ZarrDataLoader(ds, batch_size=8, work_ahead=ahead))
    next(it)
    assert_done_where_expected(assembled, ahead, "assembled")
    assert TRANSFORMED == ["MainThread"]  # the transform of the one batch taken, in the consumer's thread


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


class Recorded:
    """Stands in for the hand-off's event: records what is done with it."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append(name)


def test_taking_a_ready_batch_wakes_no_thread():
    """A ready batch is taken without signalling anyone: a wake-up from the consumer's next() let the kernel
    run the woken thread while the consumer held the GIL (benchmarks/README.md)."""
    handoff, stop = Handoff(2), threading.Event()
    assert handoff.put(1, stop) and handoff.put(2, stop)
    handoff._ready = Recorded()
    assert [handoff.get(), handoff.get()] == [1, 2]
    assert handoff._ready.calls == []


def test_a_full_handoff_makes_room_without_a_signal_and_stops_on_request():
    handoff, stop = Handoff(2), threading.Event()
    done = []
    producer = threading.Thread(target=lambda: [done.append(handoff.put(i, stop)) for i in range(3)], daemon=True)
    producer.start()
    assert wait_until(lambda: len(handoff._items) == 2)
    time.sleep(0.05)
    assert done == [True, True]  # the third waits for room
    assert handoff.get() == 0
    producer.join(5)
    assert done == [True, True, True] and [handoff.get(), handoff.get()] == [1, 2]
    assert handoff.put(3, stop) and handoff.put(4, stop)
    stop.set()
    assert handoff.put(5, stop) is False  # full and asked to stop: gives up instead of waiting


def test_a_consumer_waiting_on_an_empty_handoff_is_woken_by_the_next_item():
    handoff, stop = Handoff(1), threading.Event()
    threading.Timer(0.05, lambda: handoff.put("x", stop)).start()
    start = time.monotonic()
    assert handoff.get() == "x"
    assert time.monotonic() - start < 5


def test_threads_still_running_are_stopped_at_exit():
    """At exit every work-ahead thread is told to stop and waited for, so none is cut off in the middle of a
    torch call (which aborts the process)."""

    def endless():
        while True:
            yield np.zeros(1)

    ahead = WorkAhead(endless(), 2)
    assert next(ahead) is not None and ahead._thread in workahead._RUNNING
    workahead._stop_all()
    assert not ahead._thread.is_alive() and ahead._thread not in workahead._RUNNING


class FakeClock:
    """Stands in for ``workahead.time``: sleeping advances the clock, and the consumer takes an item at
    ``take_at`` (in the producer's own thread, so the test is deterministic)."""

    def __init__(self, handoff, take_at):
        self.now, self.sleeps, self.handoff, self.take_at = 0.0, [], handoff, take_at

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds
        if self.now >= self.take_at and len(self.handoff._items) == self.handoff.depth:
            self.handoff.get()


def test_a_producer_without_room_looks_less_often_the_longer_it_waits(monkeypatch):
    """Polling at 0.5 ms cost about 1,700 wake-ups a second while a paused consumer (validation) left the
    queue full. Now the first looks come 0.5 ms apart, later ones after half the time waited, at most
    MAX_POLL_S, so the item still goes in soon after room appears."""
    handoff, stop = Handoff(2), threading.Event()
    assert handoff.put(1, stop) and handoff.put(2, stop)
    clock = FakeClock(handoff, take_at=2.0)
    monkeypatch.setattr(workahead, "time", clock)
    monkeypatch.setattr(workahead, "_wait_for_room", lambda room, seconds: clock.sleep(seconds))
    assert handoff.put(3, stop) and list(handoff._items) == [2, 3]
    assert clock.sleeps[:3] == [workahead.POLL_S] * 3
    assert clock.sleeps == sorted(clock.sleeps) and max(clock.sleeps) == workahead.MAX_POLL_S
    assert len(clock.sleeps) < 2.0 / workahead.MAX_POLL_S + 20  # 4,000 looks at a fixed 0.5 ms
    assert clock.now - 2.0 <= workahead.MAX_POLL_S  # put in at most one look after the room appeared


def test_a_producer_that_waits_briefly_keeps_looking_every_half_millisecond(monkeypatch):
    handoff, stop = Handoff(1), threading.Event()
    assert handoff.put(1, stop)
    clock = FakeClock(handoff, take_at=0.0015)
    monkeypatch.setattr(workahead, "time", clock)
    monkeypatch.setattr(workahead, "_wait_for_room", lambda room, seconds: clock.sleep(seconds))
    assert handoff.put(2, stop)
    assert clock.sleeps == [workahead.POLL_S] * 3


def test_a_consumer_that_finds_nothing_wakes_the_producer_waiting_for_room(monkeypatch):
    """A consumer faster than the producer (a loop that only counts rows, the benchmarks' epochs) took the
    full queue's items while the producer slept until its next look, then waited for it: in a warm epoch of the
    node's chunk cache the producer spent half its time asleep with the next batch in hand (``benchmarks/cache.py``:
    0.70x the local disk's rows/s). A consumer that finds nothing now wakes it; a ready item still wakes nobody."""
    monkeypatch.setattr(workahead, "POLL_S", 60.0)  # its first look would come a minute later
    monkeypatch.setattr(workahead, "MAX_POLL_S", 60.0)
    handoff, stop = Handoff(2), threading.Event()
    assert handoff.put(1, stop) and handoff.put(2, stop)
    producer = threading.Thread(target=handoff.put, args=(3, stop), daemon=True)
    producer.start()
    time.sleep(0.05)
    assert producer.is_alive() and len(handoff._items) == 2  # waiting for room
    assert [handoff.get(), handoff.get()] == [1, 2]  # ready items: taken without waking it
    assert producer.is_alive()
    assert handoff.get(timeout_s=20) == 3  # nothing left: the consumer wakes it, long before its next look
    producer.join(5)
    assert not producer.is_alive()


class SlowToClose:
    """Endless zeros; when dropped, takes ``close_s`` to close (as a DataLoader iterator joining its workers),
    then sets ``closed``."""

    def __init__(self, closed: threading.Event, close_s: float):
        self.closed, self.close_s = closed, close_s

    def __iter__(self):
        return self

    def __next__(self):
        return np.zeros(1)

    def __del__(self):
        time.sleep(self.close_s)
        self.closed.set()


def test_at_exit_a_thread_tearing_down_its_iterator_is_waited_for():
    """A thread holding the last reference to its iterator drops it as it ends; for a DataLoader iterator with
    workers that shuts the workers down, which can take seconds. Exit waits for it: cut off in the middle, the
    thread aborted the process (seen: a DDP rank that left its loop mid-epoch exited with SIGABRT)."""
    closed = threading.Event()
    ahead = WorkAhead(SlowToClose(closed, 3.0), 2)  # longer than the wait for a thread still iterating (2 s)
    thread = ahead._thread
    assert next(ahead) is not None
    del ahead  # the consumer lets go: the thread stops and holds the iterator's last reference
    workahead._stop_all()
    assert closed.is_set() and not thread.is_alive() and thread not in workahead._RUNNING


LEAVE_AFTER_A_WORKER_DIES = textwrap.dedent(
    """
    import os, signal, sys
    from zarrtorch import ZarrDataLoader, ZarrIterableDataset

    def main():
        ds = ZarrIterableDataset(sys.argv[1], seed=1, buffer_chunks=2)
        loader = ZarrDataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True,
                                multiprocessing_context="spawn")
        it = iter(loader)
        next(it)
        os.kill(it.workers[0].pid, signal.SIGKILL)
        try:
            print("leaving", flush=True)
        except RuntimeError:  # DataLoader's SIGCHLD handler, if the worker's death is noticed this early
            print("leaving", flush=True)

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.slow
def test_leaving_after_a_worker_died_exits_cleanly(store, tmp_path):
    """A script leaves its loop, a worker of the abandoned epoch dies, the script ends: exit code 0, and the wait
    at exit for the work-ahead thread is not cut short (seen failing in 4 of 5 runs: DataLoader's SIGCHLD handler
    raised inside it, "Exception ignored in atexit callback", the thread left tearing down the workers)."""
    script = tmp_path / "leave.py"
    script.write_text(LEAVE_AFTER_A_WORKER_DIES)
    done = subprocess.run([sys.executable, str(script), str(store)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "leaving" in done.stdout, done.stderr[-3000:]
    assert "Exception ignored" not in done.stderr and "terminate called" not in done.stderr, done.stderr[-3000:]


def test_the_wait_at_exit_goes_on_through_an_exception_raised_in_it(monkeypatch):
    """DataLoader's SIGCHLD handler raises in the main thread, and so inside the wait at exit, when a worker
    died earlier; the wait goes on, and the thread's teardown still ends before the interpreter does."""
    import signal

    closed = threading.Event()

    def handler(signum, frame):
        raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Killed.")

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        ahead = WorkAhead(SlowToClose(closed, 1.5), 2)
        thread = ahead._thread
        assert next(ahead) is not None
        del ahead
        threading.Timer(0.5, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)).start()
        workahead._stop_all()  # must not raise, nor return before the teardown ends
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert closed.is_set() and not thread.is_alive()


def test_a_forked_worker_does_not_wait_at_exit_for_its_parents_work_ahead_threads():
    """Workers forked while an earlier loader's work-ahead thread was still tearing down its iterator (a state
    loaded into a new loader with workers right after the old iterator was dropped) inherited the parent's list of
    running threads, and at exit waited up to a minute for one that does not run in them: DataLoader then killed
    them after its own joins, 5 s each, at the end of every epoch. A forked process starts with no such thread."""
    stop, left, ended = threading.Event(), threading.Event(), threading.Event()
    left.set()  # out of its iteration, still dropping the iterator: the wait at exit is for ``ended``
    holder = threading.Thread(target=ended.wait, daemon=True)
    holder.start()
    workahead._stop_at_exit(stop, left, ended, holder)
    try:
        import multiprocessing

        child = multiprocessing.get_context("fork").Process(target=lambda: sys.exit(len(workahead._RUNNING)))
        child.start()
        child.join(120)
        assert child.exitcode == 0, f"the forked process saw {child.exitcode} work-ahead thread(s) of its parent"
    finally:
        ended.set()
        workahead._RUNNING.pop(holder, None)
