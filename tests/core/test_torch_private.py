"""The private torch API zarrtorch relies on (all of it in zarrtorch/torch_private.py) still exists and still
behaves as that module says. A torch upgrade that changes one fails here, by name."""

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from zarrtorch.loader import EpochSampler
from zarrtorch.torch_private import set_sampler, stop_workers, worker_processes


class Numbers(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(6))


def test_dataloader_still_guards_sampler_so_set_sampler_is_needed():
    loader = DataLoader(Numbers(), batch_size=None)
    with pytest.raises(ValueError, match="sampler"):
        loader.sampler = None  # if torch ever allows this, set_sampler can become a plain assignment
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
        "torch removed DataLoader's _shutdown_workers: update zarrtorch.torch_private.stop_workers"
    )
    loader = DataLoader(Numbers(), batch_size=None, num_workers=1, persistent_workers=True)
    it = iter(loader)
    assert isinstance(it, _MultiProcessingDataLoaderIter)
    assert loader._iterator is it, "persistent DataLoader no longer caches its iterator in _iterator"
    procs = worker_processes(it)
    assert len(procs) == 1 and procs[0].is_alive()
    assert int(next(it)) == 0
    assert stop_workers(loader, it) is True
    procs[0].join(timeout=10)
    assert not procs[0].is_alive()
    assert loader._iterator is None  # the next epoch starts fresh workers
    assert [int(x) for x in loader] == list(range(6))


def test_single_process_iterator_has_no_workers():
    loader = DataLoader(Numbers(), batch_size=None)
    it = iter(loader)
    assert worker_processes(it) == []
    assert stop_workers(loader, it) is False
