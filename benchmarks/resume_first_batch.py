"""Time to the first batch of a loader resumed on another topology, against a fresh one, on a real store.

    .venv/bin/python benchmarks/resume_first_batch.py             # 10^8 rows (generated once, about a minute)
    .venv/bin/python benchmarks/resume_first_batch.py --rows 1000000 --repeats 1   # a quick look

A state saved half-way through epoch 2 by a job of 64 ranks x 4 workers is loaded by rank 5 of 48 ranks x
2 workers; the same rank without a state is the fresh loader. Each figure comes from a fresh interpreter (no
plan cached): seconds from ``iter(loader)`` to the first batch (the workers' start, their plans and first reads
included) and the memory held meanwhile (``zarrtorch.course.memory.MemorySampler.held``, sampled every 5 ms: the
main process's growth and each worker's private memory, library pages left out), with 2 workers and with none. Median of
``--repeats`` runs; the resumed/fresh difference is what elastic resume costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SAVED, RESUMED = (64, 4), (48, 2, 5)  # (world, workers) that saved; (world, workers, rank) that resumes
BATCH = 64


def generated_store(rows: int, chunk_rows: int, data_dir: Path) -> Path:
    """``rows`` int16 rows (the row number modulo 2^15) in chunks of ``chunk_rows``, written once."""
    from zarrtorch import prepare_zarr

    path = Path(data_dir) / f"resume-{rows}x{chunk_rows}.zarr"
    if not path.exists():
        values = (np.arange(rows, dtype=np.int64) % 32768).astype(np.int16)
        prepare_zarr({"x": values}, path, chunk_rows=chunk_rows, progress=False)
    return path


def child(store: str, resumed: bool, workers_now: int) -> dict:
    from zarrtorch import ZarrDataLoader, ZarrIterableDataset
    from zarrtorch.course.memory import MemorySampler

    world, workers = SAVED
    saver = ZarrDataLoader(ZarrIterableDataset(store, seed=1), batch_size=BATCH, world_size=world, rank=0)
    saver.set_epoch(2)
    state = saver.state_dict()
    state.update(num_workers=workers, batches_seen=len(saver) // 2)  # half-way through epoch 2 on 64 x 4
    world, _, rank = RESUMED
    loader = ZarrDataLoader(
        ZarrIterableDataset(store, seed=1), batch_size=BATCH, world_size=world, rank=rank, num_workers=workers_now
    )
    if resumed:
        loader.load_state_dict(state)
    else:
        loader.set_epoch(2)
    with MemorySampler(every_s=0.005) as sampler:
        start = time.perf_counter()
        batch = next(iter(loader))
        seconds = time.perf_counter() - start
    held = sampler.held / 2**20
    return {"seconds": seconds, "rss_mib": held, "rows": len(batch["x"]), "batches": len(loader)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10**8)
    p.add_argument("--chunk-rows", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", choices=["fresh", "resumed"], help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None)
    p.add_argument("--data-dir", default=str(ROOT / "data" / "bench"), help="where the generated store is kept")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.store, args.child == "resumed", args.workers)))
        return {}
    store = generated_store(args.rows, args.chunk_rows, args.data_dir)
    runs = {(kind, w): [] for w in (RESUMED[1], 0) for kind in ("fresh", "resumed")}
    for _ in range(args.repeats):
        for kind, w in runs:
            cmd = [sys.executable, __file__, "--child", kind, "--store", str(store), "--workers", str(w)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
            runs[kind, w].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {key: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "rss_mib")} for key, rs in runs.items()}
    print(
        f"{args.rows:,} rows in chunks of {args.chunk_rows:,}; state from {SAVED[0]} x {SAVED[1]} half-way through "
        f"epoch 2, loaded on rank {RESUMED[2]} of {RESUMED[0]} ranks (median of {args.repeats}):"
    )
    for w in (RESUMED[1], 0):
        for kind in ("fresh", "resumed"):
            r = med[kind, w]
            seconds, mib = r["seconds"], r["rss_mib"]
            print(f"  {w} workers, {kind:>7}: first batch after {seconds:.2f} s, held +{mib:.0f} MiB")
        extra = med["resumed", w]["seconds"] - med["fresh", w]["seconds"]
        more = med["resumed", w]["rss_mib"] - med["fresh", w]["rss_mib"]
        print(f"  {w} workers: resume costs {extra:+.2f} s and {more:+.0f} MiB over the fresh loader")
    result = {f"{kind} {w}w": r for (kind, w), r in med.items()}
    result.update(rows=args.rows, chunk_rows=args.chunk_rows, runs={f"{k} {w}w": v for (k, w), v in runs.items()})
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
