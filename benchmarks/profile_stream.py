"""Where zarrtorch's streaming path spends its CPU, and what prototype changes would save.

    .venv/bin/python benchmarks/profile_stream.py --workers 0            # decode threads in the main process
    .venv/bin/python benchmarks/profile_stream.py --workers 2            # 2 DataLoader workers
    .venv/bin/python benchmarks/profile_stream.py --workers 2 --variant shm
    .venv/bin/python benchmarks/profile_stream.py --micro                # the elementary costs
    perf record -F 499 -g -o /tmp/perf.data -- .venv/bin/python benchmarks/profile_stream.py --workers 2
    perf report -i /tmp/perf.data --no-children --sort comm,dso          # threads are named (see below)

CPU time, not wall time, is what this measures: on a shared machine wall time depends on the neighbours,
CPU-seconds per sample much less. Every Python thread gets its OS name set to its Python name (prctl), so
``/proc/<pid>/task/<tid>/stat`` (sampled every 50 ms) splits each process's CPU by role:

- ``main``: the process consuming batches (and, with 0 workers, running the shuffle buffer);
- ``worker-main``: a DataLoader worker's main thread (shuffle buffer: refill + gather copies, schedule);
- ``QueueFeederThr``: a worker's queue feeder, which pickles each batch: torch moves the batch's storage
  to a new shared-memory segment (a copy) before sending its file descriptor;
- ``zarr_pool*``: zarr's executor threads (file read, zstd decode, copy into the output array);
- ``zarr_io``: zarr's event-loop thread; ``zarrtorch-read*``: PieceReader threads (wait on zarr).

Variants (monkeypatches in this process and its forked workers only; the package is not modified):

Two earlier variants are now in the package: ``direct`` (decode the chunk file straight into the returned
array: ``zarrtorch.fastpath``) and ``lazyrefill`` (refill freed slots when the next batch starts:
``SlotBuffer.apply``).

- ``shm``: in a DataLoader worker, the buffer's gather writes the batch straight into a shared-memory
  tensor (as torch's default_collate does), so the queue feeder no longer copies it again;
- ``nocheck``: check_chunks=False (no ``exists`` round trip through zarr's event loop per piece);
- ``fs``: torch's ``file_system`` sharing strategy (no file-descriptor passing per batch);
- ``ring``: batches cross the process boundary through a ring of shared-memory slots allocated once
  before the workers fork (pages already faulted); a worker gathers into its next free slot and sends
  (worker, slot, rows); the main process copies the rows out into ordinary memory and frees the slot.
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import io
import json
import os
import pstats
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness  # noqa: E402
import numpy as np  # noqa: E402

_libc = ctypes.CDLL(None)
_TICK = os.sysconf("SC_CLK_TCK")


def _set_os_thread_name(name: str) -> None:
    _libc.prctl(15, name[:15].encode(), 0, 0, 0)  # PR_SET_NAME


def name_threads() -> None:
    """Give every Python thread started from now on its Python name at the OS level."""
    original = threading.Thread._bootstrap_inner

    def bootstrap(self):
        _set_os_thread_name(self.name)
        original(self)

    threading.Thread._bootstrap_inner = bootstrap
    _set_os_thread_name("main")


def role(comm: str) -> str:
    for prefix, r in (
        ("zarr_pool", "zarr pool (read+decode)"),
        ("asyncio_", "zarr pool (read+decode)"),
        ("zarr_io", "zarr_io (event loop, copy into out)"),
        ("zarrtorch-read", "zarrtorch-read (PieceReader)"),
        ("QueueFeeder", "QueueFeederThread (pickle->shm)"),
        ("worker-main", "worker main (buffer, schedule)"),
        ("main", "main thread"),
        ("ThreadPoolExec", "other pool threads"),
        ("bench-cpu", "this profiler's sampler"),
    ):
        if comm.startswith(prefix):
            return r
    return f"other ({comm})"


class ThreadCPU:
    """Per-thread CPU (user, system) of this process and its children, sampled until stopped; threads that
    exit keep their last sampled value (at most ``period`` of CPU lost each)."""

    def __init__(self, period: float = 0.05):
        self.period = period
        self.pid = os.getpid()
        self.last: dict[tuple[int, int], tuple[str, float, float]] = {}
        self.proc_total: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-cpu", daemon=True)

    def _pids(self):
        return [self.pid] + harness._children(self.pid)

    def sample(self):
        for pid in self._pids():
            t = harness._cpu(pid)
            if t is not None:
                self.proc_total[pid] = t
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/comm") as f:
                        comm = f.read().strip()
                    with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                        fields = f.read().rsplit(b")", 1)[1].split()
                except OSError:
                    continue
                self.last[(pid, int(tid))] = (comm, int(fields[11]) / _TICK, int(fields[12]) / _TICK)

    def _loop(self):
        while not self._stop.wait(self.period):
            self.sample()

    def __enter__(self):
        self.sample()
        self.start = dict(self.last)
        self.start_total = dict(self.proc_total)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()

    def breakdown(self) -> dict:
        out: dict[tuple[str, str], list[float]] = {}
        for (pid, tid), (comm, u, s) in self.last.items():
            u0, s0 = self.start.get((pid, tid), (comm, 0.0, 0.0))[1:]
            proc = "main process" if pid == self.pid else "workers"
            acc = out.setdefault((proc, role(comm)), [0.0, 0.0])
            acc[0] += u - u0
            acc[1] += s - s0
        total = sum(v - self.start_total.get(pid, 0.0) for pid, v in self.proc_total.items())
        return {"threads": out, "process_total": total}


# --------------------------------------------------------------------------------------------------
# Prototypes (monkeypatches)
# --------------------------------------------------------------------------------------------------
def patch_shm_gather() -> None:
    """In a DataLoader worker, gather each batch straight into a new shared-memory tensor."""
    import torch
    from torch.utils.data import get_worker_info

    from zarrtorch import buffer as zbuffer
    from zarrtorch import dataset as zdataset

    def gather(column: np.ndarray, take: np.ndarray):
        if get_worker_info() is None or column.dtype != np.float32:
            return column[take]
        numel = int(len(take) * np.prod(column.shape[1:]))
        storage = torch.empty(0, dtype=torch.float32)._typed_storage()._new_shared(numel, device="cpu")
        t = torch.empty(0, dtype=torch.float32).new(storage).resize_(len(take), *column.shape[1:])
        np.take(column, take, axis=0, out=t.numpy(), mode="clip")
        return t

    def to_torch(self, batch, copy_arrays):
        out = {}
        for name, arr in batch.items():
            if name == "index" and not self.return_index:
                continue
            if isinstance(arr, torch.Tensor):
                out[name] = arr
            else:
                out[name] = torch.from_numpy(arr.copy() if copy_arrays else arr)
        return self.transform(out) if self.transform is not None else out

    zbuffer.SlotBuffer._gather = lambda self, column, take: gather(column, take)
    zdataset.ZarrIterableDataset._to_torch = to_torch


RING_SLOTS = 4  # per worker: > prefetch_factor (2) batches in the queue + the one the main process copies


def patch_ring(workers: int, batch_size: int, row_shape: tuple, dtype=np.float32):
    """Batches cross the process boundary through a ring of shared-memory slots allocated (and touched)
    once before the workers fork: a worker gathers the batch into its next free slot and sends only
    (worker, slot, rows); the main process copies the rows out into ordinary memory and frees the slot.
    Returns the function the main process applies to each batch."""
    import torch
    from torch.utils.data import get_worker_info

    from zarrtorch import buffer as zbuffer
    from zarrtorch import dataset as zdataset

    ring = torch.zeros((workers, RING_SLOTS, batch_size, *row_shape), dtype=torch.float32).share_memory_()
    busy = torch.zeros((workers, RING_SLOTS), dtype=torch.int32).share_memory_()
    ring_np, busy_np = ring.numpy(), busy.numpy()
    state = {"next": 0}

    def gather(column, take):
        info = get_worker_info()
        if info is None or column.dtype != dtype:
            return column[take]
        w, slot = info.id, state["next"] % RING_SLOTS
        state["next"] += 1
        while busy_np[w, slot]:  # the main process has not copied this slot out yet
            time.sleep(0.0005)
        busy_np[w, slot] = 1
        np.take(column, take, axis=0, out=ring_np[w, slot, : len(take)], mode="clip")
        return (w, slot, len(take))

    def to_torch(self, batch, copy_arrays):
        out = {}
        for name, arr in batch.items():
            if name == "index" and not self.return_index:
                continue
            out[name] = arr if isinstance(arr, tuple) else torch.from_numpy(arr.copy() if copy_arrays else arr)
        return self.transform(out) if self.transform is not None else out

    zbuffer.SlotBuffer._gather = lambda self, column, take: gather(column, take)
    zdataset.ZarrIterableDataset._to_torch = to_torch

    def receive(batch: dict) -> dict:
        out = {}
        for name, v in batch.items():
            if isinstance(v, (tuple, list)) and len(v) == 3:
                w, slot, n = (int(x) for x in v)
                out[name] = torch.from_numpy(ring_np[w, slot, :n].copy())
                busy_np[w, slot] = 0
            else:
                out[name] = v
        return out

    return receive


def _worker_init(_):
    _set_os_thread_name("worker-main")


# --------------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------------
def profile_loader(store: str, workers: int, epochs: int, variant: str, cprofile: bool, top: int) -> dict:
    import torch
    import torch.multiprocessing

    from zarrtorch import ZarrDataLoader, ZarrIterableDataset

    parts = set(variant.split("+")) - {"baseline"}
    if parts & {"direct", "lazyrefill"}:
        raise SystemExit("direct decode and lazy refill are in the package now (zarrtorch.fastpath, SlotBuffer)")
    if "shm" in parts:
        patch_shm_gather()
    if "fs" in parts:
        torch.multiprocessing.set_sharing_strategy("file_system")
    receive = lambda b: b
    if "ring" in parts and workers > 0:
        receive = patch_ring(workers, 64, tuple(harness.SAMPLE_SHAPE))
    ds = ZarrIterableDataset(store, shuffle=True, seed=0, check_chunks="nocheck" not in parts)
    kwargs = {"persistent_workers": True, "worker_init_fn": _worker_init} if workers else {}
    loader = ZarrDataLoader(ds, batch_size=64, num_workers=workers, drop_last=True, **kwargs)
    # Epoch 0 untimed: worker start-up and first touches of the buffer are not the steady state.
    loader.set_epoch(0)
    for b in loader:
        receive(b)
    prof = cProfile.Profile(time.thread_time) if cprofile else None  # CPU time of the main thread
    samples = 0
    with ThreadCPU() as cpu:
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        for e in range(1, epochs + 1):
            loader.set_epoch(e)
            for b in loader:
                b = receive(b)
                samples += b["x"].shape[0]
        if prof:
            prof.disable()
        wall = time.perf_counter() - t0
    bd = cpu.breakdown()
    del loader
    res = {"samples": samples, "wall_s": wall, "samples_per_s": samples / wall, **bd}
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
        res["cprofile"] = s.getvalue()
    return res


def print_breakdown(res: dict, title: str) -> None:
    n = res["samples"]
    total = res["process_total"]
    print(
        f"\n== {title}: {n} samples in {res['wall_s']:.2f} s wall ({res['samples_per_s']:,.0f}/s), "
        f"CPU {1e6 * total / n:,.0f} us/sample =="
    )
    print(f"{'process':13s} {'thread role':36s} {'user us/smp':>11s} {'sys us/smp':>10s} {'share':>6s}")
    rows = sorted(res["threads"].items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    attributed = 0.0
    for (proc, r), (u, s) in rows:
        if u + s <= 0:
            continue
        attributed += u + s
        print(f"{proc:13s} {r:36s} {1e6 * u / n:11,.1f} {1e6 * s / n:10,.1f} {100 * (u + s) / total:5.1f}%")
    rest = total - attributed
    print(f"{'':13s} {'(exited threads, not sampled)':36s} {1e6 * rest / n:11,.1f} {'':10s} {100 * rest / total:5.1f}%")
    if "cprofile" in res:
        print("\ncProfile of the main thread (thread CPU time, tottime):")
        print("\n".join(res["cprofile"].splitlines()[:60]))


# --------------------------------------------------------------------------------------------------
# Elementary costs
# --------------------------------------------------------------------------------------------------
def _cpu_per(fn, reps: int) -> float:
    fn()
    t = time.thread_time()
    for _ in range(reps):
        fn()
    return (time.thread_time() - t) / reps


def micro(store: str) -> None:
    from multiprocessing.reduction import ForkingPickler

    import numcodecs
    import torch
    import zarr

    arr = zarr.open_group(store, mode="r")["x"]
    c = arr.chunks[0]
    row = harness.ROW_BYTES
    n_chunks = arr.shape[0] // c
    codec = numcodecs.Zstd(level=3)
    chunk = np.empty((c, *harness.SAMPLE_SHAPE), np.float32)
    slots = np.random.default_rng(0).standard_normal((8 * c, *harness.SAMPLE_SHAPE), dtype=np.float32)
    take = np.random.default_rng(1).choice(8 * c, 64, replace=False)
    batch = torch.from_numpy(slots[:64].copy())
    print(f"\n== elementary costs, thread CPU time, us per sample ({row // 1024} KiB) ==")

    def per(label, seconds, rows):
        print(f"{label:70s} {1e6 * seconds / rows:8.1f}")

    # zarr's read runs in its own threads: count the whole process's CPU for it
    def proc_cpu(fn, reps):
        fn()
        t = time.process_time()
        for _ in range(reps):
            fn()
        return (time.process_time() - t) / reps

    ks = iter(range(10**9))

    def zarr_read():
        k = next(ks) % n_chunks
        return arr[k * c : (k + 1) * c]

    paths = [
        os.path.join(str(arr.store_path.store.root), arr.store_path.path, arr.metadata.encode_chunk_key((k, 0, 0, 0)))
        for k in range(n_chunks)
    ]
    raws = [open(q, "rb").read() for q in paths]
    per("zarr arr[a:b], one whole chunk (process CPU: read+decode+copy+async)", proc_cpu(zarr_read, 2 * n_chunks), c)
    per(
        "read chunk file (bytes, from the page cache)",
        _cpu_per(lambda: open(paths[next(ks) % n_chunks], "rb").read(), 2 * n_chunks),
        c,
    )
    per("zstd decode into a new buffer", _cpu_per(lambda: codec.decode(raws[next(ks) % n_chunks]), 2 * n_chunks), c)
    per(
        "zstd decode into a reused array (out=)",
        _cpu_per(lambda: codec.decode(raws[next(ks) % n_chunks], out=chunk), 2 * n_chunks),
        c,
    )
    per("copy a chunk into a reused array (memcpy, warm pages)", _cpu_per(lambda: np.copyto(chunk, slots[:c]), 20), c)
    per("copy a chunk into a new array (page faults + memcpy)", _cpu_per(lambda: slots[:c].copy(), 20), c)
    per(
        "refill: write 64 rows into random buffer slots",
        _cpu_per(lambda: slots.__setitem__(take, batch.numpy()), 50),
        64,
    )
    per("gather: 64 random rows into a new batch (fancy indexing)", _cpu_per(lambda: slots[take], 50), 64)
    out = np.empty((64, *harness.SAMPLE_SHAPE), np.float32)
    per(
        "gather: 64 random rows into a reused batch (np.take out=)",
        _cpu_per(lambda: np.take(slots, take, 0, out=out, mode="clip"), 50),
        64,
    )
    rng = np.random.default_rng(0)
    per(
        "schedule: rng.choice(1024, 64, replace=False)", _cpu_per(lambda: rng.choice(8 * c, 64, replace=False), 200), 64
    )

    def send():  # what a worker's queue feeder does with a 4 MiB batch (torch moves it to shared memory)
        b = torch.from_numpy(slots[take])
        return ForkingPickler.dumps({"x": b})

    per("worker: gather + pickle for the queue (copy into new shared memory)", _cpu_per(send, 20), 64)
    per("worker: gather only (for the difference above)", _cpu_per(lambda: torch.from_numpy(slots[take]), 20), 64)

    def shm_gather():
        storage = torch.empty(0)._typed_storage()._new_shared(64 * row // 4, device="cpu")
        t = torch.empty(0).new(storage).resize_(64, *harness.SAMPLE_SHAPE)
        np.take(slots, take, 0, out=t.numpy(), mode="clip")
        return ForkingPickler.dumps({"x": t})

    per("worker: gather straight into shared memory + pickle (prototype 'shm')", _cpu_per(shm_gather, 20), 64)

    def new_shm_touched():
        storage = torch.empty(0)._typed_storage()._new_shared(64 * row // 4, device="cpu")
        torch.empty(0).new(storage).numpy().fill(0)

    per("worker: new 4 MiB shared-memory segment, every page written once", _cpu_per(new_shm_touched, 20), 64)
    payloads = [send() for _ in range(21)]
    per(
        "main: unpickle a batch (receive the fd, map the shared memory)",
        _cpu_per(lambda: ForkingPickler.loads(payloads.pop()), 20),
        64,
    )
    payloads = [send() for _ in range(11)]
    per(
        "main: unpickle + touch every page of the batch",
        _cpu_per(lambda: float(ForkingPickler.loads(payloads.pop())["x"].numpy()[:, :, :, ::1024].sum()), 10),
        64,
    )
    per(
        "main: touch every page of a batch in ordinary memory",
        _cpu_per(lambda: float(batch.numpy()[:, :, :, ::1024].sum()), 10),
        64,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", help="a benchmark store (default: the one run.py generates for --gib)")
    p.add_argument("--gib", type=float, default=0.1)
    p.add_argument("--chunk-rows", type=int, default=128)
    p.add_argument("--data-dir", default=str(HERE.parent / "data" / "bench"))
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs (after one untimed)")
    p.add_argument("--variant", default="baseline", help="baseline or a '+' list of: shm, nocheck, fs, ring")
    p.add_argument("--cprofile", action="store_true", help="also cProfile the main thread")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--micro", action="store_true", help="elementary costs instead of a loader run")
    p.add_argument(
        "--compare",
        help="comma list of variants, each run --rounds times alternately in fresh "
        "processes; prints the median CPU per sample by thread role",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="write the single run's result here")
    a = p.parse_args(argv)
    if a.compare:
        return compare(a, argv if argv is not None else sys.argv[1:])
    name_threads()  # before anything starts a thread (zarr's event loop and pools start on first use)
    store = a.store or harness.ensure_store(a.data_dir, harness.rows_for(a.gib, a.chunk_rows), a.chunk_rows)["path"]
    harness.warm_page_cache(store)
    if a.micro:
        micro(store)
        return 0
    res = profile_loader(store, a.workers, a.epochs, a.variant, a.cprofile, a.top)
    print_breakdown(res, f"zarrtorch, {a.workers} workers, variant {a.variant}")
    if a.json:
        res["threads"] = [[proc, r, u, s] for (proc, r), (u, s) in res["threads"].items()]
        Path(a.json).write_text(json.dumps(res))
    return 0


def compare(a, argv: list[str]) -> int:
    """Run every variant ``rounds`` times, alternating, each in a fresh process (the patches are global)."""
    import statistics
    import subprocess
    import tempfile

    variants = [v.strip() for v in a.compare.split(",") if v.strip()]
    base = []
    skip = False
    for x in argv:  # the same options minus --compare/--rounds/--variant/--json
        if skip:
            skip = False
            continue
        if x in ("--compare", "--rounds", "--variant", "--json"):
            skip = True
            continue
        if x.startswith(("--compare=", "--rounds=", "--variant=", "--json=")):
            continue
        base.append(x)
    results: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for v in variants:
                out = Path(tmp) / f"{v}_{r}.json"
                subprocess.run(
                    [sys.executable, __file__, *base, "--variant", v, "--json", str(out)],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                res = json.loads(out.read_text())
                results[v].append(res)
                print(
                    f"round {r + 1} {v}: {1e6 * res['process_total'] / res['samples']:,.0f} us/sample CPU, "
                    f"{res['samples_per_s']:,.0f} samples/s wall",
                    flush=True,
                )
    roles = sorted({(proc, role_) for rs in results.values() for res in rs for proc, role_, *_ in res["threads"]})
    print(f"\n== median CPU us/sample over {a.rounds} rounds, {a.workers} workers ==")
    head = f"{'process / thread role':52s}" + "".join(f"{v:>16s}" for v in variants)
    print(head)
    for proc, role_ in roles:
        cells = []
        for v in variants:
            vals = [
                sum(u + s_ for p_, r_, u, s_ in res["threads"] if (p_, r_) == (proc, role_)) / res["samples"]
                for res in results[v]
            ]
            cells.append(f"{1e6 * statistics.median(vals):16,.1f}")
        if any(float(c.replace(",", "")) > 0.05 for c in cells):
            print(f"{proc + ' / ' + role_:52s}" + "".join(cells))
    for label, fn in (
        ("TOTAL CPU us/sample", lambda res: 1e6 * res["process_total"] / res["samples"]),
        ("samples/s (wall, machine-dependent)", lambda res: res["samples_per_s"]),
    ):
        print(f"{label:52s}" + "".join(f"{statistics.median(fn(res) for res in results[v]):16,.1f}" for v in variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
