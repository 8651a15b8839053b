"""Is a training step kept waiting for data? Consume a loader the way a training loop on an accelerator does.

A GPU step leaves the CPU idle; here the step is a ``time.sleep``, and what is measured is the share of the
wall time spent inside ``next(loader)``. At the start of each epoch the shuffle buffers fill (1, 2, 4...
chunks before a worker's first batches), which no loader fits into a few steps, so the share is also given
for the rest of the epoch. ``python -m zarrtorch roofline --step-ms`` and ``make bench`` report both.
"""

from __future__ import annotations

import math
import time


def paced(batches, step_s: float, limit: int, warmup: int = 0) -> dict:
    """Take up to ``limit`` batches from a started iterator, sleeping ``step_s`` after each (the CPU idle, as
    while an accelerator computes): rows/s and the share of the wall time spent waiting in ``next()``, over
    all batches and over those after the first ``warmup`` (while the shuffle buffers fill, a batch needs
    more reads than later: :func:`warmup_batches`)."""
    waits, rows = [], 0
    start = time.perf_counter()
    steady_start = start
    for i in range(limit):
        if i == warmup:
            steady_start = time.perf_counter()
        t0 = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            break
        waits.append(time.perf_counter() - t0)
        rows += len(next(iter(batch.values())))
        del batch
        if step_s:
            time.sleep(step_s)
    end = time.perf_counter()
    wall, steady_wall = max(end - start, 1e-9), max(end - steady_start, 1e-9)
    return {"rows": rows, "wall_s": wall, "rows_per_s": rows / wall, "data_wait_share": sum(waits) / wall,
            "steady_data_wait_share": sum(waits[warmup:]) / steady_wall if len(waits) > warmup else None}  # fmt: skip


def warmup_batches(buffer_chunks: int, num_workers: int) -> int:
    """Batches of an epoch during which the shuffle buffers fill (each doubles per batch, from one chunk)."""
    return max(1, num_workers) * (math.ceil(math.log2(max(1, buffer_chunks))) + 1)


def paced_epoch(loader, step_s: float, limit: int | None = None) -> dict:
    """:func:`paced` over one epoch of ``loader`` after its first batch (start-up: opening, workers, the first
    reads), at most ``limit`` batches; the buffers' warm-up counted from the loader's own settings."""
    it = iter(loader)
    next(it)
    warmup = warmup_batches(loader.dataset.buffer_chunks, loader.num_workers) - 1  # the first one is taken
    result = paced(it, step_s, len(loader) - 1 if limit is None else min(limit, len(loader) - 1), warmup)
    del it
    return result
