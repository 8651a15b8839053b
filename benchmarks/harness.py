"""What one benchmark configuration does, in the fresh process that runs it.

Heavy imports (torch, zarr, both loaders) live here; ``run.py`` only orchestrates. The orchestrator starts
every (configuration, size, repetition) in a new process forked from a *forkserver* that imported this
module once: each run starts from the same clean state (no data, no threads running, no page of a
previous run), DataLoader workers are forked from that small process, and the ~2-4 s import of torch is
paid once instead of once per run.

Everything a run measures comes back as a plain dict (see :func:`run_config`).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

SAMPLE_SHAPE = (16, 32, 32)  # float32: 64 KiB per sample
DTYPE = np.dtype(np.float32)
ROW_BYTES = int(np.prod(SAMPLE_SHAPE)) * DTYPE.itemsize
ARRAY = "x"
GENERATOR_VERSION = 1  # bump when the generated values change; a store from another version is rewritten
MiB = 2**20
GiB = 2**30


# --------------------------------------------------------------------------------------------------
# Data: one deterministic array per (rows, chunk_rows, seed)
# --------------------------------------------------------------------------------------------------
def rows_for(gib: float, chunk_rows: int) -> int:
    """Whole chunks holding at least ``gib`` GiB of decoded samples (at least 2 chunks)."""
    chunks = max(2, math.ceil(gib * GiB / ROW_BYTES / chunk_rows - 1e-9))
    return chunks * chunk_rows


def store_path(data_dir: Path, rows: int, chunk_rows: int, seed: int) -> Path:
    shape = "x".join(map(str, SAMPLE_SHAPE))
    return Path(data_dir) / f"f32_{rows}x{shape}_c{chunk_rows}_zstd_s{seed}.zarr"


def _pattern() -> np.ndarray:
    """A smooth per-channel field, shape SAMPLE_SHAPE (the 'climatology' every sample varies around)."""
    c, h, w = SAMPLE_SHAPE
    yy, xx = np.meshgrid(np.linspace(0, np.pi, h), np.linspace(0, 2 * np.pi, w), indexing="ij")
    k = np.arange(c)[:, None, None]
    return (10.0 + 5.0 * np.sin(yy[None]) * np.cos((1 + k % 4) * xx[None] + k)).astype(np.float32)


def generate_rows(start: int, stop: int, *, chunk_rows: int, seed: int) -> np.ndarray:
    """Rows ``[start, stop)`` of the benchmark array: a pure function of ``(seed, row)``.

    Each chunk's noise comes from ``default_rng([seed, chunk])`` so any block gives the same values as the
    same rows inside a bigger one. Values are a smooth field with a slow drift plus Gaussian noise,
    rounded to 0.01 (like measured data with limited precision), so zstd compresses them moderately.
    """
    base = _pattern()
    out = np.empty((stop - start, *SAMPLE_SHAPE), dtype=np.float32)
    for chunk in range(start // chunk_rows, (stop - 1) // chunk_rows + 1):
        c0 = chunk * chunk_rows
        rng = np.random.default_rng([int(seed), int(chunk)])
        block = rng.standard_normal((chunk_rows, *SAMPLE_SHAPE), dtype=np.float32)
        t = (c0 + np.arange(chunk_rows, dtype=np.float32))[:, None, None, None]
        block += base * (1.0 + 0.2 * np.sin(t / 97.0 + np.arange(SAMPLE_SHAPE[0])[:, None, None]))
        np.round(block, 2, out=block)
        a, b = max(start, c0), min(stop, c0 + chunk_rows)
        out[a - start : b - start] = block[a - c0 : b - c0]
    return out


class _LazyRows:
    """Sliceable stand-in for the array, so prepare_zarr generates it block by block (bounded memory)."""

    def __init__(self, rows: int, chunk_rows: int, seed: int):
        self.shape = (rows, *SAMPLE_SHAPE)
        self.dtype = DTYPE
        self.chunk_rows, self.seed = chunk_rows, seed

    def __getitem__(self, sl: slice) -> np.ndarray:
        start, stop, _ = sl.indices(self.shape[0])
        return generate_rows(start, stop, chunk_rows=self.chunk_rows, seed=self.seed)


def store_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def ensure_store(data_dir: str, rows: int, chunk_rows: int, seed: int = 0) -> dict:
    """Create the store unless a complete one with the right shape exists; returns its description."""
    import json

    import zarr

    from zarrtorch import prepare_zarr

    path = store_path(Path(data_dir), rows, chunk_rows, seed)
    marker = path.with_suffix(".json")
    want = {
        "rows": rows,
        "chunk_rows": chunk_rows,
        "seed": seed,
        "sample_shape": list(SAMPLE_SHAPE),
        "dtype": DTYPE.name,
        "codec": "zstd",
        "level": 3,
        "generator_version": GENERATOR_VERSION,
    }
    if path.exists() and marker.exists():
        try:
            info = json.loads(marker.read_text())
            arr = zarr.open_group(str(path), mode="r")[ARRAY]
            if (
                all(info.get(k) == v for k, v in want.items())
                and tuple(arr.shape) == (rows, *SAMPLE_SHAPE)
                and tuple(arr.chunks) == (chunk_rows, *SAMPLE_SHAPE)
            ):
                return {**info, "path": str(path), "generated": False}
        except Exception:  # unreadable or partial: regenerate
            pass
    marker.unlink(missing_ok=True)
    t0 = time.perf_counter()
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    prepare_zarr(
        {ARRAY: _LazyRows(rows, chunk_rows, seed)},
        path,
        chunk_rows=chunk_rows,
        codec="zstd",
        level=3,
        overwrite=True,
        progress=False,
        max_memory_mb=128,
    )
    seconds = time.perf_counter() - t0
    nbytes = rows * ROW_BYTES
    info = {**want, "decoded_bytes": nbytes, "stored_bytes": store_bytes(path), "generation_s": round(seconds, 2)}
    info["compression_ratio"] = round(nbytes / info["stored_bytes"], 3)
    marker.write_text(json.dumps(info, indent=1))
    return {**info, "path": str(path), "generated": True}


# --------------------------------------------------------------------------------------------------
# Page cache
# --------------------------------------------------------------------------------------------------
def warm_page_cache(path: str) -> int:
    """Read every file of the store once so that every run finds it in the page cache."""
    total = 0
    for f in sorted(Path(path).rglob("*")):
        if f.is_file():
            with open(f, "rb", buffering=0) as fh:
                while chunk := fh.read(16 * MiB):
                    total += len(chunk)
    return total


def drop_page_cache() -> bool:
    """Drop the OS page cache (root only): ``sync; echo 1 > /proc/sys/vm/drop_caches``."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------------------------------
# Memory: peak RSS (and private memory) of this process and its children, sampled in a thread
# --------------------------------------------------------------------------------------------------
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def _uss(pid: int) -> int | None:
    """Private (unique) memory: what the process would give back if it exited. From smaps_rollup."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            text = f.read()
    except OSError:
        return None
    total = 0
    for line in text.splitlines():
        if line.startswith((b"Private_Clean:", b"Private_Dirty:", b"Private_Hugetlb:")):
            total += int(line.split()[1]) * 1024
    return total


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


def _children(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children", "rb") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


class MemorySampler:
    """Samples RSS of this process and all its descendants every ``period`` s (USS every ``uss_period``).

    Results are kept per *phase* (e.g. one epoch): for each process, the first and peak RSS/USS seen in the
    phase, plus the first values ever seen for that process (a forked worker's starting point).
    """

    def __init__(self, period: float = 0.01, uss_period: float = 0.1, children_period: float = 0.05):
        self.pid = os.getpid()
        self.period, self.uss_period, self.children_period = period, uss_period, children_period
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._phase: dict | None = None
        self._first: dict[int, dict] = {}
        self._order: list[int] = []
        self._kids: list[int] = []
        self.samples = 0
        self._cpu_last: dict[int, float] = {}
        self._cpu_start: dict[int, float] = {}
        self.base = {"rss": _rss(self.pid), "uss": _uss(self.pid)}
        self._thread = threading.Thread(target=self._loop, name="bench-memory", daemon=True)

    def start(self) -> MemorySampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _record(self, pid: int, key: str, value: int | None) -> None:
        if value is None:
            return
        first = self._first.setdefault(pid, {})
        first.setdefault(key, value)
        if pid not in self._order:
            self._order.append(pid)
        if self._phase is not None:
            d = self._phase.setdefault(pid, {})
            d.setdefault(f"{key}_first", value)
            d[f"{key}_peak"] = max(d.get(f"{key}_peak", 0), value)

    def sample(self, with_uss: bool, with_cpu: bool = False) -> None:
        pids = [self.pid] + self._kids
        with self._lock:
            for pid in pids:
                self._record(pid, "rss", _rss(pid))
                # USS is costly, so it is sampled less often, but always once for a process new in this
                # phase: a short-lived worker would otherwise have none
                new = self._phase is not None and "uss_peak" not in self._phase.get(pid, {})
                if with_uss or new:
                    self._record(pid, "uss", _uss(pid))
                if with_cpu and (cpu := _cpu(pid)) is not None:
                    self._cpu_last[pid] = cpu
            self.samples += 1

    def _loop(self) -> None:
        next_kids = next_uss = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            with_cpu = now >= next_kids
            if with_cpu:
                self._kids = _children(self.pid)
                next_kids = now + self.children_period
            with_uss = self.uss_period > 0 and now >= next_uss
            if with_uss:
                next_uss = now + self.uss_period
            self.sample(with_uss, with_cpu)
            self._stop.wait(self.period)

    @contextlib.contextmanager
    def phase(self, out: dict):
        """Collect the peaks while the block runs into ``out['memory']``."""
        self._kids = _children(self.pid)
        self.sample(with_uss=False, with_cpu=True)
        with self._lock:
            self._phase = {}
            self._cpu_start = dict(self._cpu_last)
        try:
            yield
        finally:
            self._kids = _children(self.pid)
            self.sample(with_uss=self.uss_period > 0, with_cpu=True)  # last sample, processes still there
            with self._lock:
                phase, self._phase = self._phase, None
                cpu = {
                    pid: v - self._cpu_start.get(pid, 0.0)
                    for pid, v in self._cpu_last.items()
                    if pid == self.pid or pid in phase
                }
            out["memory"] = self._summarize(phase)
            out["cpu_s"] = sum(cpu.values())
            out["cpu_s_main"] = cpu.get(self.pid, 0.0)

    def _summarize(self, phase: dict) -> dict:
        main = phase.get(self.pid, {})
        workers = []
        for pid in self._order:
            if pid == self.pid or pid not in phase:
                continue
            d = phase[pid]
            workers.append(
                {
                    "pid": pid,
                    "rss_peak": d.get("rss_peak"),
                    "uss_peak": d.get("uss_peak"),
                    "rss_start": self._first[pid].get("rss"),
                    "uss_start": self._first[pid].get("uss"),
                }
            )
        return {
            "main": {
                "rss_peak": main.get("rss_peak"),
                "uss_peak": main.get("uss_peak"),
                "rss_start": self.base["rss"],
                "uss_start": self.base["uss"],
            },
            "workers": workers,
        }


def held_bytes(memory: dict) -> int:
    """Memory a loader holds: what the main process grew (peak RSS - RSS at start) plus the private memory
    (peak USS) of each worker. Pages a forked worker shares with its parent are not counted, pages it
    writes (its buffers, decoded chunks, CoW copies) are."""
    main = memory["main"]
    total = max(0, (main["rss_peak"] or 0) - (main["rss_start"] or 0))
    for w in memory["workers"]:
        total += w["uss_peak"] or 0
    return total


# --------------------------------------------------------------------------------------------------
# Timing one pass over a loader
# --------------------------------------------------------------------------------------------------
def _count(batch) -> int:
    if isinstance(batch, dict):
        batch = batch[ARRAY]
    elif isinstance(batch, (list, tuple)):
        batch = batch[0]
    return int(batch.shape[0])


def _touch(batch) -> None:
    if isinstance(batch, dict):
        batch = batch[ARRAY]
    elif isinstance(batch, (list, tuple)):
        batch = batch[0]
    float(batch.numpy().reshape(-1)[::1024].sum())  # one float per 4 KiB page (numpy: no torch threads)


def time_pass(
    loader, *, max_batches: int | None = None, max_seconds: float | None = None, touch: bool = False, receive=None
) -> dict:
    """Iterate once: samples, seconds (from ``iter()`` to the end), time to first batch. Stops early after
    ``max_batches`` batches, or after ``max_seconds`` (once at least 2 batches are in)."""
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
            if touch:
                _touch(batch)
            n += _count(batch)
            batches += 1
            del batch
            if max_batches is not None and batches >= max_batches:
                break
            if max_seconds is not None and batches >= 2 and time.perf_counter() - t0 > max_seconds:
                break
    finally:
        seconds = time.perf_counter() - t0
        del it
    steady = (n - n / max(1, batches)) / (seconds - ttfb) if batches > 1 and seconds > ttfb else None
    return {
        "samples": n,
        "batches": batches,
        "seconds": seconds,
        "samples_per_s": n / seconds,
        "ttfb_s": ttfb,
        "steady_samples_per_s": steady,
    }


# --------------------------------------------------------------------------------------------------
# The configurations
# --------------------------------------------------------------------------------------------------
def run_l0(spec: dict, sampler: MemorySampler) -> dict:
    """Every chunk read once, in order, with plain zarr reads from ``threads`` threads (``threads``
    reads in flight at most), results dropped. The decode limit the loaders are measured against."""
    import zarr

    arr = zarr.open_group(spec["store"], mode="r")[ARRAY]
    c, rows, threads = arr.chunks[0], arr.shape[0], spec["threads"]
    starts = list(range(0, rows, c))
    out = {}
    with sampler.phase(out):
        t0 = time.perf_counter()
        first = None
        with ThreadPoolExecutor(max_workers=threads) as pool:
            pending = []
            todo = iter(starts)
            for s in todo:
                pending.append(pool.submit(arr.__getitem__, slice(s, min(rows, s + c))))
                if len(pending) >= threads:
                    break
            n = 0
            while pending:
                data = pending.pop(0).result()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append(pool.submit(arr.__getitem__, slice(nxt, min(rows, nxt + c))))
                if first is None:
                    first = time.perf_counter() - t0
                n += data.shape[0]
                del data
        seconds = time.perf_counter() - t0
    out.update(
        {
            "samples": n,
            "batches": len(starts),
            "seconds": seconds,
            "samples_per_s": n / seconds,
            "ttfb_s": first,
            "steady_samples_per_s": None,
        }
    )
    return {"epochs": [out]}


def run_zarrtorch(spec: dict, sampler: MemorySampler, receive=None) -> dict:
    from zarrtorch import ZarrDataLoader, ZarrIterableDataset

    w = spec["workers"]
    ds = ZarrIterableDataset(
        spec["store"],
        shuffle=True,
        seed=0,
        buffer_chunks=spec.get("buffer_chunks", 8),
        decode_threads=spec.get("decode_threads"),
    )
    kwargs = {"persistent_workers": True} if w > 0 else {}
    loader = ZarrDataLoader(ds, batch_size=spec["batch_size"], num_workers=w, drop_last=True, **kwargs)
    epochs = []
    for e in range(spec["epochs"]):
        loader.set_epoch(e)
        out = {"epoch": e + 1}
        with sampler.phase(out):
            out.update(time_pass(loader, touch=spec.get("touch", False), receive=receive))
        epochs.append(out)
    del loader
    return {
        "epochs": epochs,
        "decode_threads": spec.get("decode_threads") or max(1, _cpus() // max(1, w)),
        "buffer_chunks": ds.buffer_chunks,
        "persistent_workers": w > 0,
    }


def run_prototype(spec: dict, sampler: MemorySampler) -> dict:
    """zarrtorch with the monkeypatched prototypes of profile_stream.py (``spec['variant']``, e.g.
    ``ring``): the proposals not adopted yet, measured under the same conditions as the rest."""
    import profile_stream

    receive = None
    if "ring" in spec["variant"].split("+") and spec["workers"] > 0:
        receive = profile_stream.patch_ring(spec["workers"], spec["batch_size"], SAMPLE_SHAPE)
    return {**run_zarrtorch(spec, sampler, receive=receive), "variant": spec["variant"]}


def run_reference(spec: dict, sampler: MemorySampler) -> dict:
    """zarr-torch-dataset 0.0.9 as its README shows it (chunk shuffle with a shared seed, buffer shuffle).
    Its ZarrDataLoader always uses persistent workers; an 'epoch' is one more ``iter(loader)``."""
    import zarr
    from zarrdataset import ZarrDataLoader, ZarrIterableDataset

    samples = zarr.open_group(spec["store"], mode="r")[ARRAY]
    ds = ZarrIterableDataset(
        samples=samples,
        targets=None,
        shuffle_chunks=True,
        chunks_shuffle_seed=0,
        shuffle_buffer=True,
        buffer_shuffle_seed=None,
    )
    loader = ZarrDataLoader(dataset=ds, num_workers=spec["workers"], batch_size=spec["batch_size"], drop_last=True)
    epochs = []
    for e in range(spec["epochs"]):
        out = {"epoch": e + 1}
        with sampler.phase(out):
            out.update(time_pass(loader, touch=spec.get("touch", False)))
        epochs.append(out)
    del loader
    return {"epochs": epochs}


def run_naive(spec: dict, sampler: MemorySampler) -> dict:
    """zarrtorch.course.baselines.RowByRowDataset in a standard DataLoader (shuffle=True): each row decodes
    its whole chunk. Bounded to ``batches`` batches (or ``max_seconds``)."""
    import torch
    from torch.utils.data import DataLoader

    from zarrtorch.course.baselines import RowByRowDataset

    ds = RowByRowDataset(spec["store"])
    loader = DataLoader(
        ds,
        batch_size=spec["batch_size"],
        shuffle=True,
        num_workers=spec["workers"],
        generator=torch.Generator().manual_seed(0),
        drop_last=True,
    )
    out = {"epoch": 1}
    with sampler.phase(out):
        out.update(
            time_pass(
                loader, max_batches=spec["batches"], max_seconds=spec.get("max_seconds"), touch=spec.get("touch", False)
            )
        )
    return {"epochs": [out]}


class _RamBatches:
    """Random batches gathered (sorted fancy indexing) from an array held in RAM; an IterableDataset whose
    workers each yield their share of an epoch's batches."""

    def __init__(self, data: np.ndarray, batch_size: int, seed: int = 0):
        self.data, self.batch_size, self.seed = data, batch_size, seed

    def __iter__(self):
        import torch
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        n_batches = len(self.data) // self.batch_size
        rng = np.random.default_rng([self.seed, wid])
        for _ in range(wid, n_batches, nw):
            idx = np.sort(rng.choice(len(self.data), self.batch_size, replace=False))
            yield {ARRAY: torch.from_numpy(self.data[idx])}


def run_numpy(spec: dict, sampler: MemorySampler) -> dict:
    """The ceiling without decoding: the whole array in RAM (loaded before timing), random batches.
    num_workers=0 iterates in the main process; with workers the batches cross the process boundary
    (the DataLoader's shared-memory transfer), which shows what that transfer alone costs."""
    import zarr
    from torch.utils.data import DataLoader, IterableDataset

    class RamDataset(_RamBatches, IterableDataset):
        pass

    t0 = time.perf_counter()
    data = zarr.open_group(spec["store"], mode="r")[ARRAY][:]
    load_s = time.perf_counter() - t0
    ds = RamDataset(data, spec["batch_size"])
    w = spec["workers"]
    loader = DataLoader(ds, batch_size=None, num_workers=w) if w > 0 else ds
    out = {"epoch": 1}
    with sampler.phase(out):
        out.update(time_pass(loader, touch=spec.get("touch", False)))
    return {"epochs": [out], "load_s": load_s}


RUNNERS = {
    "l0": run_l0,
    "zarrtorch": run_zarrtorch,
    "reference": run_reference,
    "naive": run_naive,
    "numpy": run_numpy,
    "prototype": run_prototype,
}


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def run_config(spec: dict) -> dict:
    """Run one configuration in this (fresh) process; returns its measurements."""
    import multiprocessing
    import warnings

    warnings.filterwarnings("ignore")
    # A process started by a forkserver inherits "forkserver" as its default start method; DataLoader
    # workers must be forked from this run as in an ordinary script on Linux (Python < 3.14).
    multiprocessing.set_start_method(spec.get("start_method", "fork"), force=True)
    sampler = MemorySampler(period=spec.get("rss_period", 0.01), uss_period=spec.get("uss_period", 0.1)).start()
    t0 = time.perf_counter()
    try:
        result = RUNNERS[spec["kind"]](spec, sampler)
    finally:
        sampler.stop()
    for e in result["epochs"]:
        e["held_bytes"] = held_bytes(e["memory"])
    result["wall_s"] = time.perf_counter() - t0
    result["memory_samples"] = sampler.samples
    result["pid"] = os.getpid()
    return result


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
