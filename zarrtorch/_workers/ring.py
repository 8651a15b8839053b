"""Batches from worker processes to the main process through preallocated shared memory.

PyTorch moves each batch a worker yields through a queue: a new shared-memory segment per tensor (page
faults and a copy in the worker), a file descriptor passed, a mapping in the main process. For batches of
several MiB that costs about as much CPU as decoding them (``benchmarks/README.md``). Here every worker
owns a ring of batch slots allocated once, in shared memory, by the main process; the worker gathers a
batch's rows straight into a free slot and sends only ``(worker, slot, rows)``; the main process wraps the
slot as tensors without copying (the CPU cost per sample of both ways: ``benchmarks/README.md``).

**Batch lifetime.** A batch is an ordinary set of tensors, valid as long as anything references it: its
slot returns to the ring only when the last tensor (or view, or ``.numpy()`` array) of the batch is freed.
A training loop that uses each batch and moves on recycles the slots; code that keeps batches
(``list(loader)``) keeps their slots, and once a worker finds all of its slots held it sends its next
batches through DataLoader's queue instead, so it never waits and never overwrites a batch. With
``pin_memory=True`` on an accelerator the batch is copied into pinned memory and its slot freed at once.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from zarrtorch._util.pool import Lease, leased_view
from zarrtorch._util.sizes import ceil_div

REF = "__zarrtorch_ring__"  # the key of what a worker sends instead of a batch: [worker, slot, rows]
FREE = 0
HELD = np.iinfo(np.int32).max  # received by the main process: only the batch's last reference frees it


@dataclass(frozen=True)
class RingShape:
    workers: int
    slots: int
    batch_size: int
    columns: tuple[tuple[str, tuple[int, ...], str], ...]  # (name, row shape, dtype)


class BatchRing:
    """``slots`` batch slots per worker for every column; see the module's text for the batch lifetime.

    A slot's state (``busy``, shared): ``FREE``; the epoch generation whose worker wrote it (a generation
    older than the current one means the batch was never received, as when an epoch stops early: free
    again); ``HELD`` once the main process handed it out, until the batch's last reference is freed."""

    def __init__(self, shape: RingShape):
        self.shape = shape
        self.data: dict[str, torch.Tensor] | None = None  # allocated by the first epoch (:meth:`allocate`)
        self.busy: torch.Tensor | None = None
        self.generation: torch.Tensor | None = None
        self._next = 0  # worker side: the slot to try first (each worker process has its own copy)

    @property
    def nbytes(self) -> int:
        """Shared memory the slots take, all workers together (whether allocated yet or not)."""
        rows = self.shape.workers * self.shape.slots * self.shape.batch_size
        return sum(rows * math.prod(row) * np.dtype(dtype).itemsize for _, row, dtype in self.shape.columns)

    def allocate(self) -> None:
        """Take the shared memory, once, when the first epoch starts (not when the loader is built: a loader
        made and never iterated, or one of several made in a notebook, holds none). Refuses with what to do
        when ``/dev/shm`` cannot hold the slots (a container's default is 64 MiB)."""
        if self.data is not None:
            return
        need = self.nbytes + self.shape.workers * self.shape.slots * 4 + 4
        free = shm_free_bytes()
        if free is not None and need > free:
            raise RuntimeError(shm_message(need, f"{free / 2**20:.0f} MiB are free there"))
        try:
            data = {
                name: torch.from_numpy(
                    np.zeros((self.shape.workers, self.shape.slots, self.shape.batch_size, *row), dtype=dtype)
                ).share_memory_()  # zeros: pages touched once here, not at every batch
                for name, row, dtype in self.shape.columns
            }
            busy = torch.zeros((self.shape.workers, self.shape.slots), dtype=torch.int32).share_memory_()
            generation = torch.zeros(1, dtype=torch.int32).share_memory_()
        except (RuntimeError, OSError, MemoryError) as exc:
            raise RuntimeError(shm_message(need, f"allocating them failed: {type(exc).__name__}: {exc}")) from exc
        self.data, self.busy, self.generation = data, busy, generation

    # -- worker side --------------------------------------------------------------------------------
    def claim(self, worker: int, generation: int) -> int | None:
        """A free slot of ``worker``, marked as written by ``generation``; ``None`` if the consumer holds
        them all (the batch then goes through the queue)."""
        states = self.busy.numpy()[worker]
        for k in range(self.shape.slots):
            slot = (self._next + k) % self.shape.slots
            if states[slot] == FREE or states[slot] < generation:
                states[slot] = generation
                self._next = slot + 1
                return slot
        return None

    def slot_arrays(self, worker: int, slot: int, rows: int) -> dict[str, np.ndarray]:
        """Where a worker writes a batch of ``rows`` rows: one array per column."""
        return {name: t.numpy()[worker, slot, :rows] for name, t in self.data.items()}

    def writer(self, worker: int) -> RingWriter:
        return RingWriter(self, worker, int(self.generation))

    # -- main side ----------------------------------------------------------------------------------
    def receive(self, batch, keep: set[str] | None = None, copy=None):
        """The batch a reference points to (a batch without one is returned as is), as tensors over its
        slot, which stays held until the last of them is freed. ``copy(batch)``, when given, makes the
        copy the consumer gets, and the slot is freed at once."""
        ref = batch.get(REF) if isinstance(batch, dict) else None
        if ref is None:
            return batch
        worker, slot, rows = (int(v) for v in ref)
        names = [name for name in self.data if keep is None or name in keep]
        if copy is not None:
            out = copy({name: self.data[name][worker, slot, :rows] for name in names})
            self.busy[worker, slot] = FREE
            return out
        return {name: torch.from_numpy(array) for name, array in self.held(worker, slot, rows, names).items()}

    def held(self, worker: int, slot: int, rows: int, names) -> dict[str, np.ndarray]:
        """The first ``rows`` rows of a slot's ``names`` columns, as arrays that hold it: the slot becomes free
        for its worker again only once the last of them (and every view of them) is freed."""
        states = self.busy.numpy()
        states[worker, slot] = HELD
        lease = Lease(partial(states.__setitem__, (worker, slot), FREE))  # one for the whole batch
        return {name: leased_view(self.data[name].numpy()[worker, slot, :rows], lease) for name in names}

    def start_epoch(self) -> None:
        """Before an epoch's workers start (or resume): batches written and never received become free."""
        self.allocate()
        self.generation += 1


class RingWriter:
    """One worker's side for one epoch: ``out(rows)`` gives the arrays the next batch is gathered into
    (``None`` when no slot is free), ``send(batch, to_torch)`` what to send for it."""

    def __init__(self, ring: BatchRing, worker: int, generation: int):
        self.ring, self.worker, self.generation = ring, worker, generation
        self._last: tuple[int, int] | None = None

    def out(self, rows: int) -> dict[str, np.ndarray] | None:
        if rows > self.ring.shape.batch_size:  # more rows than a slot holds: through the queue
            self._last = None
            return None
        slot = self.ring.claim(self.worker, self.generation)
        self._last = None if slot is None else (slot, rows)
        return None if slot is None else self.ring.slot_arrays(self.worker, slot, rows)

    @property
    def last_arrays(self) -> dict[str, np.ndarray]:
        """The slot arrays of the last batch (when :attr:`in_slot`)."""
        slot, rows = self._last
        return self.ring.slot_arrays(self.worker, slot, rows)

    @property
    def in_slot(self) -> bool:
        """Whether the last batch was gathered into a slot (else it went into fresh arrays, or is a view)."""
        return self._last is not None

    def send(self, batch, to_torch):
        """Plain ints, pickled by value, for a batch in a slot (a tensor would travel through a
        shared-memory segment and a file descriptor of its own); the batch itself otherwise."""
        if self._last is None:
            return to_torch(batch)
        return {REF: self.reference}

    @property
    def reference(self) -> list[int]:
        """``[worker, slot, rows]`` of the last batch (when :attr:`in_slot`): what the main process finds it by."""
        slot, rows = self._last
        return [int(self.worker), int(slot), int(rows)]


SHM = "/dev/shm"


def shm_free_bytes(path: str = SHM) -> int | None:
    """Bytes free in the shared-memory file system PyTorch allocates from (``None`` where there is none)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def shm_message(need: int, why: str) -> str:
    return (
        f"the ring of shared-memory slots of this ZarrDataLoader needs {need / 2**20:.0f} MiB of shared memory in "
        f"{SHM}, and "
        f"{why}. Pass transport='queue' (DataLoader's own way: one segment per batch in flight), use fewer "
        "workers or a smaller batch, or give the container more shared memory (docker run --shm-size=2g; "
        "Kubernetes: an emptyDir with medium Memory mounted on /dev/shm)"
    )


def ring_slots(prefetch_factor: int, work_ahead: int, workers: int) -> int:
    """Slots per worker so that a consumer which keeps up never sends a batch through the queue: the
    ``prefetch_factor`` batches DataLoader lets a worker have in flight (the one being written included),
    plus this worker's share of the batches received and not yet freed, which DataLoader hands out from
    the workers in turn: those waiting in the work-ahead thread (+1 in its hands), the consumer's current
    and previous ones and one more a trainer prefetches; and one spare."""
    received = (work_ahead + 1 if work_ahead else 0) + 2 + 1
    return prefetch_factor + ceil_div(received, max(1, workers)) + 1


def make_ring(
    data, batch_size: int, num_workers: int, prefetch_factor: int, work_ahead: int, transport: str | None
) -> BatchRing | None:
    """The ring for a loader over ``data`` (the default with workers), or ``None`` where batches do not go through
    one: ``transport="queue"``, no workers, or a ``transform``/``stack`` that changes what a batch holds after
    it is gathered."""
    if transport == "queue" or num_workers == 0 or data.transform is not None or data.stack:
        return None
    columns = tuple((name, shape, str(dtype)) for name, (shape, dtype) in data.batch_columns.items())
    slots = ring_slots(prefetch_factor, work_ahead, num_workers)
    return BatchRing(RingShape(num_workers, slots, batch_size, columns))


def pin_copy(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch copied into pinned memory (what ``pin_memory=True`` asks for)."""
    return {name: t.pin_memory() for name, t in batch.items()}
