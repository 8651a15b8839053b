"""Measure a data loader the way a training loop sees it: time to the first batch, samples per second,
and the memory of the main process and of its DataLoader worker processes.

    from zarrtorch.course.measure import measure_loader
    stats = measure_loader(lambda: DataLoader(...), max_batches=50)
    stats["samples_per_s"], stats["first_batch_s"], stats["peak_rss_workers"]

Memory is sampled from ``/proc`` by :class:`zarrtorch.course.memory.MemorySampler` in a background thread
(RSS every ``sample_every_s``, USS every 0.1 s) and once more when the first batch arrives, so short runs
still see their workers. Worker memory is reported two ways:

- RSS (resident set size): what ``top`` shows. A forked worker shares the pages it inherited from the
  main process (the imported libraries), so RSS counts them again in every worker.
- USS (unique set size): the memory only that worker holds, what it really adds; this is where the
  decoded chunks and the shuffle buffer live.

And the loader as a whole, the figure ``zarrtorch.loader_memory(loader).total`` predicts: ``held``, the growth
of the main process's anonymous and shared memory plus each worker's peak of private dirty memory (the pages
only it wrote), library pages left out (:attr:`zarrtorch.course.memory.MemorySampler.held`).

Every descendant process of the calling process counts as a worker (DataLoader workers are its only
children in a notebook or a training script). Timings on a shared machine are noisy: compare settings
measured side by side, never against a fixed threshold.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from zarrtorch.course.memory import MemorySampler

__all__ = ["measure_loader", "batch_len", "mib", "apart"]


def mib(n_bytes: float) -> float:
    """Bytes to MiB, rounded to 0.1."""
    return round(float(n_bytes) / 2**20, 1)


def apart(values: dict[str, Iterable[float]]) -> list[tuple[str, str]]:
    """The pairs ``(a, b)`` whose repeated measurements never overlap, ``a`` lower in every one (``a``'s
    highest below ``b``'s lowest): the only differences a few noisy repetitions can show."""
    ranges = {name: (min(v), max(v)) for name, v in ((name, list(v)) for name, v in values.items())}
    return [(a, b) for a in ranges for b in ranges if ranges[a][1] < ranges[b][0]]


def batch_len(batch: Any) -> int:
    """Samples in a batch: a tensor/array (first axis), a dict (its first value) or a tuple/list (its first item)."""
    if isinstance(batch, dict):
        return batch_len(next(iter(batch.values())))
    if isinstance(batch, (tuple, list)):
        return batch_len(batch[0]) if batch and hasattr(batch[0], "shape") else len(batch)
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else 1


def measure_loader(
    loader: Iterable | Callable[[], Iterable], max_batches: int | None = None, *, sample_every_s: float = 0.02
) -> dict:
    """Iterate ``loader`` (or what the zero-argument callable ``loader`` returns) for at most
    ``max_batches`` batches and return:

    - ``samples_per_s``: samples / seconds, start-up included (what an epoch costs);
    - ``steady_samples_per_s``: after the first batch (``nan`` with a single batch);
    - ``first_batch_s``: from the start (before calling the factory, if one is given, and before ``iter``) to
      the first batch: opening, worker start-up and the first reads;
    - ``seconds``, ``batches``, ``samples``;
    - ``rss_main_start`` and ``peak_rss_main`` (the main process before and at its peak);
      ``peak_rss_workers`` / ``peak_uss_workers`` (largest total over the worker processes alive at one
      moment) and ``peak_rss_per_worker`` / ``peak_uss_per_worker`` (largest single worker), in bytes;
      ``workers_seen`` (how many distinct worker processes were sampled);
    - ``held`` (what the loader held at most, library pages left out: the main process's growth plus each
      worker's peak of private dirty memory) and ``peak_held_per_worker`` (the largest worker's part of it).
    """
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches must be >= 1 or None, got {max_batches}")
    batches = samples = first_samples = 0
    first_batch_s = float("nan")
    with MemorySampler(every_s=sample_every_s) as mem:
        t0 = time.perf_counter()
        iterable = loader() if callable(loader) and not hasattr(loader, "__iter__") else loader
        it = iter(iterable)
        try:
            for batch in it:
                n = batch_len(batch)
                batches += 1
                samples += n
                if batches == 1:
                    first_batch_s = time.perf_counter() - t0
                    first_samples = n
                    mem.sample()  # workers are surely alive now
                if max_batches is not None and batches >= max_batches:
                    break
            seconds = time.perf_counter() - t0
            mem.sample()
        finally:
            shutdown = getattr(it, "_shutdown_workers", None)
            if callable(shutdown) and not getattr(iterable, "persistent_workers", False):
                shutdown()  # stop the workers now rather than whenever the iterator is collected
            del it
    steady_s = seconds - first_batch_s
    return {
        "samples_per_s": samples / seconds if seconds > 0 else float("nan"),
        "steady_samples_per_s": (samples - first_samples) / steady_s if batches > 1 and steady_s > 0 else float("nan"),
        "first_batch_s": first_batch_s,
        "seconds": seconds,
        "batches": batches,
        "samples": samples,
        "rss_main_start": mem.rss_main_start,
        "peak_rss_main": mem.peak_rss_main,
        "peak_rss_workers": mem.peak_rss_workers,
        "peak_uss_workers": mem.peak_uss_workers,
        "peak_rss_per_worker": mem.peak_rss_per_worker,
        "peak_uss_per_worker": mem.peak_uss_per_worker,
        "workers_seen": len(mem.seen),
        "held": mem.held,
        "peak_held_per_worker": max((w["dirty_peak"] or 0 for w in mem.workers.values()), default=0),
    }
