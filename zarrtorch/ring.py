"""Batches from worker processes to the main process through preallocated shared memory.

PyTorch moves each batch a worker yields through a queue: a new shared-memory segment per tensor (page
faults and a copy in the worker), a file descriptor passed, a mapping in the main process. For batches of
several MiB that costs about as much CPU as decoding them (``benchmarks/README.md``). Here every worker
owns a ring of batch slots allocated once, in shared memory, by the main process; the worker gathers a
batch's rows straight into its next free slot and sends only ``(worker, slot, rows)``; the main process
wraps the slot as tensors without copying (with 2 workers on the 1 GiB benchmark array: 142 CPU us/sample
against 236-272 through the queue).

**Batch lifetime.** A batch's tensors are views of a slot, valid until the loader has handed out ``hold``
(3) more batches; an epoch's start also frees every slot. ``list(loader)`` would therefore hold overwritten
batches, which is why the ring is opt-in (``transport="ring"``) for a training loop that uses each batch
and moves on. Keep a batch longer by copying it (``.clone()``); with ``pin_memory=True`` the loader copies
each batch into pinned memory (a copy the queue would make too), so there is no constraint and the ring is
the default then. A worker whose slots are all still held waits, then raises after ``wait_s`` seconds with
this explanation.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

REF = "__zarrtorch_ring__"  # the key of what a worker sends instead of a batch: [worker, slot, rows]


@dataclass(frozen=True)
class RingShape:
    workers: int
    slots: int
    batch_size: int
    columns: tuple[tuple[str, tuple[int, ...], str], ...]  # (name, row shape, dtype)


class BatchRing:
    """``slots`` batch slots per worker for every column; see the module's text for the batch lifetime."""

    def __init__(self, shape: RingShape, *, hold: int = 2, wait_s: float = 300.0):
        self.shape, self.hold, self.wait_s = shape, hold, wait_s
        self.data = {
            name: torch.from_numpy(
                np.zeros((shape.workers, shape.slots, shape.batch_size, *row), dtype=dtype)
            ).share_memory_()  # zeros: pages touched once here, not at every batch
            for name, row, dtype in shape.columns
        }
        # busy[w, s] = the epoch generation that wrote the slot and has not freed it; 0 or an older
        # generation = free (every batch of an earlier epoch was consumed or discarded before this one)
        self.busy = torch.zeros((shape.workers, shape.slots), dtype=torch.int32).share_memory_()
        self.generation = torch.zeros(1, dtype=torch.int32).share_memory_()
        self._next = 0  # worker side: the slot to try first (each worker process has its own copy)
        self._handed: deque[tuple[int, int]] = deque()  # main side: slots of batches handed out, oldest first

    # -- worker side --------------------------------------------------------------------------------
    def claim(self, worker: int, generation: int) -> int:
        """The worker's next free slot, marked busy; waits while the consumer still holds them all."""
        busy = self.busy.numpy()
        deadline = time.monotonic() + self.wait_s
        while True:
            for k in range(self.shape.slots):
                slot = (self._next + k) % self.shape.slots
                if busy[worker, slot] != generation:
                    busy[worker, slot] = generation
                    self._next = slot + 1
                    return slot
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"worker {worker} found none of its {self.shape.slots} batch slots freed for {self.wait_s:g} s: "
                    "batches are views of shared slots, freed once the loader has received "
                    f"{self.hold} more batches. Iterate on (a stalled consumer?), or copy batches you keep."
                )
            time.sleep(0.0005)

    def slot_arrays(self, worker: int, slot: int, rows: int) -> dict[str, np.ndarray]:
        """Where a worker writes a batch of ``rows`` rows: one array per column."""
        return {name: t.numpy()[worker, slot, :rows] for name, t in self.data.items()}

    def reference(self, worker: int, slot: int, rows: int) -> dict[str, list[int]]:
        """Plain ints, pickled by value: a tensor would travel through a shared-memory segment and a file
        descriptor of its own, which costs the main process about a millisecond per batch."""
        return {REF: [int(worker), int(slot), int(rows)]}

    # -- main side ----------------------------------------------------------------------------------
    def receive(self, batch: dict, keep: set[str] | None = None, copy=None) -> dict[str, torch.Tensor]:
        """The batch a reference points to (a batch without one is returned as is), as views of its slot;
        frees the slots of batches handed out ``hold`` batches ago. ``copy(batch)``, when given, makes
        the copy the consumer gets, and the slot is freed at once."""
        ref = batch.get(REF) if isinstance(batch, dict) else None
        if ref is None:
            return batch
        worker, slot, rows = (int(v) for v in ref)
        out = {name: t[worker, slot, :rows] for name, t in self.data.items() if keep is None or name in keep}
        if copy is not None:
            out = copy(out)
            self.busy[worker, slot] = 0
            return out
        self._handed.append((worker, slot))
        while len(self._handed) > self.hold:
            self.busy[self._handed.popleft()] = 0
        return out

    def start_epoch(self) -> None:
        """Before an epoch's workers start (or resume): slots written in earlier epochs count as free."""
        self._handed.clear()
        self.generation += 1

    def writer(self, worker: int) -> RingWriter:
        return RingWriter(self, worker, int(self.generation))


class RingWriter:
    """One worker's side for one epoch: ``out(rows)`` gives the arrays the next batch is gathered into,
    ``reference()`` what to send for it."""

    def __init__(self, ring: BatchRing, worker: int, generation: int):
        self.ring, self.worker, self.generation = ring, worker, generation
        self._last: tuple[int, int] | None = None

    def out(self, rows: int) -> dict[str, np.ndarray]:
        slot = self.ring.claim(self.worker, self.generation)
        self._last = (slot, rows)
        return self.ring.slot_arrays(self.worker, slot, rows)

    def reference(self) -> dict[str, list[int]]:
        slot, rows = self._last
        return self.ring.reference(self.worker, slot, rows)


def ring_slots(prefetch_factor: int, hold: int) -> int:
    """Slots per worker that never make a worker wait on a consumer that keeps up: the batches DataLoader
    lets a worker have in flight, the ones received and not yet freed, and the one being written."""
    return prefetch_factor + hold + 1


def make_ring(dataset, config, prefetch_factor: int, work_ahead: int, transport: str | None,
              pinned: bool) -> BatchRing | None:  # fmt: skip
    """The ring for a loader, or ``None`` where batches do not go through one: ``transport="queue"`` (the
    default unless batches are copied into pinned memory anyway), no workers, or a ``transform``/``stack``
    that changes what a batch holds after it is gathered."""
    if (transport or ("ring" if pinned else "queue")) == "queue":
        return None
    if config.num_workers == 0 or dataset.transform is not None or dataset.stack:
        return None
    columns = (("index", (), "int64"),) + tuple(
        (name, tuple(a.shape[1:]), str(np.dtype(a.dtype))) for name, a in dataset.arrays.items()
    )
    # batches are received in the work-ahead thread, up to work_ahead (+1 in its hands) before the consumer
    # gets them: a slot is freed that much later, so that it is still 3 batches after the consumer's
    hold = 3 + (work_ahead + 1 if work_ahead else 0)
    shape = RingShape(config.num_workers, ring_slots(prefetch_factor, hold), config.batch_size, columns)
    return BatchRing(shape, hold=hold)


def pin_copy(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch copied into pinned memory (what ``pin_memory=True`` asks for; it also ends the slot's
    lifetime constraint)."""
    return {name: t.pin_memory() for name, t in batch.items()}
