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

Workers or not (lesson 04, ``docs/tuning.md``): :func:`paced_run` runs a loader against a training step and
reports the share of the time spent waiting in ``next()``; the steps stand in for a real one on the CPU:
:func:`sleeping_step` releases the GIL and leaves the CPU idle (a GPU step), :func:`torch_step` releases the
GIL and keeps a core busy, :func:`python_step` holds the GIL. From the command line, on a node::

    python -m zarrtorch.course.measure STORE --workers 0 2 --steps sleep torch python

The work a loader does, counted rather than timed (lesson 04): :class:`ChunkReads` opens a store so that every
chunk zarr reads from it is counted, the same on every machine.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import zarr

from zarrtorch.course.memory import MemorySampler, descendants

__all__ = [
    "ChunkReads",
    "measure_loader",
    "batch_len",
    "mib",
    "apart",
    "paced_run",
    "sleeping_step",
    "torch_step",
    "python_step",
    "STEPS",
    "running_descendants",
    "await_workers_end",
]


class ChunkReads:
    """A local store opened read-only so that every chunk zarr reads from it is counted: the work of a read,
    which does not change with the machine, where a rate does.

    In Zarr v3 each chunk is one object of the store (one file on a local disk), keyed by the array's name,
    ``c`` and the chunk's position on each axis (``fields/c/12/0/0/0``: chunk 12 of ``fields`` along the first
    axis). Every key zarr asks for counts, except metadata (``zarr.json``, and Zarr v2's ``.zarray``...).

        reads = ChunkReads(path)
        reads.group["fields"][5]  # one row
        reads.take()  # 1: the row's whole chunk was read
    """

    def __init__(self, path: str | Path):
        self._store = _CountingStore(zarr.storage.LocalStore(Path(path), read_only=True))
        self.group = zarr.open_group(self._store, mode="r")

    def take(self) -> int:
        """Chunks read since the store was opened or since the last call; counting then starts afresh."""
        keys = self._store.keys_read
        n = sum(count for key, count in keys.items() if key.rsplit("/", 1)[-1] not in _METADATA)
        keys.clear()
        return n


_METADATA = frozenset({"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"})


class _CountingStore(zarr.storage.WrapperStore):
    """The wrapped store, counting the keys read through it (zarr calls ``get`` once per object it reads)."""

    def __init__(self, store):
        super().__init__(store)
        self.keys_read: collections.Counter[str] = collections.Counter()

    async def get(self, key, prototype, byte_range=None):
        self.keys_read[key] += 1
        return await super().get(key, prototype, byte_range)


def mib(n_bytes: float) -> float:
    """Bytes to MiB, rounded to 0.1."""
    return round(float(n_bytes) / 2**20, 1)


def apart(values: dict[str, Iterable[float]]) -> list[tuple[str, str]]:
    """The pairs ``(a, b)`` whose repeated measurements never overlap, ``a`` lower in every one (``a``'s
    highest below ``b``'s lowest): the only differences a few noisy repetitions can show."""
    ranges = {name: (min(v), max(v)) for name, v in ((name, list(v)) for name, v in values.items())}
    return [(a, b) for a in ranges for b in ranges if ranges[a][1] < ranges[b][0]]


def running_descendants() -> set[int]:
    """This process's descendants that are still running (an exited one not yet reaped, a zombie, is not)."""
    running = set()
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z":
            running.add(pid)
    return running


def await_workers_end(started_before: set[int], timeout_s: float = 30.0) -> None:
    """Wait until the processes started since ``started_before`` (a loader's workers) have exited, after the caller
    dropped its loader: a loader stopped early, or one with persistent workers, keeps its workers until the garbage
    collector frees it, and in a notebook they would stay alive beside the next cell's loaders (on a hub, every one
    of them counts against the kernel's memory limit). Warns, naming them, if some are still running after
    ``timeout_s``: something else still holds their loader."""
    gc.collect()  # a loader and its iterator reference each other: only the collector frees them
    deadline = time.monotonic() + timeout_s
    while left := running_descendants() - started_before:
        if time.monotonic() > deadline:
            warnings.warn(
                f"worker processes {sorted(left)} still run {timeout_s:g} s after their loader was dropped: "
                "something else still references the loader or its iterator",
                stacklevel=3,
            )
            return
        time.sleep(0.02)


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

    A loader built here (``loader`` a callable) is dropped before this returns, and its workers have ended by then
    (:func:`await_workers_end`), even when it stopped after ``max_batches``.
    """
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches must be >= 1 or None, got {max_batches}")
    batches = samples = first_samples = 0
    first_batch_s = float("nan")
    builds = callable(loader) and not hasattr(loader, "__iter__")
    before = running_descendants()
    with MemorySampler(every_s=sample_every_s) as mem:
        t0 = time.perf_counter()
        iterable = loader() if builds else loader
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
    if builds:
        del iterable
        await_workers_end(before)
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


# -- workers or not: a loader against a training step ---------------------------------------------------------
def sleeping_step(seconds: float) -> None:
    """A step that releases the GIL and leaves the CPU idle: a GPU step that spends its time on the GPU."""
    time.sleep(seconds)


def python_step(seconds: float) -> None:
    """A step that holds the GIL (the interpreter hands it to another thread only at its switch interval, 5 ms):
    Python work in the training loop, such as a small model's optimiser, kernel launches, Python transforms."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


_MATRIX: list = []


def torch_step(seconds: float) -> None:
    """A step that releases the GIL and keeps the CPU busy: matrix products in torch's threads (one thread: one
    core busy, as the command line sets it)."""
    import torch

    if not _MATRIX:
        _MATRIX.append(torch.randn(256, 256, generator=torch.Generator().manual_seed(0)))
    a = _MATRIX[0]
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a @ a


STEPS: dict[str, Callable[[float], None]] = {"sleep": sleeping_step, "torch": torch_step, "python": python_step}


def paced_run(loader, step: Callable[[float], None], step_s: float, batches: int) -> dict:
    """Take a batch and run ``step(step_s)``, ``batches`` times, through as many epochs as that takes (``set_epoch``
    and a new ``iter()`` at each epoch's end, as a training loop does); the first batch (opening, workers' start,
    first reads) is taken before the clock starts. Returns ``rows_per_s`` (rows trained per second), ``wait_share``
    (the share of the time spent in ``next()``, the next epoch's start included) and ``batches``.

    ``loader``: an iterable, or a callable that builds one: that loader is dropped before this returns, and its
    workers (persistent ones too) have ended by then (:func:`await_workers_end`)."""
    if callable(loader) and not hasattr(loader, "__iter__"):
        before = running_descendants()
        result = paced_run(loader(), step, step_s, batches)
        await_workers_end(before)
        return result
    epoch = 0
    set_epoch = getattr(loader, "set_epoch", None)
    if set_epoch is not None:
        set_epoch(epoch)
    it = iter(loader)
    next(it)
    done = rows = 0
    waited = 0.0
    start = time.perf_counter()
    while done < batches:
        t0 = time.perf_counter()
        batch = next(it, None)
        if batch is None:  # the epoch is over: the next one, as in training
            epoch += 1
            if set_epoch is not None:
                set_epoch(epoch)
            it = iter(loader)
            batch = next(it, None)
            if batch is None:
                raise ValueError("the loader yielded an empty epoch")
        waited += time.perf_counter() - t0
        rows += batch_len(batch)
        del batch
        step(step_s)
        done += 1
    wall = time.perf_counter() - start
    del it
    return {"rows_per_s": rows / wall, "wait_share": waited / wall, "batches": done}


def _workers_table(store, batch_size: int, workers: list[int], steps: list[str], step_ms, batches: int, repeats: int):
    from zarrtorch import ZarrDataLoader, ZarrIterableDataset, available_cpus

    def loader(n):
        ds = ZarrIterableDataset(store, seed=0)
        return ZarrDataLoader(ds, batch_size=batch_size, drop_last=True, num_workers=n, persistent_workers=n > 0)

    alone = [paced_run(lambda: loader(0), sleeping_step, 0.0, batches)["rows_per_s"] for _ in range(repeats)]
    step_s = step_ms / 1e3 if step_ms is not None else batch_size / statistics.median(alone)
    print(
        f"{available_cpus()} CPU(s); the loader alone, 0 workers: {statistics.median(alone):,.0f} rows/s; "
        f"step {1e3 * step_s:.2f} ms per batch of {batch_size} ({batches} batches, {repeats} repetitions)",
        flush=True,
    )
    runs: dict[tuple[str, int], list[dict]] = {}
    for _ in range(repeats):  # repetitions outermost: a slow spell of the machine touches every setting
        for name in steps:
            for n in workers:
                runs.setdefault((name, n), []).append(paced_run(lambda n=n: loader(n), STEPS[name], step_s, batches))
    for (name, n), rs in runs.items():
        rates, waits = [r["rows_per_s"] for r in rs], [r["wait_share"] for r in rs]
        print(
            f"{name:>7} step, {n} workers: {statistics.median(rates):9,.0f} rows/s [{min(rates):,.0f}, "
            f"{max(rates):,.0f}], waiting {statistics.median(waits):4.0%} [{min(waits):.0%}, {max(waits):.0%}]"
        )
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m zarrtorch.course.measure",
        description="Workers or not: a loader against training steps that sleep, compute in torch or hold the GIL",
    )
    p.add_argument("store", help="a store written by prepare_zarr")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--steps", nargs="+", choices=list(STEPS), default=list(STEPS))
    p.add_argument("--step-ms", type=float, default=None, help="default: the loader's own time per batch, 0 workers")
    p.add_argument("--batches", type=int, default=200, help="timed batches per run")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the torch step keeps one core busy, as one training process's step would
    try:
        _workers_table(a.store, a.batch_size, a.workers, a.steps, a.step_ms, a.batches, a.repeats)
    finally:
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
