"""Reused buffers that go back to their pool only when nothing references them any more.

A loader allocates the same few large blocks again and again: decoded chunks, batches. A fresh block of
several MiB costs page faults every time, and the C allocator keeps freed blocks in per-thread heaps, so
a process grows well past the data it holds (``benchmarks/README.md``). Buffers from a pool are handed
out as arrays carrying a :class:`Lease`; every view of them, and every tensor ``torch.from_numpy`` makes
of them, keeps the lease alive, and the buffer returns to the pool when the last one is freed. A buffer
still in use is therefore never reused, and an empty pool allocates a new one instead of waiting. A decoded chunk
smaller than :data:`POOLED_CHUNK_BYTES` is not pooled: it is a new array.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

from zarrtorch._util import interrupts

T = TypeVar("T")

# a decoded chunk smaller than this is a new array, not a pooled one: the C allocator serves it from its heap with
# no page faults, and a lease costs more than the allocation (a WeatherBench2 row's 4 KiB chunk: 0.8 against 0.25 us)
POOLED_CHUNK_BYTES = 64 << 10


class LeasedArray(np.ndarray):
    """An array whose ``lease`` attribute (or its base's) lives as long as any view of it."""


class Lease:
    """Calls ``release`` once, when the last array carrying it is freed (in ``__del__``, where an exception is
    printed and dropped: :mod:`zarrtorch._util.interrupts` gives a Ctrl-C landing there back to the main thread)."""

    __slots__ = ("_release",)

    def __init__(self, release: Callable[[], None]):
        if sys.unraisablehook is not interrupts.installed.hook:  # once per process; inline: a lease per chunk
            interrupts.resend_dropped_interrupts()
        self._release = release

    def __del__(self):
        self._release()


def leased_view(array: np.ndarray, lease: Lease) -> LeasedArray:
    """A view of ``array`` that keeps ``lease`` alive (slices of it keep it as their base)."""
    view = array.view(LeasedArray)
    view.lease = lease
    return view


class Pool(Generic[T]):
    """Buffers made by ``make``; at most ``keep`` free ones are kept (``None``: all), and never more than were in
    use at once: a new buffer is made only when none is free."""

    def __init__(self, make: Callable[[], T], keep: int | None = 8):
        self._make, self._keep = make, keep
        self._free: list[T] = []  # list.pop/append are atomic: a lease may be freed in any thread

    def take(self) -> tuple[T, Lease]:
        """A free buffer (or a new one) and the lease that gives it back."""
        try:
            item = self._free.pop()
        except IndexError:
            item = self._make()
        return item, Lease(lambda: self._give_back(item))

    def _give_back(self, item: T) -> None:
        if self._keep is None or len(self._free) < self._keep:
            self._free.append(item)


def array_pool(shape: tuple[int, ...], dtype, keep: int | None = 8) -> Callable[[], LeasedArray]:
    """A function returning a pooled array of ``shape`` (a decoded chunk)."""
    pool = Pool(lambda: np.empty(shape, dtype=dtype), keep)

    def take() -> LeasedArray:
        array, lease = pool.take()
        return leased_view(array, lease)

    return take


def batch_pool(batch_size: int, columns: dict[str, tuple[tuple[int, ...], np.dtype]], keep: int = 8):
    """``out(rows)``: arrays of ``rows`` rows for every column, one lease for the batch (what
    :meth:`zarrtorch.buffer.SlotBuffer.apply` gathers a batch into)."""
    pool = Pool(lambda: {n: np.empty((batch_size, *shape), dtype=dt) for n, (shape, dt) in columns.items()}, keep)

    def out(rows: int) -> dict[str, LeasedArray]:
        arrays, lease = pool.take()
        return {name: leased_view(a[:rows], lease) for name, a in arrays.items()}

    return out


class Pools:
    """One process's pools, kept across epochs so that a new epoch reuses the last one's buffers instead of
    allocating (and fragmenting) again."""

    def __init__(self):
        self._pools: dict[tuple, Callable] = {}

    def __getstate__(self) -> dict:
        return {}  # buffers belong to one process: a pickled copy (a spawned worker) starts empty

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def _columns_pool(self, kind: str, rows: int, columns: dict[str, tuple[tuple[int, ...], np.dtype]], keep: int):
        """The pool of ``kind`` handing out arrays of ``rows`` rows for ``columns`` (:func:`batch_pool`)."""
        key = (kind, rows, tuple((n, tuple(s), np.dtype(d).str) for n, (s, d) in columns.items()))
        if key not in self._pools:
            self._pools[key] = batch_pool(rows, columns, keep)
        return self._pools[key]

    def chunks(self, shape: tuple[int, ...], dtype) -> Callable[[], np.ndarray]:
        """Decoded chunks of ``shape``: pooled, or new arrays where a chunk is small (:data:`POOLED_CHUNK_BYTES`).

        Every free chunk is kept: no more than the most decoded chunks held at once, which the memory budget
        counts already (the read-ahead, and with one-row chunks the shuffle buffer's rows,
        :mod:`zarrtorch.ref_buffer`). Keeping only a few let each chunk beyond them go back to the C allocator and
        a new one fault its pages in again: 0.75-1.2 page faults a 128 KiB row against 0.03-0.3 with every one
        kept (``benchmarks/README.md``, "Store layouts")."""
        if math.prod(shape) * np.dtype(dtype).itemsize < POOLED_CHUNK_BYTES:
            return functools.partial(np.empty, tuple(shape), np.dtype(dtype))
        key = ("chunk", tuple(shape), np.dtype(dtype).str)
        if key not in self._pools:
            self._pools[key] = array_pool(shape, dtype, keep=None)
        return self._pools[key]

    def slots(self, capacity: int, columns: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, LeasedArray]:
        """A shuffle buffer's arrays (:class:`zarrtorch.buffer.SlotBuffer`), back to the pool with the buffer:
        the next epoch's buffer finds its pages resident instead of faulting in tens of MiB as it fills."""
        return self._columns_pool("slots", capacity, columns, keep=1)(capacity)

    def held(self, rows: int, columns: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, LeasedArray]:
        """The arrays a worker's window batches are gathered from (:mod:`zarrtorch.held_chunks`), reused by the
        next epoch's when as large."""
        return self._columns_pool("held", rows, columns, keep=1)(rows)

    def batches(self, batch_size: int, columns: dict[str, tuple[tuple[int, ...], np.dtype]]) -> Callable:
        return self._columns_pool("batch", batch_size, columns, keep=8)
