"""Hand batches to the consumer from a background thread that stays a few batches ahead.

With ``num_workers=0`` a DataLoader builds a batch only when the training loop asks for it, so the
accelerator waits for every batch: the thread reads, decodes and shuffles the next ones while the step runs
(decoding releases the GIL, and so does a GPU step). With worker processes the batches are built ahead
already, but receiving one (DataLoader's queues, unpickling, a file descriptor per tensor) still costs the
main process about a millisecond; the thread takes that off the step too.

Taking a ready batch wakes no thread: the thread polls for room instead of being signalled. A wake-up from
the consumer's ``next()`` (``queue.Queue`` notifying the waiting producer) let the kernel run the woken
thread first, and on a machine busy with worker processes the consumer, still holding the GIL, then waited
milliseconds for a batch that was ready (measured in ``benchmarks/README.md``). The polls thin out the
longer the queue stays full, so a slow step or a paused consumer (validation) costs a few dozen wake-ups a
second, not thousands.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator

from zarrtorch._compat.threading import at_exit_before_executor_joins

POLL_S = 0.0005  # how soon a producer with no room looks again at first
MAX_POLL_S = 0.02  # the longest it sleeps between looks: the delay, once room appears after a long pause


class ProducerSilent(RuntimeError):
    """The work-ahead thread handed over nothing within the consumer's limit: it is blocked (in a worker's
    batch that never arrives whole)."""


STOPPED = (False, RuntimeError("the work-ahead thread was stopped before the epoch ended (a newer epoch started)"))


def _wait_for_room(room: threading.Event, seconds: float) -> None:
    """A producer without room waits ``seconds``, or less if a consumer finds nothing first."""
    room.wait(seconds)


class Handoff:
    """At most ``depth`` items from one producer thread to one consumer. The consumer's ``get`` of a ready
    item is a ``deque.popleft`` (atomic under the GIL) that wakes nobody; a producer without room looks again
    after half the time it has waited so far (from :data:`POLL_S` up to :data:`MAX_POLL_S`); a consumer that
    finds nothing wakes a producer waiting for room (it has nothing else to do then), and waits for an event the
    producer sets."""

    def __init__(self, depth: int):
        self.depth = max(1, int(depth))
        self._items: deque = deque()
        self._ready = threading.Event()
        self._waiting = False  # the consumer waits on _ready
        self._room = threading.Event()  # set by a consumer that found nothing: a producer waiting for room looks again
        self._closed = False  # the producer has ended: nothing more will come

    def put(self, item, stop: threading.Event) -> bool:
        """Append ``item`` once there is room; ``False`` if ``stop`` is set first."""
        full_since = None
        while len(self._items) >= self.depth:
            if stop.is_set():
                return False
            now = time.monotonic()
            full_since = now if full_since is None else full_since
            # a consumer that has not taken for w seconds is unlikely to within w/2: the producer, which holds
            # the next item already, then puts it in at most w/2 late, while the queue still holds depth-1
            self._room.clear()
            if len(self._items) < self.depth:
                break
            _wait_for_room(self._room, min(MAX_POLL_S, max(POLL_S, (now - full_since) / 2)))
        self._items.append(item)
        if self._waiting:
            self._ready.set()
        return True

    def close(self) -> None:
        """The producer ends: a consumer that finds nothing more gets :data:`STOPPED` instead of waiting."""
        self._closed = True
        self._ready.set()

    def get(self, timeout_s: float | None = None):
        """The next item; ``(False, ProducerSilent(...))`` after ``timeout_s`` without one (``None``: no limit)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                return self._items.popleft()
            except IndexError:
                pass
            if self._closed and not self._items:
                return STOPPED
            if deadline is not None and time.monotonic() > deadline:
                return (False, ProducerSilent(f"the work-ahead thread handed over nothing for {timeout_s:g} s"))
            self._waiting = True  # set before looking again: an item appended after the look sets _ready
            self._ready.clear()
            self._room.set()
            if not self._items and not self._closed:
                self._ready.wait(0.1)
            self._waiting = False


class WorkAhead:
    """Iterate ``inner`` in a daemon thread, at most ``depth`` items ahead, each passed through ``convert``
    there when given. Errors reach the consumer with their traceback; dropping the iterator (a ``break``)
    stops the thread within a millisecond once its current item is in; :meth:`stopper` also waits."""

    def __init__(self, inner: Iterator, depth: int, convert: Callable | None = None, timeout_s: float | None = None):
        self.inner = inner
        self.timeout_s = timeout_s  # the consumer's limit on one wait (ProducerSilent after it)
        self._handoff = Handoff(depth)
        self._stop = threading.Event()
        self._finished = False
        left, ended = threading.Event(), threading.Event()  # out of the iteration; then out of the teardown too
        self._thread = threading.Thread(
            target=_run,
            args=([inner, convert, self._handoff, self._stop], left, ended),
            daemon=True,
            name="zarrtorch-work-ahead",
        )
        _stop_at_exit(self._stop, left, ended, self._thread)
        self._thread.start()
        weakref.finalize(self, self._stop.set)  # the thread holds no reference to self

    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        ok, item = self._handoff.get(self.timeout_s)
        if not ok and isinstance(item, ProducerSilent):
            raise item  # the thread goes on: the caller decides (it may unblock the thread and stop it)
        if ok:
            return item
        self._finished = True
        self._stop.set()
        if isinstance(item, StopIteration):
            raise StopIteration  # a fresh one: the stored one, raised here, would hold this frame in a cycle
        if item is STOPPED[1]:
            raise RuntimeError(item.args[0])  # a fresh one: the shared one would collect every traceback
        try:
            raise item
        finally:
            item = None  # the error's traceback holds this frame: no cycle back to the error

    def stopper(self):
        """A function that stops the thread and waits until it no longer touches ``inner`` (before ``inner`` is
        reused, as DataLoader reuses its iterator with persistent workers); it holds no reference to this
        iterator, so keeping it does not keep the iterator alive."""
        stop, thread = self._stop, self._thread
        return lambda timeout_s=60.0, quiet=False: _stop_and_join(stop, thread, timeout_s, quiet)


# work-ahead threads not yet ended, with their stop, "left the iteration" and "ended" events; a forked process
# (a DataLoader worker) starts with none: the parent's threads do not run in it, and its exit must not wait for them
_RUNNING: dict[threading.Thread, tuple[threading.Event, threading.Event, threading.Event]] = {}
os.register_at_fork(after_in_child=_RUNNING.clear)
TEARDOWN_S = 60.0  # at exit, how long a thread that left its iteration may take to drop the iterator


def _stop_at_exit(
    stop: threading.Event, left: threading.Event, ended: threading.Event, thread: threading.Thread
) -> None:
    """Stop ``thread`` when the interpreter exits, before daemon threads are cut off: one cut off inside a
    torch call that had let go of the GIL aborts the process ("terminate called without an active
    exception"; seen in ``python -m zarrtorch roofline``, which leaves loaders mid-epoch: ``benchmarks/README.md``).
    A thread that holds the last reference to a DataLoader iterator with workers shuts those workers down as it
    ends (DataLoader's own teardown, bounded by its timeouts): that is waited for too (seen: a DDP rank that
    stopped mid-epoch aborted at exit while its thread was still joining the workers)."""
    _register_stop_all()
    _RUNNING[thread] = (stop, left, ended)


@functools.cache
def _register_stop_all() -> None:
    at_exit_before_executor_joins(_stop_all)  # once per process, at the first work-ahead thread


def _stop_all(timeout_s: float = 2.0, teardown_s: float = TEARDOWN_S) -> None:
    running = list(_RUNNING.items())
    for _, (stop, _, _) in running:
        stop.set()
    for thread, (_, left, ended) in running:
        if _waited(left, timeout_s) and _waited(ended, teardown_s):  # out of the iteration, then the teardown
            with contextlib.suppress(Exception):
                thread.join(1.0)  # only its return is left
        # else stuck in a worker's batch: left to the interpreter


def _waited(event: threading.Event, timeout_s: float) -> bool:
    """Wait for ``event`` up to ``timeout_s``, through exceptions: at exit, DataLoader's SIGCHLD handler
    raises in the main thread, inside this wait, for a worker that died earlier (seen: "Exception ignored in
    atexit callback", the thread cut off). An event, not ``Thread.join``: a join interrupted so marks the
    thread as stopped while it still runs (Python 3.11)."""
    deadline = time.monotonic() + timeout_s
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            return event.wait(remaining)
        except RuntimeError:  # the handler's: that worker's batches are no longer wanted
            continue
    return event.is_set()


def _stop_and_join(stop: threading.Event, thread: threading.Thread, timeout_s: float, quiet: bool = False) -> bool:
    """Whether the thread ended within ``timeout_s`` (``quiet=False``: raise if it did not)."""
    stop.set()
    thread.join(timeout_s)
    if not thread.is_alive() or quiet:
        return not thread.is_alive()
    if thread.is_alive():
        raise RuntimeError(
            f"the work-ahead thread still waits for a batch after {timeout_s:g} s: a worker is stuck; "
            "restart the loader (a new ZarrDataLoader), or pass work_ahead=0 to debug without the thread"
        )


def _run(job: list, left: threading.Event, ended: threading.Event) -> None:
    """The thread's body: :func:`_produce`; then say it no longer iterates (``left``), drop ``job`` (the
    iterator: a DataLoader iterator referenced nowhere else shuts its workers down here), and only then count
    the thread as ended."""
    try:
        _produce(*job)
    finally:
        left.set()
        job.clear()
        _RUNNING.pop(threading.current_thread(), None)
        ended.set()


def _produce(inner: Iterator, convert: Callable | None, q: Handoff, stop: threading.Event) -> None:
    try:
        try:
            for item in inner:
                if convert is not None:
                    item = convert(item)
                if not q.put((True, item), stop):
                    return
            last = (False, StopIteration())
        except BaseException as exc:  # noqa: BLE001 (handed to the consumer, raised there)
            last = (False, exc)
        q.put(last, stop)
    finally:
        q.close()
