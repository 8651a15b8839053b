"""Where the loader's ceiling is on this machine, and whether it keeps up with a training step.

``python -m zarrtorch roofline STORE`` measures, on the machine it runs on: how fast the store's chunk bytes
are read (storage, page cache included), how fast one core decodes them, and the loader itself at a few
settings. The slowest of read and decode (on all the CPUs) is the ceiling; a loader well below it is held back
by itself (shuffling, moving batches between processes). It says how each array's chunks are decoded: directly
from their stored bytes, or through zarr's codecs and why (:func:`zarrtorch._read.fastpath.read_path`). With
``--step-ms`` it runs the loader against a training step that sleeps (the CPU is idle, as while a GPU computes)
and reports the share of the wall time spent waiting for data. With a GPU, it also measures host-to-device
copies from pinned memory."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from zarrtorch._read.chunks import chunk_key
from zarrtorch._read.fastpath import read_path_text, stored_decoder
from zarrtorch._read.reader import ChunkReadError
from zarrtorch._util.process import available_cpus
from zarrtorch.dataset import ZarrIterableDataset
from zarrtorch.loader import ZarrDataLoader
from zarrtorch.options import ReadOptions


@dataclass
class Roofline:
    """Rates in rows (samples) per second unless named otherwise."""

    cpus: int
    rows: int
    chunk_rows: int
    row_bytes: int  # decoded, all arrays
    stored_row_bytes: float  # as stored (compressed), all arrays
    read_rows_per_s: float  # raw chunk bytes from the store, max(2, cpus) requests in flight, as rows
    decode_rows_per_s_per_core: float
    loader: list[dict] = field(default_factory=list)  # one entry per setting tried
    step: dict | None = None  # data-wait share against a sleeping training step
    h2d_gb_per_s: float | None = None  # host-to-device from pinned memory (CUDA only)
    read_paths: dict[str, str] = field(default_factory=dict)  # array -> how the loader decodes its chunks

    @property
    def ceiling(self) -> tuple[str, float]:
        """(``"read"`` or ``"decode"``, rows/s) on all CPUs: what no loader setting can beat."""
        decode = self.decode_rows_per_s_per_core * self.cpus
        return ("read", self.read_rows_per_s) if self.read_rows_per_s < decode else ("decode", decode)

    @property
    def best(self) -> dict:
        return max(self.loader, key=lambda r: r["rows_per_s"])

    @property
    def binding(self) -> str:
        """What limits the best setting: the ceiling's resource, or the loader itself below 70% of it."""
        name, rate = self.ceiling
        return name if self.best["rows_per_s"] >= 0.7 * rate else "loader"

    def summary(self) -> str:
        name, rate = self.ceiling
        mb = self.row_bytes / 2**20
        lines = [
            f"store: {self.rows} rows in chunks of {self.chunk_rows}, {self.row_bytes / 1024:.0f} KiB per row "
            f"decoded ({self.row_bytes / self.stored_row_bytes:.2f}x compressed); {self.cpus} CPU(s) available",
            f"  read (storage, {max(2, self.cpus)} in flight)     {self.read_rows_per_s:10,.0f} rows/s  "
            f"({self.read_rows_per_s * mb:,.0f} MiB/s decoded)",
            f"  decode, per core             {self.decode_rows_per_s_per_core:10,.0f} rows/s  "
            f"({self.decode_rows_per_s_per_core * mb:,.0f} MiB/s)",
            f"  ceiling ({name}, all CPUs)    {rate:10,.0f} rows/s",
        ]
        lines += [f"  read path {name_!r}: {path}" for name_, path in self.read_paths.items()]
        for r in self.loader:
            lines.append(
                f"  loader, {r['num_workers']} worker(s) x {r['decode_threads']} decode thread(s), buffer "
                f"{r['buffer_chunks']}: {r['rows_per_s']:,.0f} rows/s "
                f"({r['rows_per_s'] / rate:.2f}x ceiling)"
            )
        lines.append(
            f"binding limit: {self.binding}"
            + {
                "read": " (storage: more requests in flight, a faster file system, or a copy on local disk)",
                "decode": " (CPU: more cores per process, or a cheaper codec such as lz4 or none)",
                "loader": " (the loader itself: try the other settings below)",
            }[self.binding]
        )
        best = self.best
        lines.append(
            f"suggested for {self.cpus} CPU(s) per process: num_workers={best['num_workers']}, "
            f"decode_threads={best['decode_threads']}, buffer_chunks={best['buffer_chunks']}"
        )
        if self.step is not None:
            s = self.step
            steady = s["data_wait_share"] if s["steady_data_wait_share"] is None else s["steady_data_wait_share"]
            lines.append(
                f"against a {s['step_ms']:.3g} ms step: waiting for data {100 * s['data_wait_share']:.1f}% of "
                f"the time after the first batch, {100 * steady:.1f}% once the shuffle buffers are full: "
                f"the loader {'keeps up' if steady <= 0.05 else 'does NOT keep up'}"
            )
        if self.h2d_gb_per_s is not None:
            lines.append(f"host-to-device from pinned memory: {self.h2d_gb_per_s:.1f} GB/s")
        return "\n".join(lines)


DECODE_PASSES = 3  # a few chunks decode in milliseconds: one pass on a busy machine would say little


def _timed(direct: list) -> float:
    start = time.perf_counter()
    for decode, raw in direct:
        decode(raw)
    return time.perf_counter() - start


def _unreadable(name: str, c: int, key: str, why: str) -> ChunkReadError:
    return ChunkReadError(
        f"roofline: cannot measure chunk {c} of array {name!r} (key {key!r}): {why}. The loader would stop on it "
        "too (ChunkReadError): write the store again from its source (prepare_zarr)"
    )


def measure_storage(ds: ZarrIterableDataset, chunks: list[int], readers: int) -> tuple[float, float, float]:
    """(stored bytes per row, rows/s read with ``readers`` requests in flight, rows/s decoded by one core).
    A missing or undecodable chunk among those sampled raises :class:`ChunkReadError` naming it."""
    from concurrent.futures import ThreadPoolExecutor

    from zarr.buffer import default_buffer_prototype

    from zarrtorch._compat.zarr import run

    jobs = [(name, arr, c) for c in chunks for name, arr in ds.arrays.items()]

    def get(job):
        _, arr, c = job
        raw = run(arr.store_path.store.get(chunk_key(arr, c), prototype=default_buffer_prototype()))
        return raw.to_bytes() if raw is not None else None

    rows = sum(min(ds.chunk_rows, ds.rows - c * ds.chunk_rows) for c in chunks)
    with ThreadPoolExecutor(max_workers=readers) as pool:
        start = time.perf_counter()
        raws = list(pool.map(get, jobs))
        read_s = time.perf_counter() - start
    decoder = {name: stored_decoder(arr) for name, arr in ds.arrays.items()}  # the loader's direct decode, or None
    direct = []
    for (name, arr, c), raw in zip(jobs, raws, strict=True):
        if raw is None:
            raise _unreadable(name, c, chunk_key(arr, c), "the chunk is missing")
        if decoder[name] is not None:
            decode = functools.partial(decoder[name], rows=min(ds.chunk_rows, ds.rows - c * ds.chunk_rows))
            try:  # an untimed first pass: it checks every chunk and warms the decoder up
                decode(raw)
            except Exception as exc:  # noqa: BLE001 (any failure to decode is named with the chunk, as the loader does)
                raise _unreadable(name, c, chunk_key(arr, c), f"{type(exc).__name__}: {exc}") from None
            direct.append((decode, raw))
    decode_s = min(_timed(direct) for _ in range(DECODE_PASSES))  # the least disturbed pass: what a core can do
    fallback = [(name, arr, c) for name, arr, c in jobs if decoder[name] is None]
    if fallback:  # through zarr, one thread: read + decode, minus this read's share of the raw read time
        start = time.perf_counter()
        for name, arr, c in fallback:
            try:
                arr[c * ds.chunk_rows : (c + 1) * ds.chunk_rows]
            except Exception as exc:  # noqa: BLE001 (any failure to read is named with the chunk, as the loader does)
                raise _unreadable(name, c, chunk_key(arr, c), f"{type(exc).__name__}: {exc}") from None
        decode_s += max(time.perf_counter() - start - read_s * readers * len(fallback) / len(jobs), 0.0)
    stored = sum(len(r) for r in raws)
    return stored / rows, rows / max(read_s, 1e-9), rows / max(decode_s, 1e-9)


def measure_loader(
    store,
    *,
    batch_size: int,
    num_workers: int,
    decode_threads: int,
    buffer_chunks: int,
    batches: int,
    step_s: float = 0.0,
    **dataset_options,
) -> dict:
    """Rows/s after the first batch (and, with ``step_s``, the share of wall time spent in ``next(loader)``
    while the consumer sleeps ``step_s`` per batch, as an accelerator step would)."""
    read = dataclasses.replace(dataset_options.pop("read", None) or ReadOptions(), decode_threads=decode_threads)
    ds = ZarrIterableDataset(store, buffer_chunks=buffer_chunks, read=read, **dataset_options)
    loader = ZarrDataLoader(ds, batch_size=batch_size, drop_last=True, num_workers=num_workers)
    result = paced_epoch(loader, step_s, batches)
    return {
        "num_workers": num_workers,
        "decode_threads": decode_threads,
        "buffer_chunks": buffer_chunks,
        "rows_per_s": result["rows_per_s"],
        "data_wait_share": result["data_wait_share"],
        "steady_data_wait_share": result["steady_data_wait_share"],
    }


def measure_h2d(row_bytes: int, batch_size: int) -> float | None:
    if not torch.cuda.is_available():
        return None
    host = torch.empty(batch_size * row_bytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    start, n = time.perf_counter(), 20
    for _ in range(n):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return n * host.numel() / (time.perf_counter() - start) / 1e9


def roofline(
    store,
    *,
    batch_size: int = 64,
    cpus: int | None = None,
    chunks: int = 8,
    batches: int = 40,
    buffer_chunks: int = 8,
    step_ms: float | None = None,
    **dataset_options,
) -> Roofline:
    """Measure the store and the loader on this machine (reads about ``chunks`` chunks and a few hundred
    batches; seconds on a laptop)."""
    ds = ZarrIterableDataset(store, **dataset_options)
    cpus = cpus or available_cpus()
    n_chunks = ds.layout.n_chunks
    sample = sorted({int(c) for c in np.linspace(0, n_chunks - 1, min(chunks, n_chunks))})
    stored_row, read_rate, decode_rate = measure_storage(ds, sample, readers=max(2, cpus))
    settings = [(0, cpus)] + ([(min(cpus, 2), max(1, cpus // 2))] if cpus > 1 else [])
    results = [
        measure_loader(
            store,
            batch_size=batch_size,
            num_workers=w,
            decode_threads=t,
            buffer_chunks=buffer_chunks,
            batches=batches,
            **dataset_options,
        )
        for w, t in settings
    ]
    report = Roofline(cpus, ds.rows, ds.chunk_rows, ds.row_bytes, stored_row, read_rate, decode_rate, results)
    report.read_paths = {name: read_path_text(arr) for name, arr in ds.arrays.items()}
    if step_ms is not None:
        best = report.best
        step = measure_loader(
            store,
            batch_size=batch_size,
            num_workers=best["num_workers"],
            decode_threads=best["decode_threads"],
            buffer_chunks=buffer_chunks,
            batches=batches,
            step_s=step_ms / 1000,
            **dataset_options,
        )
        report.step = {
            "step_ms": step_ms,
            "data_wait_share": step["data_wait_share"],
            "steady_data_wait_share": step["steady_data_wait_share"],
        }
    report.h2d_gb_per_s = measure_h2d(ds.row_bytes, batch_size)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zarrtorch roofline", description=__doc__.split("\n\n")[0])
    p.add_argument("store", help="path or URL of a store written by prepare_zarr")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--cpus", type=int, default=None, help="CPUs per training process (default: those available)")
    p.add_argument("--buffer-chunks", type=int, default=8)
    p.add_argument("--chunks", type=int, default=8, help="chunks read to measure storage and decode")
    p.add_argument("--batches", type=int, default=40, help="batches timed per loader setting")
    p.add_argument("--step-ms", type=float, default=None, help="a training step's duration: does the loader keep up?")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        report = roofline(
            a.store,
            batch_size=a.batch_size,
            cpus=a.cpus,
            chunks=a.chunks,
            batches=a.batches,
            buffer_chunks=a.buffer_chunks,
            step_ms=a.step_ms,
        )
    except (ChunkReadError, ValueError, OSError, LookupError) as exc:  # each message names what is wrong
        print(f"zarrtorch roofline: {exc}", file=sys.stderr)
        return 2 if not isinstance(exc, ChunkReadError) else 1
    if a.json:
        print(json.dumps({**asdict(report), "ceiling": report.ceiling, "binding": report.binding}, indent=1))
    else:
        print(report.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())


# -- the share of a training step spent waiting for data (a sleeping step) -----------------------------------
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
    return {
        "rows": rows,
        "wall_s": wall,
        "rows_per_s": rows / wall,
        "data_wait_share": sum(waits) / wall,
        "steady_data_wait_share": sum(waits[warmup:]) / steady_wall if len(waits) > warmup else None,
    }


def warmup_batches(buffer_chunks: int, num_workers: int) -> int:
    """Batches of an epoch during which the shuffle buffers fill (each doubles per batch, from one chunk)."""
    return max(1, num_workers) * (math.ceil(math.log2(max(1, buffer_chunks))) + 1)


def paced_epoch(loader, step_s: float, limit: int | None = None) -> dict:
    """:func:`paced` over one epoch of ``loader`` after its first batch (start-up: opening, workers, the first
    reads), at most ``limit`` batches; the buffers' warm-up counted from the loader's own settings."""
    it = iter(loader)
    next(it)
    warmup = warmup_batches(loader.data.buffer_chunks, loader.num_workers) - 1  # the first one is taken
    result = paced(it, step_s, len(loader) - 1 if limit is None else min(limit, len(loader) - 1), warmup)
    del it
    return result
