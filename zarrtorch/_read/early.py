"""Read the next epoch's first pieces while this epoch's shuffle buffer drains.

An epoch ends with the buffer emptying over its last batches, reading nothing, and the next one starts by
filling it again: several chunk reads before its first batches, which a fast training step waits for. A
process that lives on into the next epoch (``num_workers=0``, or ``persistent_workers=True``) instead
starts reading the next epoch's first pieces as soon as it has taken the last piece of this one, in the
read-ahead places that are then free. As the buffer drains, each finished read is copied into the
buffer's emptied end and its chunk freed for the next read, so the next epoch finds its first rows in
place: no more decoded chunks are held than the stated bound, and no second buffer.

The next epoch uses the buffer's arrays the other way round (row ``i`` of the next epoch is row
``capacity - 1 - i`` of this one): its first rows then lie where this epoch's last rows are not, and a
buffer that fills from its start writes each row at or before the place its copy waits, so no row is
overwritten before it is used (:meth:`zarrtorch.buffer.SlotBuffer.apply`).

Only for local stores, and for the chunks the node's chunk cache listed (read from its files): on object
storage an early read is a request, billed, that the last epoch would make for nothing, and an epoch would no
longer request each of its chunks exactly once.

Which epoch comes next is a guess (the one after this, as ``set_epoch`` is called in a training loop). The
next epoch uses an early read only where it starts with the very same pieces (the same rows of the same
arrays); anything else is dropped, so the batches are exactly those of a fresh start whatever the guess.
"""

from __future__ import annotations

import inspect
import os
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from zarrtorch._read.cache import reads_through_cache
from zarrtorch._read.source import all_local


def flipped(slots: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same arrays, rows in reverse order (views: nothing is copied)."""
    return {name: column[::-1] for name, column in slots.items()}


class EarlyReads:
    """``read(start, stop)`` of ``pieces`` in order, at most ``in_flight`` at a time (all of them if not
    given), handed to ``submit`` (the ending epoch's reading threads: no more threads, nor read buffers,
    than it had). Belongs to the process that made it: a forked or unpickled copy is empty.

    A ``read`` that is a reader's method is held weakly: the reader holds these reads, and a cycle between them
    would keep the reads' decoded chunks (and whatever holds the reader) alive after the loader is dropped,
    until the cyclic garbage collector ran. Once the reader is gone, no further piece is read early."""

    def __init__(
        self,
        submit: Callable[..., Future],
        read: Callable[[int, int], dict],
        pieces: np.ndarray,
        in_flight: int | None = None,
    ):
        self._pid, self._submit, self._todo = os.getpid(), submit, np.asarray(pieces)
        self._read = weakref.WeakMethod(read) if inspect.ismethod(read) else (lambda: read)
        self._reads: deque[tuple[tuple[int, int], Future]] = deque()
        self._submitted = 0
        self._staged: list[tuple[int, int]] = []  # pieces copied into ``_slots``, rows 0, 1, ... in order
        self._slots: dict[str, np.ndarray] | None = None
        self._staged_rows = 0
        for _ in range(len(self._todo) if in_flight is None else in_flight):
            self._submit_next()

    def _submit_next(self) -> None:
        if self._submitted < len(self._todo):
            a, b = (int(v) for v in self._todo[self._submitted])
            read = self._read()
            try:
                if read is None:
                    raise RuntimeError("the reader is gone")
                self._reads.append(((a, b), self._submit(read, a, b)))
            except RuntimeError:  # the threads were shut down (the epoch stopped), or the reader: read no further
                self._todo = self._todo[:0]
                return
            self._submitted += 1

    @property
    def pieces(self) -> list[tuple[int, int]]:
        """The pieces read early: those already in a buffer, then those read or being read."""
        return self._staged + [piece for piece, _ in self._reads]

    def __getstate__(self) -> dict:
        return {}  # reads belong to the threads of one process

    def __setstate__(self, state: dict) -> None:
        self.__init__(None, None, np.empty((0, 2), np.int64))
        self._pid = None

    def stage(self, slots: dict[str, np.ndarray], free_rows: int) -> None:
        """Copy the finished reads, in order, into ``slots`` (the ending epoch's shuffle buffer) read the
        other way round, while they fit in the ``free_rows`` rows at its end that this epoch will not use
        again; each copied read lets its chunk go and the next piece's read start. Never waits for a read."""
        if self._pid != os.getpid():
            return
        if self._slots is None:
            self._slots = flipped(slots)
        while self._reads:
            (a, b), read = self._reads[0]
            if not read.done() or read.cancelled() or read.exception() is not None:
                return  # a failed read raises in the epoch that takes it
            if self._staged_rows + (b - a) > free_rows:
                return
            for name, rows in read.result().items():
                self._slots[name][self._staged_rows : self._staged_rows + b - a] = rows
            self._staged.append((a, b))
            self._staged_rows += b - a
            self._reads.popleft()
            read = None
            self._submit_next()

    def take_staged(self, pieces: np.ndarray) -> tuple[dict[str, np.ndarray] | None, int]:
        """The buffer arrays (the way round the next epoch reads them) holding ``pieces``' first ``k``
        pieces in order from row 0, and ``k``; ``(None, 0)`` when they are not exactly those pieces.
        Called once, by the epoch that starts next, before :meth:`take_leading` of the pieces after them."""
        slots, staged = self._slots, self._staged
        self._slots, self._staged, self._staged_rows = None, [], 0
        if self._pid != os.getpid() or not staged or len(pieces) < len(staged):
            return None, 0
        if [(int(a), int(b)) for a, b in pieces[: len(staged)]] != staged:
            return None, 0
        return slots, len(staged)

    def take_leading(self, pieces: np.ndarray) -> list[Future]:
        """The reads of ``pieces``' first pieces, as far as they match in order; every other read is
        cancelled (or dropped once done). Called once, by the epoch that starts next."""
        self._todo, self._slots, self._staged = self._todo[:0], None, []  # nothing more is read or staged
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


def staged_pieces(slots: dict[str, np.ndarray], pieces: np.ndarray, names) -> list[dict[str, np.ndarray]]:
    """The data of ``pieces`` (:meth:`EarlyReads.take_staged`) as views of the buffer rows that hold them,
    one dict per piece as a reader yields it."""
    out, row = [], 0
    for a, b in pieces:
        out.append({name: slots[name][row : row + int(b - a)] for name in names})
        row += int(b - a)
    return out


def reads_early(arrays: dict, *, cache: bool, lives_on: bool) -> bool:
    """Whether a process reading ``arrays`` starts its next epoch's reads as this one ends: it lives on into
    that epoch, reads every epoch (no ``cache``), and from local storage or the node's chunk cache (of which only
    the pieces the cache's listing holds are read early, from its files:
    :meth:`~zarrtorch._read.reader.PieceReader.early_reads`)."""
    through_cache = bool(arrays) and all(reads_through_cache(a) for a in arrays.values())
    return lives_on and not cache and (all_local(arrays) or through_cache)
