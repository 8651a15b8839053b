"""What one benchmark configuration does, in the fresh process that runs it.

``run.py`` starts every (configuration, size, repetition) in a new process forked from a *forkserver* that
imported this module once: each run starts from the same clean state (no data, no threads running, no
page of a previous run), DataLoader workers are forked from that small process, and the ~2-4 s import of
torch is paid once instead of once per run. Everything a run measures comes back as a plain dict
(:func:`run_config`). The prototypes (``prototypes.py``) are patches applied to the zarrtorch run.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import prototypes
import torch
import zarr
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset, loader_memory, prepare_zarr
from zarrtorch._util.sizes import ceil_div, row_bytes
from zarrtorch.course.measure import batch_len
from zarrtorch.course.memory import MemorySampler, descendants, held_by_kind, smaps_by_kind
from zarrtorch.roofline import paced_epoch

SAMPLE_SHAPE = (16, 32, 32)  # float32: 64 KiB per sample
DTYPE = np.dtype(np.float32)
ARRAY = "x"
ROW_BYTES = row_bytes({ARRAY: np.empty((0, *SAMPLE_SHAPE), DTYPE)})
GENERATOR_VERSION = 1  # bump when the generated values change; a store from another version is rewritten
MiB = 2**20


# --------------------------------------------------------------------------------------------------
# Data: one deterministic array per (rows, chunk_rows, seed)
# --------------------------------------------------------------------------------------------------
def rows_for(gib: float, chunk_rows: int) -> int:
    """Whole chunks holding at least ``gib`` GiB of decoded samples (at least 2 chunks)."""
    return max(2, ceil_div(round(gib * 2**30), ROW_BYTES * chunk_rows)) * chunk_rows


def generate_rows(start: int, stop: int, *, chunk_rows: int, seed: int) -> np.ndarray:
    """Rows ``[start, stop)`` of the benchmark array: a pure function of ``(seed, row)``.

    Each chunk's noise comes from ``default_rng([seed, chunk])`` so any block gives the same values as the
    same rows inside a bigger one. Values are a smooth per-channel field with a slow drift plus Gaussian
    noise, rounded to 0.01 (like measured data with limited precision), so zstd compresses them moderately.
    """
    c, h, w = SAMPLE_SHAPE
    yy, xx = np.meshgrid(np.linspace(0, np.pi, h), np.linspace(0, 2 * np.pi, w), indexing="ij")
    k = np.arange(c)[:, None, None]
    base = (10.0 + 5.0 * np.sin(yy[None]) * np.cos((1 + k % 4) * xx[None] + k)).astype(np.float32)
    out = np.empty((stop - start, *SAMPLE_SHAPE), dtype=np.float32)
    for chunk in range(start // chunk_rows, (stop - 1) // chunk_rows + 1):
        c0 = chunk * chunk_rows
        block = np.random.default_rng([int(seed), int(chunk)]).standard_normal((chunk_rows, *SAMPLE_SHAPE), np.float32)
        t = (c0 + np.arange(chunk_rows, dtype=np.float32))[:, None, None, None]
        block += base * (1.0 + 0.2 * np.sin(t / 97.0 + k))
        np.round(block, 2, out=block)
        a, b = max(start, c0), min(stop, c0 + chunk_rows)
        out[a - start : b - start] = block[a - c0 : b - c0]
    return out


class _LazyRows:
    """Sliceable stand-in for the array, so prepare_zarr generates it block by block (bounded memory)."""

    def __init__(self, rows: int, chunk_rows: int, seed: int):
        self.shape, self.dtype = (rows, *SAMPLE_SHAPE), DTYPE
        self.chunk_rows, self.seed = chunk_rows, seed

    def __getitem__(self, sl: slice) -> np.ndarray:
        start, stop, _ = sl.indices(self.shape[0])
        return generate_rows(start, stop, chunk_rows=self.chunk_rows, seed=self.seed)


def ensure_store(data_dir: str, rows: int, chunk_rows: int, seed: int = 0) -> dict:
    """Create the store unless a complete one with the right shape exists (its sidecar ``<store>.json``
    says so); returns its description."""
    shape = "x".join(map(str, SAMPLE_SHAPE))
    path = Path(data_dir) / f"f32_{rows}x{shape}_c{chunk_rows}_zstd_s{seed}.zarr"
    marker = path.with_suffix(".json")
    codec = {"codec": "zstd", "level": 3}
    want = {"rows": rows, "chunk_rows": chunk_rows, "seed": seed, "sample_shape": list(SAMPLE_SHAPE)}
    want |= {"dtype": DTYPE.name, **codec, "generator_version": GENERATOR_VERSION}
    with contextlib.suppress(Exception):  # missing, unreadable or partial: (re)generate
        info = json.loads(marker.read_text())
        arr = zarr.open_group(str(path), mode="r")[ARRAY]
        if all(info.get(k) == v for k, v in want.items()) and arr.shape == (rows, *SAMPLE_SHAPE):
            return {**info, "path": str(path), "generated": False}
    marker.unlink(missing_ok=True)
    t0 = time.perf_counter()
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    lazy = _LazyRows(rows, chunk_rows, seed)
    prepare_zarr({ARRAY: lazy}, path, chunk_rows=chunk_rows, **codec, overwrite=True, progress=False, max_memory_mb=128)
    decoded, stored = rows * row_bytes({ARRAY: lazy}), sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    info = {**want, "decoded_bytes": decoded, "stored_bytes": stored, "compression_ratio": round(decoded / stored, 3)}
    info["generation_s"] = round(time.perf_counter() - t0, 2)
    marker.write_text(json.dumps(info, indent=1))
    return {**info, "path": str(path), "generated": True}


def prepare_cache(store: str, mode: str) -> str:
    """``warm``: read every file of the store once so that the run finds it in the OS page cache; ``cold``:
    drop the page cache instead (``sync; echo 1 > /proc/sys/vm/drop_caches``, root only)."""
    with contextlib.suppress(OSError):
        if mode == "cold":
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("1\n")
            return "dropped"
    for f in sorted(Path(store).rglob("*")):
        if f.is_file():
            with open(f, "rb", buffering=0) as fh:
                while fh.read(16 * MiB):
                    pass
    return "warm" if mode == "warm" else "warm (could not drop: not root?)"


# --------------------------------------------------------------------------------------------------
# CPU: of the whole process tree, and (--by-thread) per thread role
# --------------------------------------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(stat_path: str, waited_children: bool = False) -> float:
    """User + system CPU seconds from a ``/proc/.../stat`` file (+ those of the children already waited for)."""
    try:
        with open(stat_path, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11 : 15 if waited_children else 13]) / _TICK


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process, of its exited (waited-for) children and of its live descendants."""
    return _cpu_s(f"/proc/{pid}/stat", True) + sum(_cpu_s(f"/proc/{k}/stat") for k in descendants(pid))


_libc = ctypes.CDLL(None)


def name_threads() -> None:
    """Give every Python thread started from now on its Python name at the OS level (``prctl``), so that
    ``/proc/<pid>/task/<tid>/comm`` (and ``perf report --sort comm``) tells the thread roles apart."""
    original = threading.Thread._bootstrap_inner

    def bootstrap(self):
        _libc.prctl(15, self.name[:15].encode(), 0, 0, 0)  # PR_SET_NAME
        original(self)

    threading.Thread._bootstrap_inner = bootstrap
    _libc.prctl(15, b"main", 0, 0, 0)


ROLES = {  # OS thread name prefix -> role
    "zarr_pool": "zarr pool (read+decode)",
    "asyncio_": "zarr pool (read+decode)",
    "zarr_io": "zarr_io (event loop, copy into out)",
    "zarrtorch-read": "zarrtorch-read (PieceReader)",
    "QueueFeeder": "queue feeder (pickle -> shm)",
    "main": "main thread (buffer, schedule)",
    "pt_data_worker": "main thread (buffer, schedule)",  # a DataLoader worker's, named by torch
    "zarrtorch-memo": "benchmark samplers",
    "bench-": "benchmark samplers",
}


class ThreadCPU(threading.Thread):
    """CPU seconds by process and thread role of this process and its descendants, sampled every ``period``
    s from its creation to :meth:`stop` (a thread that exits keeps its last sample)."""

    def __init__(self, period: float = 0.05):
        super().__init__(name="bench-threads", daemon=True)
        self.pid, self.period, self.done, self.last = os.getpid(), period, threading.Event(), {}
        self.first = self.sample()
        self.start()

    def sample(self) -> dict:
        for pid in [self.pid, *descendants(self.pid)]:
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/comm") as f:
                        self.last[pid, tid] = (f.read().strip(), _cpu_s(f"/proc/{pid}/task/{tid}/stat"))
        return dict(self.last)

    def run(self) -> None:
        while not self.done.wait(self.period):
            self.sample()

    def stop(self) -> dict[str, float]:
        """Stop sampling; returns the CPU seconds since the creation by ``"<process> / <role>"``."""
        self.done.set()
        self.join()
        out: dict[str, float] = {}
        for (pid, tid), (comm, cpu) in self.sample().items():
            role = next((r for prefix, r in ROLES.items() if comm.startswith(prefix)), f"other ({comm})")
            key = f"{'main process' if pid == self.pid else 'workers'} / {role}"
            out[key] = out.get(key, 0.0) + cpu - self.first.get((pid, tid), (comm, 0.0))[1]
        return out


class SmapsPeaks(threading.Thread):
    """``--smaps``: where the memory lives. Every ``period`` s, ``/proc/<pid>/smaps`` of this process and of each
    of its descendants by kind of mapping (:func:`zarrtorch.course.memory.smaps_by_kind`); keeps, per process,
    the snapshot of its largest resident set (this process: also the one at the start)."""

    def __init__(self, period: float = 0.25):
        super().__init__(name="bench-smaps", daemon=True)
        self.pid, self.period, self.done = os.getpid(), period, threading.Event()
        self.ignore = set(descendants(self.pid))
        self.start_snapshot = smaps_by_kind(self.pid)
        self.peaks: dict[int, dict] = {}
        self.start()

    def sample(self) -> None:
        for pid in [self.pid, *(p for p in descendants(self.pid) if p not in self.ignore)]:
            snap = smaps_by_kind(pid)
            total = sum(f["Rss"] for f in snap.values()) if snap else 0
            if snap and total >= sum(f["Rss"] for f in self.peaks.get(pid, {}).values()):
                self.peaks[pid] = snap

    def run(self) -> None:
        while not self.done.wait(self.period):
            self.sample()

    def stop(self) -> dict:
        """MiB by kind: the main process at its start and its peak, each worker at its peak (``Rss`` by kind,
        file pages split into shared and private; and each kind's private bytes)."""
        self.done.set()
        self.join()

        def mib(snap: dict) -> dict:
            rss = {k: round(v / MiB, 1) for k, v in held_by_kind(snap).items() if v}
            private = {k: round((f["Private_Clean"] + f["Private_Dirty"]) / MiB, 1) for k, f in snap.items()}
            huge = {k: round(f["AnonHugePages"] / MiB, 1) for k, f in snap.items() if f["AnonHugePages"]}
            return {"rss": rss, "private": {k: v for k, v in private.items() if v}, "huge_pages": huge}

        main = self.peaks.pop(self.pid, self.start_snapshot)
        out = {"main_start": mib(self.start_snapshot), "main_peak": mib(main)}
        return out | {"workers": {str(pid): mib(s) for pid, s in self.peaks.items()}}


# --------------------------------------------------------------------------------------------------
# One measured phase (an epoch), one pass over a loader
# --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def phase(sampler: MemorySampler, out: dict, by_thread: bool = False):
    """CPU (of the process and its workers) and memory while the block runs, per sample and in MiB, into
    ``out`` (where the block has put ``samples``)."""
    sampler.reset()
    sampler.sample(with_uss=False)
    cpu0 = tree_cpu_s(sampler.pid)
    threads = ThreadCPU() if by_thread else None
    yield
    sampler.sample()  # the last sample, while the workers are still there
    cpu, per_sample = tree_cpu_s(sampler.pid) - cpu0, 1e6 / max(1, out["samples"])
    out |= {f"threads/{role}": s * per_sample for role, s in (threads.stop() if threads else {}).items()}
    workers = sampler.workers
    # held: what the main process grew in anonymous + shared memory plus each worker's private dirty memory
    # (pages a forked worker shares with its parent are not counted; those it writes, buffers, decoded
    # chunks, CoW copies, are); pages of library files are left out of both (benchmarks/README.md)
    held = sampler.held
    # the former measure, for comparison: the main process's whole RSS growth + each worker's USS, which
    # count the library pages a run maps after it was forked
    rss_uss = max(0, sampler.peak_rss_main - sampler.rss_main_start) + sum(w["uss_peak"] or 0 for w in workers.values())
    out |= {"cpu_s": cpu, "cpu_us_per_sample": cpu * per_sample, "held_mib": held / MiB}
    out |= {"held_rss_uss_mib": rss_uss / MiB}
    out |= {"rss_main_peak_mib": sampler.peak_rss_main / MiB, "rss_main_start_mib": sampler.rss_main_start / MiB}
    out["rss_worker_peak_mib"] = sampler.peak_rss_per_worker / MiB if workers else None
    out["uss_worker_peak_mib"] = sampler.peak_uss_per_worker / MiB if workers else None
    out["workers"] = {str(pid): w for pid, w in workers.items()}  # bytes, for the JSON


def _touch(batch) -> None:
    """Read one float per 4 KiB page of the batch's samples (through numpy: no torch threads)."""
    while isinstance(batch, (dict, list, tuple)):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    float(batch.numpy().reshape(-1)[::1024].sum())


def time_pass(loader, *, touch=False, receive=None, first=None, max_batches=math.inf, max_seconds=math.inf) -> dict:
    """Iterate once: samples, seconds (from ``iter()`` to the end), time to first batch. ``first()`` is
    called once the first batch is in (the memory sampler, so that workers are seen even when an epoch is
    shorter than its sampling period: they exit before the loop ends). Stops early after ``max_batches``
    batches, or after ``max_seconds`` (once at least 2 batches are in)."""
    t0 = time.perf_counter()
    it = iter(loader)
    n = batches = 0
    ttfb = None
    try:
        for batch in it:
            if receive is not None:
                batch = receive(batch)
            if ttfb is None:
                ttfb = time.perf_counter() - t0
                if first is not None:
                    first()
            if touch:
                _touch(batch)
            n += batch_len(batch)
            batches += 1
            del batch
            if batches >= max_batches or (batches >= 2 and time.perf_counter() - t0 > max_seconds):
                break
    finally:
        seconds = time.perf_counter() - t0
        del it
    steady = (n - n / max(1, batches)) / (seconds - ttfb) if batches > 1 and seconds > ttfb else None
    out = {"samples": n, "batches": batches, "seconds": seconds, "samples_per_s": n / seconds, "ttfb_s": ttfb}
    return out | {"steady_samples_per_s": steady}


def timed_epochs(loader, spec: dict, sampler: MemorySampler, epochs: int = 1, set_epoch=False, **limits) -> list:
    out = []
    for e in range(epochs):
        if set_epoch:
            loader.set_epoch(e)
        ep = {"epoch": e + 1}
        with phase(sampler, ep, spec.get("by_thread", False)):
            ep.update(time_pass(loader, touch=spec.get("touch", False), first=sampler.sample, **limits))
        out.append(ep)
    return out


# --------------------------------------------------------------------------------------------------
# The configurations
# --------------------------------------------------------------------------------------------------
def run_l0(spec: dict, sampler: MemorySampler) -> dict:
    """Every chunk read once, in order, with plain zarr reads from ``threads`` threads (``threads`` reads in
    flight at most), results dropped. The decode limit the loaders are measured against."""
    arr = zarr.open_group(spec["store"], mode="r")[ARRAY]
    c, rows, threads = arr.chunks[0], arr.shape[0], spec["threads"]
    todo = iter(range(0, rows, c))
    out = {"epoch": 1}
    with phase(sampler, out, spec.get("by_thread", False)):
        t0 = time.perf_counter()
        first, n = None, 0
        with ThreadPoolExecutor(max_workers=threads) as pool:
            read = lambda s: arr[s : min(rows, s + c)]  # noqa: E731
            pending = [pool.submit(read, s) for _, s in zip(range(threads), todo, strict=False)]
            while pending:
                data = pending.pop(0).result()
                if (s := next(todo, None)) is not None:
                    pending.append(pool.submit(read, s))
                first = time.perf_counter() - t0 if first is None else first
                n += data.shape[0]
                del data  # after the next read started, as a consumer of the chunk would
        seconds = time.perf_counter() - t0
        out |= {"samples": n, "batches": ceil_div(rows, c), "seconds": seconds, "samples_per_s": n / seconds}
        out |= {"ttfb_s": first, "steady_samples_per_s": None}
    return {"epochs": [out]}


REMOTE_IN_FLIGHT = 8  # kind "remote": requests in flight per reading process, fixed (the adaptive default's start)


def zarrtorch_loader(spec: dict, cache: bool = False, **loader_options) -> ZarrDataLoader:
    """The benchmark's zarrtorch loader: shuffled, seed 0, ``drop_last``, persistent workers if any; kind
    ``remote``: the store read over HTTP from ``spec['url']`` with :data:`REMOTE_IN_FLIGHT` requests in flight."""
    w = spec["workers"]
    source, read = spec["store"], None
    if spec.get("kind") == "remote":
        source, read = spec["url"], ReadOptions(requests_in_flight=REMOTE_IN_FLIGHT)
    ds = ZarrIterableDataset(source, shuffle=True, seed=0, keep_in_memory=cache, read=read)
    persistent = {"persistent_workers": True} if w > 0 else {}
    return ZarrDataLoader(
        ds, batch_size=spec["batch_size"], num_workers=w, drop_last=True, **persistent, **loader_options
    )


def run_zarrtorch(spec: dict, sampler: MemorySampler) -> dict:
    """``ZarrDataLoader(ZarrIterableDataset(store))``, persistent workers (kind ``cache``: with
    ``cache=True``; kind ``remote``: over HTTP; kind ``rank``: ``batch_order="rank"``); ``spec['variant']``:
    another ``transport`` (``queue``), or the patch of ``prototypes.PATCHES`` applied first."""
    w, variant = spec["workers"], spec.get("variant")
    receive, kwargs = None, {}
    if variant in prototypes.TRANSPORTS:
        kwargs["transport"] = variant
    elif variant:
        receive = prototypes.PATCHES[variant](workers=w, batch_size=spec["batch_size"], row_shape=SAMPLE_SHAPE)
    if spec["kind"] == "rank":
        kwargs["batch_order"] = "rank"
    loader = zarrtorch_loader(spec, cache=spec["kind"] == "cache", **kwargs)
    budget = loader_memory(loader)  # the package's prediction of what the loader holds at most
    epochs = timed_epochs(loader, spec, sampler, spec["epochs"], set_epoch=True, receive=receive)
    buffer_chunks = loader.data.buffer_chunks
    del loader
    predicted = {"predicted_mib": budget.total / MiB, "budget": dataclasses.asdict(budget)}
    return {"epochs": epochs, "buffer_chunks": buffer_chunks, "variant": variant} | predicted


def run_paced(spec: dict, sampler: MemorySampler) -> dict:
    """Is a training step kept waiting? Epoch 1 in a tight loop gives the loader's own top rate (after the
    first batch); epochs 2 and 3 are consumed by a step that sleeps (the CPU idle, as while an accelerator
    computes) long enough to ask for ``spec['pace']`` of that rate. Reports the share of epoch 3's wall time
    (after its first batch) spent waiting in ``next(loader)``, and the share once the shuffle buffers are
    full: epoch 3 follows a paced epoch, as every epoch of a training run after its first does. Epoch 2,
    which follows the tight loop, is reported too (``after_tight_*``)."""
    loader = zarrtorch_loader(spec)
    epochs = timed_epochs(loader, spec, sampler, 1, set_epoch=True)
    top = epochs[0]["steady_samples_per_s"] or epochs[0]["samples_per_s"]
    step_s = spec["batch_size"] / (spec["pace"] * top)
    loader.set_epoch(1)
    after_tight = paced_epoch(loader, step_s)
    loader.set_epoch(2)
    result = paced_epoch(loader, step_s)
    del loader
    pace = {"top_samples_per_s": top, "step_ms": 1e3 * step_s, "pace": spec["pace"]}
    tight = {f"after_tight_{k}": after_tight[k] for k in ("data_wait_share", "steady_data_wait_share")}
    return {"epochs": epochs, "paced": pace | result | tight}


def run_reference(spec: dict, sampler: MemorySampler) -> dict:
    """zarr-torch-dataset 0.0.9 as its README shows it (chunk shuffle with a shared seed, buffer shuffle).
    Its ZarrDataLoader always uses persistent workers; an 'epoch' is one more ``iter(loader)``."""
    from zarrdataset import ZarrDataLoader, ZarrIterableDataset

    samples = zarr.open_group(spec["store"], mode="r")[ARRAY]
    ds = ZarrIterableDataset(
        samples=samples, targets=None, shuffle_chunks=True, chunks_shuffle_seed=0, shuffle_buffer=True
    )
    loader = ZarrDataLoader(dataset=ds, num_workers=spec["workers"], batch_size=spec["batch_size"], drop_last=True)
    return {"epochs": timed_epochs(loader, spec, sampler, spec["epochs"])}


def run_naive(spec: dict, sampler: MemorySampler) -> dict:
    """zarrtorch.course.baselines.RowByRowDataset in a standard DataLoader (shuffle=True): each row decodes
    its whole chunk. Bounded to ``batches`` batches (or ``max_seconds``)."""
    from zarrtorch.course.baselines import RowByRowDataset

    ds, generator = RowByRowDataset(spec["store"]), torch.Generator().manual_seed(0)
    kwargs = {"shuffle": True, "num_workers": spec["workers"], "generator": generator, "drop_last": True}
    loader = DataLoader(ds, spec["batch_size"], **kwargs)
    limits = {"max_batches": spec["batches"], "max_seconds": spec["max_seconds"]}
    return {"epochs": timed_epochs(loader, spec, sampler, **limits)}


class NothingToRead(IterableDataset):
    """Each worker yields ``batches`` batches of ``batch_size`` zeros (one float per row) at once: the first
    batch then times DataLoader's own start-up alone (forking the workers, the first index, the result
    queue), the floor under any loader's first batch with as many workers."""

    def __init__(self, batches: int, batch_size: int):
        self.batches, self.batch_size = batches, batch_size

    def __iter__(self):
        rows = torch.zeros(self.batch_size, 1)
        for _ in range(self.batches):
            yield {ARRAY: rows}


def run_startup(spec: dict, sampler: MemorySampler) -> dict:
    """DataLoader with persistent workers, as the benchmark's zarrtorch loader, over :class:`NothingToRead`."""
    ds = NothingToRead(8, spec["batch_size"])
    loader = DataLoader(ds, batch_size=None, num_workers=spec["workers"], persistent_workers=True)
    return {"epochs": timed_epochs(loader, spec, sampler, epochs=spec["epochs"])}


class RamBatches(IterableDataset):
    """Random batches gathered (sorted fancy indexing) from an array held in RAM; the workers each yield
    their share of an epoch's batches."""

    def __init__(self, data: np.ndarray, batch_size: int, seed: int = 0):
        self.data, self.batch_size, self.seed = data, batch_size, seed

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        rng = np.random.default_rng([self.seed, wid])
        for _ in range(wid, len(self.data) // self.batch_size, nw):
            idx = np.sort(rng.choice(len(self.data), self.batch_size, replace=False))
            yield {ARRAY: torch.from_numpy(self.data[idx])}


def run_numpy(spec: dict, sampler: MemorySampler) -> dict:
    """The ceiling without decoding: the whole array in RAM (loaded before timing), random batches.
    num_workers=0 iterates in the main process; with workers the batches cross the process boundary
    (the DataLoader's shared-memory transfer), which shows what that transfer alone costs."""
    t0 = time.perf_counter()
    ds = RamBatches(zarr.open_group(spec["store"], mode="r")[ARRAY][:], spec["batch_size"])
    load_s = time.perf_counter() - t0
    w = spec["workers"]
    loader = DataLoader(ds, batch_size=None, num_workers=w) if w > 0 else ds
    return {"epochs": timed_epochs(loader, spec, sampler), "load_s": load_s}


RUNNERS = {
    "l0": run_l0,
    "zarrtorch": run_zarrtorch,
    "prototype": run_zarrtorch,
    "paced": run_paced,
    "rank": run_zarrtorch,  # batch_order="rank": the workers read, the main process forms the batches
    "cache": run_zarrtorch,  # cache=True: the rows a process read stay in RAM for the next epochs
    "remote": run_zarrtorch,  # the store over HTTP (a server in the orchestrator), requests in flight fixed
    "reference": run_reference,
    "naive": run_naive,
    "numpy": run_numpy,
    "startup": run_startup,
}


def run_config(spec: dict) -> dict:
    """Run one configuration in this (fresh) process; returns its measurements."""
    import multiprocessing
    import warnings

    warnings.filterwarnings("ignore")
    # A process started by a forkserver inherits "forkserver" as its default start method; DataLoader
    # workers must be forked from this run as in an ordinary script on Linux (Python < 3.14).
    multiprocessing.set_start_method("fork", force=True)
    if spec.get("by_thread"):
        name_threads()  # before anything starts a thread (zarr's event loop and pools start on first use)
    t0 = time.perf_counter()
    smaps = SmapsPeaks() if spec.get("smaps") else None
    with MemorySampler(every_s=0.01, uss_every_s=spec.get("uss_period", 0.1)) as sampler:
        result = RUNNERS[spec["kind"]](spec, sampler)
    if smaps is not None:
        result["smaps"] = smaps.stop()
    return {**result, "wall_s": time.perf_counter() - t0, "pid": os.getpid()}


def entry(spec: dict, conn) -> None:
    """Target of every benchmark process: run ``spec`` and send back ``{"ok", "result" | "error"}``."""
    import traceback

    try:
        if spec["kind"] == "ensure_store":
            result = ensure_store(spec["data_dir"], spec["rows"], spec["chunk_rows"], spec["seed"])
        else:
            result = run_config(spec)
        conn.send({"ok": True, "result": result})
    except BaseException:  # report everything; the orchestrator decides
        conn.send({"ok": False, "error": traceback.format_exc()})
    finally:
        conn.close()
