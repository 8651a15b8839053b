"""Read the next epoch's first pieces while this epoch's shuffle buffer drains.

An epoch ends with the buffer emptying over its last batches, reading nothing, and the next one starts by
filling it again: several chunk reads before its first batches, which a fast training step waits for. A
process that lives on into the next epoch (``num_workers=0``, or ``persistent_workers=True``) instead
starts reading the next epoch's first pieces as soon as it has taken the last piece of this one, in the
read-ahead places that are then free, so no more decoded chunks are held than the stated bound.

Only for local stores: on object storage an early read is a request, billed, that the last epoch would
make for nothing, and an epoch would no longer request each of its chunks exactly once.

Which epoch comes next is a guess (the one after this, as ``set_epoch`` is called in a training loop). The
next epoch uses an early read only where it starts with the very same piece (the same rows of the same
arrays); anything else is dropped, so the batches are exactly those of a fresh start whatever the guess.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from zarrtorch.source import all_local


class EarlyReads:
    """``read(start, stop)`` of each of ``pieces``, handed to ``submit`` (the ending epoch's reading threads:
    no more threads, nor read buffers, than it had). Belongs to the process that made it: a forked or
    unpickled copy is empty."""

    def __init__(self, submit: Callable[..., Future], read: Callable[[int, int], dict], pieces: np.ndarray):
        self._pid = os.getpid()
        self._reads: deque[tuple[tuple[int, int], Future]] = deque(
            ((int(a), int(b)), submit(read, int(a), int(b))) for a, b in pieces
        )

    @property
    def pieces(self) -> list[tuple[int, int]]:
        return [piece for piece, _ in self._reads]

    def __getstate__(self) -> dict:
        return {"_pid": None, "_reads": deque()}  # reads belong to the threads of one process

    def take_leading(self, pieces: np.ndarray) -> list[Future]:
        """The reads of ``pieces``' first pieces, as far as they match in order; every other read is
        cancelled (or dropped once done). Called once, by the epoch that starts next."""
        if self._pid != os.getpid():  # a fork: the threads are not here, and their locks must not be touched
            self._reads = deque()
            return []
        taken: list[Future] = []
        wanted = [(int(a), int(b)) for a, b in pieces[: len(self._reads)]]
        while self._reads and len(taken) < len(wanted) and self._reads[0][0] == wanted[len(taken)]:
            taken.append(self._reads.popleft()[1])
        while self._reads:
            self._reads.popleft()[1].cancel()
        return taken


def reads_early(arrays: dict, *, cache: bool, lives_on: bool) -> bool:
    """Whether a process reading ``arrays`` starts its next epoch's reads as this one ends: it lives on into
    that epoch, reads every epoch (no ``cache``), and from local storage."""
    return lives_on and not cache and all_local(arrays)
