"""Where a warm epoch's time goes: the node-local chunk cache against the same store on local disk, per epoch.

    .venv/bin/python benchmarks/cache_starts.py --workers 2 --repeats 3

``benchmarks/cache.py`` gives each epoch's rate; this splits each epoch of one fresh loader per setting into
``iter()`` (the loader's start: the check that the store was not rewritten, a metadata request to the server for
a remote store, then the workers' start), the wait from there to the first batch, and the rest, with the CPU
seconds of the training process and of the workers. The settings alternate (cache, local disk, cache...) in one
process, the store of ``remote.py`` served over HTTP by a process of its own, a fresh cache folder per repeat.
Printed: each warm epoch's figures, then the medians over the warm epochs (epochs 2+) of every repeat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cache import cache_run_arguments  # noqa: E402
from benchmarks.remote import generated_store  # noqa: E402
from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset  # noqa: E402
from zarrtorch._read.cache import wait_for_writes  # noqa: E402
from zarrtorch.course import servers  # noqa: E402

STAGES = ("wall_ms", "iter_ms", "first_batch_ms", "rest_ms", "cpu_main_ms", "cpu_workers_ms")


def _cpu_s(processes: list[psutil.Process]) -> float:
    total = 0.0
    for p in processes:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _workers(me: psutil.Process) -> list[psutil.Process]:
    """This process's children but the store's server: the loader's workers."""
    out = []
    for p in me.children():
        try:
            if "zarrtorch.course.servers" not in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def epochs_split(source: str, read: ReadOptions, *, epochs: int, workers: int) -> list[dict]:
    """Each epoch of one fresh loader (batch 64), split into :data:`STAGES`."""
    me = psutil.Process()
    ds = ZarrIterableDataset(source, seed=0, read=read)
    loader = ZarrDataLoader(ds, batch_size=64, num_workers=workers, persistent_workers=workers > 0)
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        main_cpu, workers_cpu = _cpu_s([me]), _cpu_s(_workers(me))
        start = time.perf_counter()
        batches = iter(loader)
        started = time.perf_counter()
        first = None
        for _ in batches:
            first = first or time.perf_counter()
        end = time.perf_counter()
        out.append(
            {
                "wall_ms": (end - start) * 1e3,
                "iter_ms": (started - start) * 1e3,
                "first_batch_ms": (first - started) * 1e3,
                "rest_ms": (end - first) * 1e3,
                "cpu_main_ms": (_cpu_s([me]) - main_cpu) * 1e3,
                "cpu_workers_ms": (_cpu_s(_workers(me)) - workers_cpu) * 1e3,
            }
        )
    wait_for_writes()
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cache_run_arguments(p, workers=2)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)

    store = generated_store(args.rows)
    runs: dict[str, list[list[dict]]] = {"cache": [], "local disk": []}
    with servers.HttpStoreProcess(store.parent, delay_ms=args.delay_ms, asyncio=True) as server:
        url = f"{server.url}/{store.name}"
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="zarrtorch-cache-") as cache_dir:
                settings = {"cache": (url, ReadOptions(cache_dir=cache_dir)), "local disk": (str(store), ReadOptions())}
                for name, (source, read) in settings.items():
                    runs[name].append(epochs_split(source, read, epochs=args.epochs, workers=args.workers))
    print(f"{store.name}, {args.workers} workers, {args.delay_ms:g} ms per request; warm epochs (2+), ms:")
    print(f"  {'setting':>18} " + " ".join(f"{s:>14}" for s in STAGES))
    medians = {}
    for name, repeats in runs.items():
        warm = [e for epochs in repeats for e in epochs[1:]]
        for e in warm:
            print(f"  {name:>18} " + " ".join(f"{e[s]:14.1f}" for s in STAGES))
        medians[name] = {s: statistics.median(e[s] for e in warm) for s in STAGES}
    for name, m in medians.items():
        print(f"  {'median ' + name:>18} " + " ".join(f"{m[s]:14.1f}" for s in STAGES))
    results = {"workers": args.workers, "delay_ms": args.delay_ms, "runs": runs, "medians": medians}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
