"""Hand batches to the consumer from a background thread that stays a few batches ahead.

With ``num_workers=0`` a DataLoader builds a batch only when the training loop asks for it, so the
accelerator waits for every batch: the thread reads, decodes and shuffles the next ones while the step runs
(decoding releases the GIL, and so does a GPU step). With worker processes the batches are built ahead
already, but receiving one (DataLoader's queues, unpickling, a file descriptor per tensor) still costs the
main process about a millisecond; the thread takes that off the step too.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable, Iterator


class WorkAhead:
    """Iterate ``inner`` in a daemon thread, at most ``depth`` items ahead, each passed through ``convert``
    there when given. Errors reach the consumer with their traceback; dropping the iterator (a ``break``)
    stops the thread within a tenth of a second once its current item is in; :meth:`stopper` also waits."""

    def __init__(self, inner: Iterator, depth: int, convert: Callable | None = None):
        self.inner = inner
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, int(depth)))
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=_produce, args=(inner, convert, self._queue, self._stop), daemon=True,
                                        name="zarrtorch-work-ahead")  # fmt: skip
        self._thread.start()
        weakref.finalize(self, self._stop.set)  # the thread holds no reference to self

    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        ok, item = self._queue.get()
        if ok:
            return item
        self._finished = True
        self._stop.set()
        if isinstance(item, StopIteration):
            raise StopIteration  # a fresh one: the stored one, raised here, would hold this frame in a cycle
        try:
            raise item
        finally:
            item = None  # the error's traceback holds this frame: no cycle back to the error

    def stopper(self):
        """A function that stops the thread and waits until it no longer touches ``inner`` (before ``inner`` is
        reused, as DataLoader reuses its iterator with persistent workers); it holds no reference to this
        iterator, so keeping it does not keep the iterator alive."""
        stop, thread = self._stop, self._thread
        return lambda timeout_s=60.0: _stop_and_join(stop, thread, timeout_s)


def _stop_and_join(stop: threading.Event, thread: threading.Thread, timeout_s: float) -> None:
    stop.set()
    thread.join(timeout_s)
    if thread.is_alive():
        raise RuntimeError(
            f"the work-ahead thread still waits for a batch after {timeout_s:g} s: a worker is stuck; "
            "restart the loader (a new ZarrDataLoader), or pass work_ahead=0 to debug without the thread"
        )


def _put(q: queue.Queue, stop: threading.Event, item) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _produce(inner: Iterator, convert: Callable | None, q: queue.Queue, stop: threading.Event) -> None:
    try:
        for item in inner:
            if convert is not None:
                item = convert(item)
            if not _put(q, stop, (True, item)):
                return
        last = (False, StopIteration())
    except BaseException as exc:  # handed to the consumer, raised there
        last = (False, exc)
    _put(q, stop, last)
