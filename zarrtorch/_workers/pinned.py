"""Batches gathered straight into page-locked memory: ``pin_memory=True`` with ``num_workers=0``, without a copy.

DataLoader's ``pin_memory=True`` copies every batch into page-locked (pinned) host memory, from which
``.to("cuda", non_blocking=True)`` is one DMA that overlaps the training step. With no workers the batch is
gathered in this process anyway: gathered into a slot of a small ring of pinned memory that the loader owns, it
is pinned already, and DataLoader's pinning hands it on as it is (``Tensor.pin_memory()`` of a pinned tensor is
that tensor): the copy is gone, and a batch's bytes are written once, where it is gathered.

**Slot lifetime**, as in the workers' ring (:mod:`zarrtorch._workers.ring`): a batch holds its slot while
anything references it (a tensor, a view, a ``.numpy()`` array; :class:`zarrtorch._util.pool.Lease`), and the
slot is reused once the last of them is freed. A loop that keeps batches (``list(loader)``) keeps their slots;
once all of them are held, the next batches are gathered into the process's ordinary pooled arrays, which
DataLoader then copies into pinned memory as it always did: the loader never waits for a slot and never
overwrites a batch. The slots are taken at the first batch, not when the loader is built.

**A copy still in flight.** ``.to("cuda", non_blocking=True)`` returns as soon as the copy is queued, and a loop
that drops the host batch at once frees its slot while the GPU may still be reading it. Where CUDA runs, freeing
a slot records a CUDA event on the stream current in the thread that frees it (the one the training loop queued
its copies on), and the slot is written again only once that event has passed. A copy queued on another stream
than the one current where the batch is dropped must be waited for by the code that queued it, as for any
pinned memory reused (``torch.Tensor.record_stream``, ``torch.cuda.Stream.synchronize``).

**Memory.** The slots are one block from PyTorch's pinned-memory allocator, which rounds a block up to a power of
two: :attr:`PinnedSlots.nbytes` counts that, and :func:`zarrtorch.loader_memory` counts :attr:`PinnedSlots.nbytes`.
Pinned memory cannot be swapped out; a few batches of it is what DataLoader's own pinning holds too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from zarrtorch._util.pool import Lease, leased_view
from zarrtorch._workers.ring import ring_slots

ALIGN = 64  # each column of a slot starts on a cache line


def page_locked(nbytes: int) -> torch.Tensor:
    """``nbytes`` of page-locked host memory (PyTorch's pinned-memory allocator; needs CUDA)."""
    return torch.empty(int(nbytes), dtype=torch.uint8, pin_memory=True)


def pinned_memory() -> tuple[Callable[[int], torch.Tensor], bool] | None:
    """How this process allocates pinned memory, and whether CUDA events guard a slot's reuse: where CUDA is
    available, :func:`page_locked` and yes; else ``None`` (a CPU-only torch refuses ``pin_memory()``; a test
    substitutes an ordinary allocation here to follow a batch into its slot)."""
    return (page_locked, True) if torch.cuda.is_available() else None


def allocated_bytes(nbytes: int) -> int:
    """What PyTorch's pinned-memory allocator takes for a block of ``nbytes``: the next power of two."""
    return 1 << max(0, int(nbytes) - 1).bit_length() if nbytes > 0 else 0


def _aligned(n: int) -> int:
    return -(-int(n) // ALIGN) * ALIGN


class PinnedSlots:
    """``slots`` batches of ``batch_size`` rows of ``columns`` (row shape, dtype) in one block of page-locked
    memory (``allocate(nbytes)`` gives it, :func:`pinned_memory`); ``events``: each slot's reuse waits for a CUDA
    event (see the module's text)."""

    def __init__(
        self,
        batch_size: int,
        columns: dict[str, tuple[tuple[int, ...], np.dtype]],
        slots: int,
        *,
        allocate: Callable[[int], torch.Tensor],
        events: bool,
    ):
        self.batch_size, self.slots = int(batch_size), max(1, int(slots))
        self.columns = {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in columns.items()}
        self._allocate = allocate
        self._events = bool(events)
        self.block: torch.Tensor | None = None  # taken at the first batch (:meth:`out`)
        self._arrays: list[dict[str, np.ndarray]] = []
        self._free: list[int] = []  # a stack (atomic pop/append): a lease is freed in any thread
        self._after: dict[int, object] = {}  # slot -> the CUDA event its last batch's copies end before

    def _column_bytes(self, name: str) -> int:
        shape, dtype = self.columns[name]
        return _aligned(self.batch_size * math.prod(shape) * dtype.itemsize)

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot: every column of a batch, each on its own cache line."""
        return sum(self._column_bytes(name) for name in self.columns)

    @property
    def nbytes(self) -> int:
        """Pinned memory the slots take, as the allocator rounds the block (whether taken yet or not)."""
        return allocated_bytes(self.slots * self.slot_bytes)

    def allocate(self) -> None:
        """Take the block and cut it into slots, once."""
        if self.block is not None:
            return
        need = self.slots * self.slot_bytes
        block = self._allocate(need)
        if block.dtype != torch.uint8 or block.dim() != 1 or not block.is_contiguous() or block.numel() < need:
            raise RuntimeError(f"zarrtorch internal error: a pinned block must be {need} contiguous bytes")
        memory = block.numpy()
        at = 0
        for _ in range(self.slots):
            slot = {}
            for name, (shape, dtype) in self.columns.items():
                n = self.batch_size * math.prod(shape) * dtype.itemsize
                slot[name] = memory[at : at + n].view(dtype).reshape(self.batch_size, *shape)
                at += self._column_bytes(name)
            self._arrays.append(slot)
        self.block = block
        self._free = list(range(self.slots - 1, -1, -1))  # the lowest slots first

    def out(self, rows: int) -> dict[str, np.ndarray] | None:
        """Where the next batch of ``rows`` rows is gathered: a free slot's arrays, one lease for the batch
        (``None`` when every slot is held: the caller gathers into ordinary memory)."""
        self.allocate()
        try:
            slot = self._free.pop()
        except IndexError:
            return None
        after = self._after.pop(slot, None)
        if after is not None:
            after.synchronize()  # the GPU copies of the slot's last batch are done (at once, unless still running)
        lease = Lease(partial(self._release, slot))
        return {name: leased_view(array[:rows], lease) for name, array in self._arrays[slot].items()}

    def _release(self, slot: int) -> None:
        """The slot's batch is referenced no more: free once the copies queued before now on this thread's
        stream are done. A slot whose event cannot be recorded is not reused (at exit: nothing needs it)."""
        if self._events:
            try:
                event = torch.cuda.Event()
                event.record()
            except Exception:  # noqa: BLE001 (in a finalizer: nothing to tell; the slot stays out of use)
                return
            self._after[slot] = event
        self._free.append(slot)

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s memory lies inside one slot of the block (no copy was made of it)."""
        if self.block is None or tensor.numel() == 0:
            return False
        start, base = tensor.data_ptr(), self.block.data_ptr()
        slot = (start - base) // self.slot_bytes
        return start >= base and slot < self.slots and start + _span(tensor) <= base + (slot + 1) * self.slot_bytes


def _span(tensor: torch.Tensor) -> int:
    """Bytes from a tensor's first element to the end of its last one."""
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    return (last + 1) * tensor.element_size()


def pinned_slot_count(work_ahead: int) -> int:
    """Slots so that a consumer that keeps up never falls back to ordinary memory: the batches received and
    not yet freed (those waiting in the work-ahead thread, +1 in its hands, the consumer's current and previous
    ones and one more a trainer prefetches), and one spare (:func:`zarrtorch._workers.ring.ring_slots`)."""
    return ring_slots(0, work_ahead, 1)


def make_pinned(data, batch_size: int, num_workers: int, work_ahead: int, pin_memory: bool) -> PinnedSlots | None:
    """The pinned slots of a loader over ``data``: with ``pin_memory=True``, no workers (with workers the
    batches come through shared slots: :mod:`zarrtorch._workers.ring`), where memory can be pinned
    (:func:`pinned_memory`), and no ``stack`` (a stacked batch is new memory, not the slot); else ``None``."""
    memory = pinned_memory() if pin_memory and not num_workers and not data.stack else None
    if memory is None:
        return None
    allocate, events = memory
    return PinnedSlots(batch_size, data.batch_columns, pinned_slot_count(work_ahead), allocate=allocate, events=events)
