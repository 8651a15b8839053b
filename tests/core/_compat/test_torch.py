"""The private torch API zarrtorch relies on (all of it in zarrtorch/_compat/torch.py) still exists and still
behaves as that module says. A torch upgrade that changes one fails here, naming the function to update."""

import os
import tempfile
import time

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from zarrtorch._compat.torch import (
    EpochSampler,
    awaited_worker,
    forget_persistent_iterator,
    persistent_iterator,
    set_sampler,
    stop_workers,
    worker_processes,
)


class Numbers(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(6))


def test_dataloader_still_guards_sampler_so_set_sampler_is_needed():
    loader = DataLoader(Numbers(), batch_size=None)
    with pytest.raises(ValueError, match="sampler"):  # if torch ever allows this, set_sampler can be an assignment
        loader.sampler = None
    with pytest.raises(ValueError, match="sampler"):
        DataLoader(Numbers(), batch_size=None, sampler=[0])


def test_set_sampler_replaces_the_sampler_and_iteration_still_works():
    loader = DataLoader(Numbers(), batch_size=None)
    sampler = EpochSampler(loader)
    set_sampler(loader, sampler)
    assert loader.sampler is sampler
    assert [int(x) for x in loader] == list(range(6))


def test_multiprocessing_iterator_keeps_workers_and_shutdown():
    assert callable(getattr(_MultiProcessingDataLoaderIter, "_shutdown_workers", None)), (
        "torch removed DataLoader's _shutdown_workers: update zarrtorch._compat.torch.stop_workers"
    )
    loader = DataLoader(Numbers(), batch_size=None, num_workers=1, persistent_workers=True)
    it = iter(loader)
    assert isinstance(it, _MultiProcessingDataLoaderIter)
    assert persistent_iterator(loader) is it, (
        "a persistent DataLoader no longer keeps its iterator in _iterator: update zarrtorch._compat.torch"
    )
    procs = worker_processes(it)
    assert len(procs) == 1 and procs[0].is_alive(), "update zarrtorch._compat.torch.worker_processes"
    assert int(next(it)) == 0
    assert stop_workers(loader, it) is True
    procs[0].join(timeout=10)
    assert not procs[0].is_alive()
    assert persistent_iterator(loader) is None  # the next epoch starts fresh workers
    assert [int(x) for x in loader] == list(range(6))


def test_a_forgotten_persistent_iterator_is_replaced_by_a_fresh_one():
    """``forget_persistent_iterator`` sets DataLoader's ``_iterator`` to ``None``: DataLoader must then make a new
    iterator (new workers) at the next ``iter()``, instead of handing out the kept one."""
    loader = DataLoader(Numbers(), batch_size=None, num_workers=1, persistent_workers=True)
    first = iter(loader)
    assert [int(x) for x in first] == list(range(6))
    assert iter(loader) is first, "a persistent DataLoader no longer hands its kept iterator out again"
    forget_persistent_iterator(loader)
    assert persistent_iterator(loader) is None
    second = iter(loader)
    assert second is not first and persistent_iterator(loader) is second, (
        "DataLoader no longer starts afresh when _iterator is None: update zarrtorch._compat.torch"
    )
    assert [int(x) for x in second] == list(range(6))
    stop_workers(loader, first)
    stop_workers(loader, second)


def test_a_stopped_worker_is_stopped_without_waiting_out_the_join():
    """``stop_workers`` continues every live worker (SIGCONT) before DataLoader's shutdown, so that one stopped by
    SIGSTOP ends by itself instead of sitting out DataLoader's 5 s join; a running worker ignores SIGCONT."""
    import signal

    loader = DataLoader(Numbers(), batch_size=None, num_workers=2, persistent_workers=True)
    it = iter(loader)
    assert int(next(it)) == 0
    stopped = worker_processes(it)[1]
    os.kill(stopped.pid, signal.SIGSTOP)
    assert stop_workers(loader, it) is True
    for worker in worker_processes(it):
        worker.join(timeout=10)
        assert not worker.is_alive()


def test_single_process_iterator_has_no_workers():
    loader = DataLoader(Numbers(), batch_size=None)
    it = iter(loader)
    assert worker_processes(it) == []
    assert stop_workers(loader, it) is False


# -- implicit DataLoader behaviour the loader relies on, one test each -----------------------------------
class Recorded(IterableDataset):
    """Yields (worker id, k) for k in range(counts[worker]), and records when iter() was called."""

    calls: list = []

    def __init__(self, counts):
        self.counts = counts

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        Recorded.calls.append(worker)
        return iter([(worker, k) for k in range(self.counts[worker])])


def test_single_process_iterator_calls_iter_dataset_at_once():
    """ZarrDataLoader marks the dataset as 'started by the loader' only around DataLoader.__iter__: with
    num_workers=0 DataLoader must call iter(dataset) right there, not at the first next()."""
    Recorded.calls = []
    it = iter(DataLoader(Recorded([3]), batch_size=None))
    assert Recorded.calls == [0]
    assert [tuple(x) for x in it] == [(0, 0), (0, 1), (0, 2)]


def test_workers_are_taken_round_robin_skipping_those_that_ran_out():
    """zarrtorch.plan gives workers contiguous runs of a rank's batches, higher workers one more, and predicts
    the order DataLoader yields them in (round_robin_order): one from each worker in turn, worker 0 first."""
    from zarrtorch.plan import round_robin_order

    counts = [1, 3, 2]
    loader = DataLoader(Recorded(counts), batch_size=None, num_workers=3, multiprocessing_context="fork")
    order = [w for w, _ in loader]
    assert order == round_robin_order(counts).tolist() == [0, 1, 2, 1, 2, 1]


def test_a_worker_makes_its_iterator_before_the_first_index_arrives():
    """PieceReader.read_first starts an epoch's first reads when the worker's iterator is made: that happens
    as the worker starts (a speed matter only; batches do not depend on it)."""
    marker = os.path.join(tempfile.mkdtemp(), "iter-called")

    class Marks(IterableDataset):
        def __iter__(self):
            open(marker, "w").close()
            return iter([1])

    loader = DataLoader(Marks(), batch_size=None, num_workers=1, multiprocessing_context="fork")
    it = iter(loader)
    deadline = time.monotonic() + 10
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.path.exists(marker), "the worker did not call iter(dataset) before next()"
    assert list(it) == [1]


def test_batch_size_none_hands_items_through_unchanged():
    """batch_size=None turns auto-collation off: each item (a whole batch dict) goes through default_convert,
    which leaves a dict of tensors as it is (the same tensors, no copy)."""
    batch = {"x": torch.arange(4)}

    class One(IterableDataset):
        def __iter__(self):
            return iter([batch])

    (out,) = list(DataLoader(One(), batch_size=None))
    assert out["x"] is batch["x"]


def test_a_persistent_workers_dataset_copy_lives_across_epochs():
    """The epoch, resume point and topology reach persistent workers through shared memory (EpochState),
    because an attribute set in the main process after the workers started never reaches their copy."""

    class Attr(IterableDataset):
        value = 0

        def __iter__(self):
            return iter([self.value])

    ds = Attr()
    loader = DataLoader(ds, batch_size=None, num_workers=1, persistent_workers=True, multiprocessing_context="fork")
    assert list(loader) == [0]
    ds.value = 1
    assert list(loader) == [0], "persistent workers now see the main process's changes: EpochState may be simpler"


def test_a_dead_worker_is_detected_within_the_status_interval():
    """A worker killed with SIGKILL is named by DataLoader within MP_STATUS_CHECK_INTERVAL (the loader's
    work-ahead thread waits that long, at most, before it hands the error over)."""
    from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL

    assert MP_STATUS_CHECK_INTERVAL <= 5.0


def test_file_descriptor_sharing_uses_dev_shm():
    """The ring checks /dev/shm for room before it allocates: torch's default sharing strategy on Linux
    allocates shared tensors there."""
    import torch.multiprocessing as mp

    assert mp.get_sharing_strategy() in ("file_descriptor", "file_system")
    t = torch.zeros(1024).share_memory_()
    with open("/proc/self/maps") as f:
        assert any("/dev/shm/" in line for line in f)
    del t


def test_workers_seed_torch_from_the_main_generator():
    """Random transforms in workers are reproducible from torch.manual_seed in the main process: DataLoader
    draws each epoch's base seed from the main process's generator."""

    class Draw(IterableDataset):
        def __iter__(self):
            return iter([float(torch.rand(1))])

    def run():
        torch.manual_seed(0)
        return list(DataLoader(Draw(), batch_size=None, num_workers=1, multiprocessing_context="fork"))

    assert run() == run()


def test_the_awaited_worker_is_the_one_whose_batch_is_next():
    """``awaited_worker`` reads DataLoader's private ``_task_info`` / ``_rcvd_idx``: the worker whose batch comes
    next, in turn (worker 0 first), with its process; ``None`` once that batch has arrived."""
    from torch.utils.data import get_worker_info

    class SlowSecond(IterableDataset):
        def __iter__(self):
            wid = get_worker_info().id
            if wid == 1:
                time.sleep(1.5)
            return iter([wid] * 3)

    it = iter(DataLoader(SlowSecond(), batch_size=None, num_workers=2, multiprocessing_context="fork"))
    assert next(it) == 0
    wid, process = awaited_worker(it)  # worker 1 is still asleep: its batch is the one awaited
    assert wid == 1 and process is worker_processes(it)[1]
    assert next(it) == 1
    time.sleep(0.5)  # worker 0's next batch has arrived by now
    assert awaited_worker(it) is None
    del it


def test_every_batch_is_taken_through_get_data():
    """``bound_waits`` replaces ``_get_data`` on the iterator: DataLoader must take every batch (and the persistent
    workers' resume acknowledgements) through it, by way of ``_try_get_data(timeout)``."""
    import inspect

    update = "update zarrtorch._compat.torch.bound_waits"
    assert "self._get_data()" in inspect.getsource(_MultiProcessingDataLoaderIter._next_data), update
    assert "self._get_data()" in inspect.getsource(_MultiProcessingDataLoaderIter._reset), update
    parameters = list(inspect.signature(_MultiProcessingDataLoaderIter._try_get_data).parameters)
    assert parameters == ["self", "timeout"], update


def test_stuck_workers_are_killed_and_taken_out_of_the_sigchld_watch():
    """``stop_workers(stuck=True)`` kills the workers first, taken out of torch's SIGCHLD watch (its private
    ``_worker_pids_set`` and ``signal_handling._remove_worker_pids``), which would raise for a killed worker."""
    from torch.utils.data import _utils

    assert callable(getattr(_utils.signal_handling, "_remove_worker_pids", None)), (
        "torch removed signal_handling._remove_worker_pids: update zarrtorch._compat.torch.stop_workers"
    )
    loader = DataLoader(Numbers(), batch_size=None, num_workers=1)
    it = iter(loader)
    assert int(next(it)) == 0
    assert it._worker_pids_set is True, "DataLoader's iterator no longer says _worker_pids_set: update stop_workers"
    procs = worker_processes(it)
    assert stop_workers(loader, it, stuck=True) is True
    assert it._worker_pids_set is False and not procs[0].is_alive()


def test_bounded_waits_still_watch_the_pin_memory_thread():
    """``bound_waits``'s replacement of ``_get_data`` checks the pin-memory thread as DataLoader's does, through the
    iterator's private ``_pin_memory`` and ``_pin_memory_thread``."""
    import inspect

    source = inspect.getsource(_MultiProcessingDataLoaderIter._get_data)
    assert "self._pin_memory_thread.is_alive()" in source and "self._pin_memory" in source, (
        "DataLoader's _get_data no longer checks _pin_memory_thread: update zarrtorch._compat.torch.bound_waits"
    )


class Blocked(IterableDataset):
    """Worker 0 sends nothing: it waits until its process is ended."""

    def __iter__(self):
        time.sleep(120)
        return iter([0])


def test_a_bounded_wait_ends_in_workers_silent_said_as_dataloader_says_it():
    from zarrtorch._compat.torch import WorkersSilent, bound_waits

    loader = DataLoader(Blocked(), batch_size=None, num_workers=1, multiprocessing_context="fork")
    it = iter(loader)
    bound_waits(it, 0.5)
    try:
        with pytest.raises(WorkersSilent, match=r"^DataLoader timed out after 0.5 seconds$"):
            next(it)
    finally:
        stop_workers(loader, it, stuck=True)


class Failing(IterableDataset):
    def __iter__(self):
        raise FileNotFoundError("chunk 3 is missing")


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_workers_error_is_told_from_one_of_this_process(num_workers):
    """``raised_in_worker`` reads DataLoader's re-raised message ("... Original Traceback ..."), private to torch."""
    from zarrtorch._compat.torch import raised_in_worker

    context = {"multiprocessing_context": "fork"} if num_workers else {}
    with pytest.raises(FileNotFoundError, match="chunk 3 is missing") as err:
        list(DataLoader(Failing(), batch_size=None, num_workers=num_workers, **context))
    assert raised_in_worker(err.value) is bool(num_workers), (
        "DataLoader no longer says 'Original Traceback' in a worker's re-raised error: update "
        "zarrtorch._compat.torch.raised_in_worker"
    )


class _Failing(IterableDataset):
    def __iter__(self):
        raise KeyError("from the worker")


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_workers_error_is_told_from_this_process_own_by_where_it_was_raised(num_workers):
    """``raised_in_worker`` tells a worker's error, raised again here by DataLoader, from one of this process's own,
    whatever its message says: the loader then drops the frame that holds it, not the traceback of its own errors."""
    from zarrtorch._compat.torch import raised_in_worker

    with pytest.raises(KeyError) as err:
        next(iter(DataLoader(_Failing(), batch_size=None, num_workers=num_workers)))
    assert raised_in_worker(err.value) == (num_workers > 0)
    try:
        raise RuntimeError("Original Traceback (most recent call last): a message alone is not a worker's")
    except RuntimeError as own:
        assert not raised_in_worker(own)
