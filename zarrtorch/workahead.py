"""Assemble batches ahead of the consumer in a background thread, for a loader without worker processes.

With ``num_workers=0`` a DataLoader builds a batch only when the training loop asks for it, so the
accelerator waits for every batch. A thread that stays ``depth`` batches ahead lets the next batches be read,
decoded and shuffled while the step runs (decoding releases the GIL, and so does a GPU step). Worker processes
already work ahead (DataLoader's ``prefetch_factor``).
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Iterator


class WorkAhead:
    """Iterate ``inner`` in a daemon thread, at most ``depth`` items ahead. Errors reach the consumer with
    their traceback; dropping the iterator (a ``break``) stops the thread within a tenth of a second."""

    def __init__(self, inner: Iterator, depth: int):
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, int(depth)))
        self._stop = threading.Event()
        self._finished = False
        thread = threading.Thread(target=_produce, args=(inner, self._queue, self._stop), daemon=True,
                                  name="zarrtorch-work-ahead")  # fmt: skip
        thread.start()
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
        raise item


def _put(q: queue.Queue, stop: threading.Event, item) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _produce(inner: Iterator, q: queue.Queue, stop: threading.Event) -> None:
    try:
        for item in inner:
            if not _put(q, stop, (True, item)):
                return
        last = (False, StopIteration())
    except BaseException as exc:  # handed to the consumer, raised there
        last = (False, exc)
    _put(q, stop, last)
