"""Every use of a private or guarded part of ``torch.utils.data``, in one place, each with its reason.

``tests/core/_compat/test_torch.py`` checks each of them against the installed torch, so an upgrade that
removes or changes one fails there, loudly, rather than somewhere inside an epoch. It also names, one test
each, the documented-but-implicit DataLoader behaviour the loader counts on:

* with ``num_workers=0``, ``iter(loader)`` calls ``iter(dataset)`` at once (the loader marks the dataset as
  started by it only around that call);
* batches come from the workers in turn, worker 0 first, skipping those that ran out (``plan.round_robin_order``);
* a worker calls ``iter(dataset)`` as it starts (the epoch's first reads start there: speed only);
* ``batch_size=None`` hands each item (a whole batch) through unchanged;
* a persistent worker's copy of the dataset never sees later changes in the main process (``EpochState``);
* a dead worker is named within ``MP_STATUS_CHECK_INTERVAL`` seconds;
* shared tensors live in ``/dev/shm`` (the ring checks its room there);
* workers seed torch from the main process's generator (random transforms are reproducible).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import weakref

from torch.utils.data import DataLoader, Sampler, _utils
from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL, ExceptionWrapper
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter


def set_sampler(loader: DataLoader, sampler: Sampler) -> None:
    """Give an iterable-style DataLoader a sampler after construction.

    Why: Lightning calls ``set_epoch`` on ``loader.sampler`` every epoch and nowhere else, but DataLoader
    refuses a ``sampler=`` argument with an iterable dataset and forbids setting the attribute after
    ``__init__``; ``object.__setattr__`` bypasses that guard. DataLoader itself only iterates the sampler,
    which must then yield ``None`` forever, as its own default sampler for iterable datasets does.
    """
    object.__setattr__(loader, "sampler", sampler)


def stop_workers(loader: DataLoader, iterator, *, stuck: bool = False) -> bool:
    """Stop the worker processes of ``iterator`` now; ``False`` if it has none (``num_workers=0``).

    Why: after a worker raised (a missing chunk), DataLoader leaves its workers to the garbage collector,
    which closes their queues first; DataLoader then waits 5 s per worker before killing it, and a
    persistent loader keeps the broken iterator in ``loader._iterator`` and hands it out again.
    ``_shutdown_workers`` is what DataLoader itself calls at the end of an epoch. ``stuck``: the workers sent
    nothing within the loader's timeout; they are killed first (taken out of torch's SIGCHLD watch, which would
    raise), since ``_shutdown_workers`` waits 5 s for each one that does not end by itself, and the loader's
    timeout is said within a few seconds of its expiry, whatever the number of stuck workers.
    """
    if not isinstance(iterator, _MultiProcessingDataLoaderIter):
        return False
    if stuck:
        _kill_workers(iterator)
    for worker in worker_processes(iterator):  # a stopped one (SIGSTOP) would sit out DataLoader's 5 s join:
        if worker.is_alive():  # continued, it sees the shutdown and ends itself (a running one ignores SIGCONT)
            with contextlib.suppress(OSError):
                os.kill(worker.pid, signal.SIGCONT)
    iterator._shutdown_workers()
    for worker in worker_processes(iterator):  # DataLoader's SIGTERM waits while a worker is stopped
        worker.join(1.0)
        if worker.is_alive():
            worker.kill()
            worker.join(5.0)
    if persistent_iterator(loader) is iterator:  # persistent workers: start fresh ones next time
        forget_persistent_iterator(loader)
    return True


def _kill_workers(iterator: _MultiProcessingDataLoaderIter) -> None:
    """Kill the iterator's workers, first taken out of torch's SIGCHLD watch (which would raise for them)."""
    if iterator._worker_pids_set:
        _utils.signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False
    for worker in worker_processes(iterator):
        if worker.is_alive():
            worker.kill()
            worker.join(5.0)


def persistent_iterator(loader: DataLoader):
    """The iterator a DataLoader with persistent workers keeps between epochs (and hands out again), or ``None``.

    Why: DataLoader keeps it in the private ``_iterator`` and offers no accessor; the loader looks at its workers
    (one dead since the last epoch, one still running an earlier epoch) before it starts an epoch."""
    return getattr(loader, "_iterator", None)


def forget_persistent_iterator(loader: DataLoader) -> None:
    """Make a DataLoader with persistent workers start fresh ones at its next ``iter()``.

    Why: DataLoader creates a new iterator (and workers) when its private ``_iterator`` is ``None``; after its
    workers were stopped, the kept one would be handed out again and fail at once."""
    loader._iterator = None


class WorkersSilent(RuntimeError):
    """No batch came from a multi-process DataLoader iterator's workers within the wait :func:`bound_waits` set;
    said as DataLoader's own ``timeout=`` says it ("DataLoader timed out after N seconds")."""


def raised_in_worker(exc: BaseException) -> bool:
    """Whether ``exc`` is a DataLoader worker's error, re-raised in the main process.

    Why: DataLoader re-raises it as the worker's exception type, with its message (which the private
    ``ExceptionWrapper`` writes) as the only other trace; a message can say anything. The innermost frame of such an
    error's traceback is ``ExceptionWrapper.reraise``'s, and no other error's. The loader drops the traceback of the
    re-raising frame (it holds the loader in a cycle) only for such an error, whose message carries the worker's."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code is ExceptionWrapper.reraise.__code__


def bound_waits(iterator, timeout_s: float) -> None:
    """Make a multi-process DataLoader iterator give up on a batch after ``timeout_s`` s, still checking its
    workers' liveness every ``MP_STATUS_CHECK_INTERVAL`` s.

    Why: DataLoader's own ``timeout=`` waits on its queue for the whole timeout and looks at its workers only
    after it, so a worker killed meanwhile was named after minutes instead of seconds; its default (0) waits
    forever on a worker that is alive but sends nothing (stopped, deadlocked). ``_next_data`` (and ``_reset``,
    for persistent workers) take every batch through ``_get_data``: replaced on this instance by a loop of short
    ``_try_get_data`` waits, which check the workers each time, under one deadline (then :class:`WorkersSilent`).
    Holds the iterator weakly."""
    if not isinstance(iterator, _MultiProcessingDataLoaderIter) or not timeout_s or timeout_s <= 0:
        return
    ref = weakref.ref(iterator)

    def get_data():
        it = ref()
        deadline = time.monotonic() + timeout_s
        while True:
            if it._pin_memory and not it._pin_memory_thread.is_alive():
                raise RuntimeError("Pin memory thread exited unexpectedly")
            left = deadline - time.monotonic()
            success, data = it._try_get_data(max(0.01, min(MP_STATUS_CHECK_INTERVAL, left)))
            if success:
                return data
            if time.monotonic() >= deadline:
                raise WorkersSilent(f"DataLoader timed out after {timeout_s:g} seconds")

    iterator._get_data = get_data


def awaited_worker(iterator) -> tuple[int, object] | None:
    """(worker id, process) of the worker whose batch a multi-process DataLoader iterator waits for next, or
    ``None``. Why: DataLoader's timeout error names no worker; the iterator keeps, for each batch index it
    has asked for and not received, a one-tuple of the worker's id in the private ``_task_info``."""
    info = getattr(iterator, "_task_info", {}).get(getattr(iterator, "_rcvd_idx", None))
    workers = worker_processes(iterator)
    if not info or len(info) != 1 or not 0 <= info[0] < len(workers):
        return None
    return info[0], workers[info[0]]


def worker_processes(iterator) -> list:
    """The worker processes of a DataLoader iterator (empty with ``num_workers=0``), to watch or debug them.

    Why: DataLoader keeps them in the private ``_workers`` list and offers no public accessor.
    """
    return list(getattr(iterator, "_workers", []))


# -- the sampler through which Lightning's set_epoch reaches the loader --------------------------------------
class EpochSampler(Sampler):
    """The sampler of an iterable-style DataLoader (it yields ``None`` forever), plus ``set_epoch``.

    It holds the loader by weak reference: a loader -> sampler -> loader cycle would leave the workers'
    queues to the cyclic garbage collector, which closes them before the iterator can tell persistent
    workers to stop, and every shutdown then waits out DataLoader's 5 s join timeout per worker."""

    def __init__(self, loader):
        self._loader = weakref.ref(loader)

    def __iter__(self):
        while True:
            yield None

    def set_epoch(self, epoch: int) -> None:
        loader = self._loader()
        if loader is not None:
            loader.set_epoch(epoch)
