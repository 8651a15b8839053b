"""Forecast windows (2 input + 4 target steps) from one-step and 16-step chunks, all in one run.

    .venv/bin/python benchmarks/windows.py            # generated stores under data/bench, about 2 minutes
    .venv/bin/python benchmarks/windows.py --rows 1000 --repeats 1   # a quick look (tests run this)

For each store: the decode limit (every chunk read once, in order, in ``--threads`` threads, the CPUs by default:
time steps/s) through zarr (``arr[a:b]``, L0 as in run.py), through zarrtorch's own chunk reader (L0r: no windows,
no buffer) and with plain threads that open, read and decode the chunk files and do nothing else (raw), zarrtorch's
windows with default settings (0 and 2 workers) and an anemoi-style reader (a map-style dataset reading each
step of each window on its own, DataLoader ``shuffle=True``), with windows/s, windows/s over L0r's steps/s, and
chunk decodes per chunk per epoch: counted at the reader with 0 workers, and with workers from the reads each
worker's plan makes (``zarrtorch.window_stream.chunk_reads``, what the worker runs). Then the block-length
trade-off for ten years of hourly one-step chunks (``--trade-steps``), on window ids alone: decodes per chunk
and the most chunks a worker holds (4 ranks x 2 workers), and shuffle quality of one rank's epoch (1 rank x 2
workers; lesson 03's measures, on 100-step stretches) against a perfect shuffle of window starts. Figures are
medians of ``--repeats`` epochs; ratios are from this one run. ``--cold``: every figure of the stores also
with the store's files dropped from the page cache before each pass (``pagecache.py``, as ``layouts.py --cold``),
the warm ones read into it first, with the share of the store's pages resident before the passes and cold / warm.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numcodecs
import numpy as np
import pagecache

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import zarr  # noqa: E402

from zarrtorch import ReadOptions, ReadPlan, ZarrDataLoader, ZarrIterableDataset, prepare_zarr  # noqa: E402
from zarrtorch._read.chunks import chunk_key  # noqa: E402
from zarrtorch._read.reader import PieceReader  # noqa: E402
from zarrtorch._util.process import available_cpus  # noqa: E402
from zarrtorch.buffer import buffer_rng  # noqa: E402
from zarrtorch.course.memory import MemorySampler  # noqa: E402
from zarrtorch.plan import EpochSpec, Topology  # noqa: E402
from zarrtorch.quality import perfect_shuffle_batches, shuffle_quality  # noqa: E402
from zarrtorch.resume import batches_of  # noqa: E402
from zarrtorch.window_stream import (  # noqa: E402
    chunk_reads,
    held_chunks_bound,
    window_chunks_for_batches,
    worker_window_batches,
)
from zarrtorch.windows import Windows, WindowStarts  # noqa: E402

WINDOWS = Windows(history=2, lead=4)
BATCH = 32
ROW_SHAPE = (8, 32, 32)  # 32 KiB per time step


DATA = ROOT / "data" / "bench"


def generated_store(rows: int, chunk_rows: int, data_dir: Path = DATA) -> Path:
    path = Path(data_dir) / f"windows-{rows}x{chunk_rows}.zarr"
    if not path.exists():
        t = np.arange(rows, dtype=np.float32)[:, None, None, None]
        noise = np.random.default_rng(0).standard_normal((rows, *ROW_SHAPE)).astype(np.float32)
        values = (np.sin(t / 24.0) + 0.1 * noise).round(2)
        prepare_zarr({"fields": values}, path, chunk_rows=chunk_rows, progress=False)
    return path


def reader_limit(path: Path, threads: int) -> float:
    """Time steps/s reading every chunk once, in order, with zarrtorch's chunk reader in ``threads`` threads,
    as many chunks to a task as the loader reads (L0r)."""
    ds = ZarrIterableDataset(path)
    c, rows = ds.chunk_rows, ds.rows
    pieces = np.array([(a, min(a + c, rows)) for a in range(0, rows, c)], dtype=np.int64)
    reader = PieceReader(
        ds.arrays, c, threads=threads, prefetch=threads + 1, pieces_per_read=ReadPlan.of(ds, 0).pieces_per_read
    )
    start = time.perf_counter()
    for _ in reader.iter_pieces(pieces):
        pass
    return rows / (time.perf_counter() - start)


def raw_limit(path: Path, threads: int) -> float:
    """Time steps/s of plain threads, each opening, reading and zstd-decoding its share of the chunk files into
    one buffer of its own: the decode limit with no loader around it (no checks, nothing handed on)."""
    arr = zarr.open_group(path, mode="r")["fields"]
    root = Path(str(arr.store_path.store.root))
    files = [root / chunk_key(arr, k) for k in range(-(-arr.shape[0] // arr.chunks[0]))]
    chunk_bytes = int(np.prod(arr.chunks)) * arr.dtype.itemsize

    def decode(part: list[Path]) -> None:
        zstd, out = numcodecs.Zstd(), np.empty(chunk_bytes, np.uint8)
        for f in part:
            zstd.decode(f.read_bytes(), out=out)

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(decode, [files[k::threads] for k in range(threads)]))
    return arr.shape[0] / (time.perf_counter() - start)


def decode_limit(path: Path, threads: int) -> float:
    """Time steps/s reading every chunk once, in order, in ``threads`` threads through zarr (L0)."""
    arr = zarr.open_group(path, mode="r")["fields"]
    c = arr.chunks[0]
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: arr[i : i + c].shape, range(0, arr.shape[0], c)))
    return arr.shape[0] / (time.perf_counter() - start)


class StepByStep(torch.utils.data.Dataset):
    """anemoi-style: a window is its dates, each read on its own (one chunk decode per step)."""

    def __init__(self, path: Path, windows: Windows):
        self.path, self.offsets, self.history = str(path), windows.offsets, windows.history
        self.n = zarr.open_group(path, mode="r")["fields"].shape[0] - windows.span + 1
        self.arr = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.arr is None:
            self.arr = zarr.open_group(self.path, mode="r")["fields"]
        steps = np.stack([self.arr[i + o] for o in self.offsets])
        return torch.from_numpy(steps[: self.history]), torch.from_numpy(steps[self.history :])


def timed_epochs(make_iter, repeats: int, before=None) -> tuple[float, int]:
    """Median windows/s of ``repeats`` epochs and the windows of the last; ``before()`` runs just before each
    epoch's clock starts (the page cache made cold or warm)."""
    rates, n = [], 0
    for epoch in range(repeats):
        epoch_iter = make_iter(epoch)
        if before is not None:
            before()
        start, n = time.perf_counter(), 0
        for batch in epoch_iter:
            n += len(batch[0] if isinstance(batch, (list, tuple)) else batch["fields"])
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates), n


def zarrtorch_run(path: Path, workers: int, repeats: int, decode_threads: int | None = None, before=None) -> dict:
    ds = ZarrIterableDataset(path, windows=WINDOWS, seed=0, read=ReadOptions(decode_threads=decode_threads))
    loader = ZarrDataLoader(ds, batch_size=BATCH, num_workers=workers, persistent_workers=workers > 0)
    reads = []
    original = PieceReader.read_piece

    def counted(self, start, stop, **kwargs):  # 0 workers: every chunk read, as the reader is asked for it
        reads.append(start)
        return original(self, start, stop, **kwargs)

    PieceReader.read_piece = counted
    try:

        def epoch_iter(epoch):
            loader.set_epoch(epoch)
            return loader

        with MemorySampler(every_s=0.005) as sampler:
            rate, windows = timed_epochs(epoch_iter, repeats, before)
    finally:
        PieceReader.read_piece = original
    held = sampler.held
    n_chunks = -(-ds.store_rows // ds.store_chunk_rows)
    if workers:  # counted from the reads each worker's plan makes
        decodes = planned_reads(ds, loader.spec, Topology(0, 1, workers), repeats - 1) / n_chunks
    else:
        decodes = len(reads) / repeats / n_chunks
    return {"windows_s": rate, "windows": windows, "decodes_per_chunk": decodes, "held_mib": held / 2**20}


def planned_reads(ds, spec, topology: Topology, epoch: int) -> int:
    plan = spec.plan(epoch, topology)
    total = 0
    for share in plan.workers:
        rng = buffer_rng(spec.seed, epoch, topology.rank, share.worker, spec.row_shuffle)
        batches = worker_window_batches(share, buffer_rows=spec.buffer_rows, warmup_rows=spec.chunk_rows, rng=rng)
        most_held = window_chunks_for_batches(ds, spec.batch_size)  # what the worker keeps to
        reads = chunk_reads(batches, share.pieces, ds.starts, WINDOWS.offsets, ds.store_chunk_rows, most_held=most_held)
        total += len(reads.chunks)
    return total


def step_by_step_run(path: Path, workers: int, repeats: int, max_batches: int, before=None) -> dict:
    ds = StepByStep(path, WINDOWS)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=BATCH, shuffle=True, num_workers=workers, generator=torch.Generator().manual_seed(0)
    )

    def epoch_iter(epoch):
        for k, batch in enumerate(loader):
            if k == max_batches:
                return
            yield batch

    with MemorySampler(every_s=0.005) as sampler:
        rate, windows = timed_epochs(epoch_iter, repeats, before)
    chunk_rows = zarr.open_group(path, mode="r")["fields"].chunks[0]
    # every step of every window decodes its chunk: steps x windows reads over windows / chunk_rows chunks
    decodes = WINDOWS.steps * chunk_rows
    return {"windows_s": rate, "windows": windows, "decodes_per_chunk": decodes, "held_mib": sampler.held / 2**20}


def block_tradeoff(steps: int, blocks: list[int | None], world: int = 4, workers: int = 2) -> list[dict]:
    """Decodes per chunk, the most chunks a worker holds and the bound it keeps to (``world`` x ``workers``), and
    one rank's shuffle quality (1 x ``workers``), for each block length, over ``steps`` one-step chunks: window ids
    only, no store."""
    out = []
    for block_chunks in blocks:
        w = Windows(history=WINDOWS.history, lead=WINDOWS.lead, block_chunks=block_chunks)
        starts = WindowStarts.of(w, steps)
        spec = EpochSpec(starts.n, w.block_rows(1), BATCH, True, seed=0, windows=w.describe())
        reads = held = 0
        bound = held_chunks_bound(
            w, block_rows=spec.chunk_rows, chunk_rows=1, buffer_rows=spec.buffer_rows, batch_size=BATCH
        )
        for rank in range(world):
            plan = spec.plan(1, Topology(rank, world, workers))
            for share in plan.workers:
                rng = buffer_rng(spec.seed, 1, rank, share.worker, spec.row_shuffle)
                batches = worker_window_batches(
                    share, buffer_rows=spec.buffer_rows, warmup_rows=spec.chunk_rows, rng=rng
                )
                r = chunk_reads(batches, share.pieces, starts, w.offsets, 1, most_held=bound)
                reads, held = reads + len(r.chunks), max(held, r.most_held)
        one_rank = [starts.start(b) for b in batches_of(spec, spec.plan(1, Topology(0, 1, workers)))]
        q = shuffle_quality(one_rank, rows=steps, chunk_rows=100)
        out.append(
            {
                "block_chunks": spec.chunk_rows,
                "default": block_chunks is None,
                "decodes_per_chunk": reads / steps,
                "most_held_chunks": held,
                "held_mib": held * int(np.prod(ROW_SHAPE)) * 4 / 2**20,
                "bound_chunks": bound,
                "bound_mib": bound * int(np.prod(ROW_SHAPE)) * 4 / 2**20,
                "diversity": q.chunk_diversity,
                "order_correlation": q.order_correlation,
            }
        )
    perfect_starts = [starts.start(b) for b in perfect_shuffle_batches(starts.n, BATCH)]
    perfect = shuffle_quality(perfect_starts, rows=steps, chunk_rows=100)
    out.append(
        {
            "block_chunks": "perfect",
            "diversity": perfect.chunk_diversity,
            "order_correlation": perfect.order_correlation,
        }
    )
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4000)
    p.add_argument("--chunks", type=int, nargs="+", default=[1, 16])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--step-by-step-batches", type=int, default=40, help="batches per epoch of the anemoi-style reader")
    p.add_argument("--blocks", type=int, nargs="+", default=[1, 4, 16, 32, 64, 256, 1024])
    p.add_argument("--trade-steps", type=int, default=87_600, help="time steps of the block table (no store)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "windows.json"))
    p.add_argument("--figure", default=None, help="write the block-length figure here (png)")
    p.add_argument("--data-dir", default=str(DATA), help="where the generated stores are kept")
    p.add_argument("--cold", action="store_true", help="every figure also with the store dropped from the page cache")
    p.add_argument("--threads", type=int, default=available_cpus(), help="threads of the limits (default: the CPUs)")
    p.add_argument(
        "--decode-threads",
        type=int,
        nargs="*",
        default=[],
        help="also zarrtorch with 0 workers and this many decode threads (default: the CPUs' share)",
    )
    args = p.parse_args(argv)
    result = {"rows": args.rows, "stores": {}, "blocks": None}
    for chunk in args.chunks:
        path = generated_store(args.rows, chunk, args.data_dir)
        states = (False, True) if args.cold else (None,)
        runs, resident = {}, {"warm": [], "cold": []}
        for cold in states:
            runs |= store_figures(path, args, cold, resident)
        if args.cold:
            runs["resident"] = {k: {"min": min(v), "max": max(v)} for k, v in resident.items()}
        result["stores"][chunk] = runs
        kib = np.prod(ROW_SHAPE) * 4 // 1024
        for cold in states:
            print_store(runs, args, chunk, kib, " cold" if cold else "")

    result["blocks"] = block_tradeoff(args.trade_steps, [None, *args.blocks])
    kib = np.prod(ROW_SHAPE) * 4 // 1024
    print(f"\nblock length ({args.trade_steps:,} one-step chunks of {kib} KiB, buffer 8 blocks, window ids only):")
    print("decodes and memory on 4 ranks x 2 workers, shuffle quality on 1 x 2")
    head = ("block chunks", 12), ("decodes/chunk", 15), ("held chunks", 13), ("held MiB", 10), ("bound MiB", 11)
    head += (("diversity", 11),)
    print("  " + "".join(f"{h:>{w}}" for h, w in head) + f"{'order corr':>12}")
    for b in result["blocks"]:
        if b["block_chunks"] == "perfect":
            print(f"  {'perfect':>12}{'':>49}{b['diversity']:>11.2f}{b['order_correlation']:>12.3f}")
            continue
        mark = " (default)" if b["default"] else ""
        print(
            f"  {b['block_chunks']:>12}{b['decodes_per_chunk']:>15.3f}{b['most_held_chunks']:>13}"
            f"{b['held_mib']:>10.1f}{b['bound_mib']:>11.1f}{b['diversity']:>11.2f}{b['order_correlation']:>12.3f}{mark}"
        )
    if args.figure:
        plot(result["blocks"], args.figure)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return result


def store_figures(path: Path, args, cold: bool | None, resident: dict) -> dict:
    """Every figure of one store; ``cold`` True or False: the store's files dropped from the page cache or read
    into it before each pass (the share of its pages resident then appended to ``resident``), and the names of
    cold figures ending in " cold"; None: the cache left as it is."""

    def before() -> None:
        if cold is not None:
            resident["cold" if cold else "warm"].append(pagecache.prepare_pass(path, cold))

    def limit(measure) -> float:
        before()
        return measure(path, args.threads)

    suffix, runs = " cold" if cold else "", {}
    for name, measure in {"L0": decode_limit, "L0r": reader_limit, "raw": raw_limit}.items():
        runs[f"{name} steps/s{suffix}"] = statistics.median(limit(measure) for _ in range(args.repeats))
    for workers in (0, 2):
        runs[f"zarrtorch {workers}w{suffix}"] = zarrtorch_run(path, workers, args.repeats, before=before)
        runs[f"step by step {workers}w{suffix}"] = step_by_step_run(
            path, workers, args.repeats, args.step_by_step_batches, before=before
        )
    for threads in args.decode_threads:
        runs[f"zarrtorch 0w {threads}t{suffix}"] = zarrtorch_run(path, 0, args.repeats, threads, before=before)
    return runs


def print_store(runs: dict, args, chunk: int, kib: int, suffix: str) -> None:
    """One store's table (``suffix`` " cold": its cold figures, with cold / warm and the resident share)."""
    l0, l0r, raw = (runs[f"{name} steps/s{suffix}"] for name in ("L0", "L0r", "raw"))
    print(
        f"\n{args.rows} time steps of {kib} KiB, {chunk}-step chunks{suffix}, limits in {args.threads} threads: "
        f"L0 {l0:,.0f}, L0r {l0r:,.0f}, raw {raw:,.0f} steps/s"
    )
    if "resident" in runs:
        shares = ", ".join(f"{k} {v['min']:.2f}-{v['max']:.2f}" for k, v in runs["resident"].items())
        print(f"  share of the store's pages in the page cache before each pass: {shares}")
    head = f"  {'reader':<22}{'windows/s':>11}{'x L0':>7}{'x L0r':>7}{'x raw':>7}{'decodes/chunk':>15}"
    print(head + f"{'held MiB':>10}" + (f"{'cold/warm':>11}" if suffix else ""))
    for name, r in runs.items():
        if isinstance(r, dict) and name != "resident" and name.endswith(suffix) and (suffix or "cold" not in name):
            rate, decodes, held = r["windows_s"], r["decodes_per_chunk"], r["held_mib"]
            ratios = f"{rate / l0:>7.2f}{rate / l0r:>7.2f}{rate / raw:>7.2f}"
            warm = f"{rate / runs[name.removesuffix(suffix)]['windows_s']:>11.2f}" if suffix else ""
            print(f"  {name.removesuffix(suffix):<22}{rate:>11,.0f}{ratios}{decodes:>15.2f}{held:>10.0f}{warm}")


def plot(blocks: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [b for b in blocks if b["block_chunks"] != "perfect" and not b["default"]]
    perfect = next(b for b in blocks if b["block_chunks"] == "perfect")
    x = [b["block_chunks"] for b in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    axes[0].plot(x, [b["decodes_per_chunk"] for b in rows], "o-")
    axes[0].axhline(1.1, ls="--", c="grey", label="goal 1.1")
    axes[0].set(ylabel="chunk decodes per chunk per epoch", title="re-reads (halos)")
    axes[1].plot(x, [b["held_mib"] for b in rows], "o-", label="most held")
    axes[1].plot(x, [b["bound_mib"] for b in rows], "s--", label="bound (loader_memory)")
    axes[1].set(ylabel="decoded chunks of one worker (MiB)", title="memory")
    axes[1].legend()
    axes[2].plot(x, [b["diversity"] for b in rows], "o-", label="zarrtorch")
    axes[2].axhline(perfect["diversity"], ls="--", c="grey", label="perfect shuffle")
    axes[2].set(ylabel="chunk diversity (100-step stretches)", title="shuffle quality")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("block length (one-step chunks)")
    axes[0].legend()
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
