"""The sampler a :class:`zarrtorch.ZarrDataLoader` hands to DataLoader: where Lightning's ``set_epoch`` lands."""

from __future__ import annotations

import weakref

from torch.utils.data import Sampler


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
