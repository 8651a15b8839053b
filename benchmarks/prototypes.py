"""Prototypes: changes to zarrtorch measured by ``run.py --prototypes`` before they go into the package.

A prototype is a patch applied in the fresh process of one zarrtorch run (and so in the DataLoader workers
that run forks); the package's files are not changed and the batches stay bit-identical. It overrides
``zarrtorch.buffer.SlotBuffer._gather`` (how a batch's rows leave the shuffle buffer: the one hook the
package keeps for this) and returns the function the main process applies to every batch it receives.

Two earlier prototypes are in the package now: ``direct`` (decode a chunk file straight into the array
the reader returns: ``zarrtorch/fastpath.py``) and ``lazyrefill`` (refill the slots a batch freed when
the next batch starts: ``SlotBuffer.apply``).
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import torch
from torch.utils.data import get_worker_info

from zarrtorch.buffer import SlotBuffer

RING_SLOTS = 4  # per worker: > prefetch_factor (2) batches in the queue + the one the main process copies


def patch_ring(workers: int, batch_size: int, row_shape: tuple[int, ...]):
    """``ring``: batches cross the process boundary through a ring of shared-memory slots allocated (and
    touched) once, before the workers fork. A worker gathers a batch's float32 rows of shape ``row_shape``
    into its next free slot and sends only ``[worker, slot, rows]``; the main process copies the rows out
    into ordinary memory and frees the slot. Without it, the queue feeder of every worker moves each batch
    into a new shared-memory segment (page faults + a copy) and the main process maps it."""
    ring = torch.zeros((workers, RING_SLOTS, batch_size, *row_shape), dtype=torch.float32).share_memory_()
    busy = torch.zeros((workers, RING_SLOTS), dtype=torch.int32).share_memory_()
    ring_np, busy_np = ring.numpy(), busy.numpy()
    sent = itertools.count()  # each worker counts its own batches (a copy per forked process)

    def gather(self, column: np.ndarray, take: np.ndarray):
        info = get_worker_info()
        if info is None or column.dtype != np.float32 or column.shape[1:] != tuple(row_shape):
            return column[take]
        w, slot = info.id, next(sent) % RING_SLOTS
        while busy_np[w, slot]:  # the main process has not copied this slot out yet
            time.sleep(0.0005)
        busy_np[w, slot] = 1
        np.take(column, take, axis=0, out=ring_np[w, slot, : len(take)], mode="clip")
        return np.array([w, slot, len(take)], dtype=np.int64)

    def receive(batch: dict) -> dict:
        out = {}
        for name, v in batch.items():
            if name != "index" and v.dtype == torch.int64 and v.shape == (3,):  # a ring reference
                w, slot, n = v.tolist()
                v = torch.from_numpy(ring_np[w, slot, :n].copy())
                busy_np[w, slot] = 0
            out[name] = v
        return out

    if workers > 0:
        SlotBuffer._gather = gather
    return receive


PATCHES = {"ring": patch_ring}  # name -> patch(workers=, batch_size=, row_shape=) -> receive(batch)
