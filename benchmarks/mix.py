"""Two stores mixed by a ``MixedLoader`` against one store of the same bytes (issue 44, item 1).

    .venv/bin/python benchmarks/mix.py                     # 2 x 128 MiB + 256 MiB under data/bench, about 2 minutes
    .venv/bin/python benchmarks/mix.py --rows 512 --repeats 1   # a quick look

The stores are :mod:`harness`'s (64 KiB float32 rows in chunks of 128 rows, zstd 3): two sources of ``--rows``
rows each (seeds 1 and 2) and one store of twice the rows (seed 0). For 0 and 2 workers per loader, each
configuration runs in a process of its own: ``single`` is one ``ZarrDataLoader`` over the big store; ``mix`` is a
``MixedLoader`` of one ``ZarrDataLoader`` per source (default weights: each source's rows once per epoch), so with
2 workers it starts 4 worker processes. Batch 64, ``drop_last=True``, persistent workers.

* Rows/s: both loaders in one process, their epochs alternating (single, mix, single, mix...), so that the load
  of a shared machine weighs on both alike; each loader's first epoch (workers' start-up) is left out. The figure
  is the median rows/s over ``--repeats`` epochs; the ratio, the median of each pair's mix / single.
* Memory, each configuration in a process of its own for two epochs: the most the loader held
  (:class:`zarrtorch.course.memory.MemorySampler`'s ``held``: the main process's growth and every worker's private
  dirty pages, library pages left out) against :func:`zarrtorch.loader_memory`'s bound.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from harness import ensure_store

from zarrtorch import MixedLoader, ReadOptions, ZarrDataLoader, ZarrIterableDataset, loader_memory
from zarrtorch.course.memory import MemorySampler

BATCH = 64


def loader_of(path: str, workers: int) -> ZarrDataLoader:
    extra = {"persistent_workers": True} if workers else {}
    read = ReadOptions(decode_threads=1 if workers else 2)
    ds = ZarrIterableDataset(path, seed=0, read=read)
    return ZarrDataLoader(ds, batch_size=BATCH, drop_last=True, num_workers=workers, **extra)


def build(config: str, workers: int, paths: dict):
    if config == "single":
        return loader_of(paths["single"], workers)
    return MixedLoader({name: loader_of(paths[name], workers) for name in ("a", "b")})


def epoch_rate(loader, epoch: int) -> float:
    loader.set_epoch(epoch)
    t0, rows = time.perf_counter(), 0
    for batch in loader:
        rows += len(batch["x"])
    return rows / (time.perf_counter() - t0)


def memory(config: str, workers: int, paths: dict) -> dict:
    """One configuration alone in this process for two epochs: the memory it held and its bound."""
    sampler = MemorySampler()
    loader = build(config, workers, paths)
    with sampler:
        for epoch in range(2):
            epoch_rate(loader, epoch)
    return {"held_mib": sampler.held / 2**20, "predicted_mib": loader_memory(loader).total / 2**20}


def rates(workers: int, paths: dict, repeats: int) -> dict:
    """Both configurations in this process, their epochs alternating: rows/s of each, and the pairs' ratios."""
    loaders = {config: build(config, workers, paths) for config in ("single", "mix")}
    for loader in loaders.values():
        epoch_rate(loader, 0)  # the workers' start-up
    out = {config: [] for config in loaders}
    for epoch in range(1, repeats + 1):
        for config, loader in loaders.items():
            out[config].append(epoch_rate(loader, epoch))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2048, help="rows of each source (64 KiB each)")
    p.add_argument("--chunk-rows", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data-dir", default="data/bench")
    p.add_argument("--out", default=None, help="also write the results as JSON here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # [what, config, workers, paths] JSON
    args = p.parse_args()
    if args.child:
        what, config, workers, paths = json.loads(args.child)
        out = memory(config, workers, paths) if what == "memory" else rates(workers, paths, args.repeats)
        print(json.dumps(out))
        return
    paths = {
        "a": ensure_store(args.data_dir, args.rows, args.chunk_rows, seed=1)["path"],
        "b": ensure_store(args.data_dir, args.rows, args.chunk_rows, seed=2)["path"],
        "single": ensure_store(args.data_dir, 2 * args.rows, args.chunk_rows, seed=0)["path"],
    }
    print(f"load average before: {os.getloadavg()[0]:.2f}")

    def child(*what) -> dict:
        cmd = [sys.executable, __file__, "--repeats", str(args.repeats), "--child", json.dumps([*what, paths])]
        return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])

    results = []
    for workers in (0, 2):
        measured = child("rates", "both", workers)
        ratios = [m / s for m, s in zip(measured["mix"], measured["single"], strict=True)]
        for config in ("single", "mix"):
            r = {"config": config, "workers": workers, "rates": measured[config]}
            r["rows_per_s"] = statistics.median(measured[config])
            r["ratio"] = statistics.median(ratios) if config == "mix" else 1.0
            results.append(r | child("memory", config, workers))
    print(f"load average after:  {os.getloadavg()[0]:.2f}")
    print(f"{'config':8} {'workers':>7} {'rows/s':>9} {'x single':>9} {'held MiB':>9} {'bound MiB':>10}")
    for r in results:
        print(
            f"{r['config']:8} {r['workers']:>7} {r['rows_per_s']:>9,.0f} {r['ratio']:>9.2f} {r['held_mib']:>9,.0f} "
            f"{r['predicted_mib']:>10,.0f}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": args.rows, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
