"""The node-local cache's first epoch taken apart: what filling the cache costs an epoch that fetches every chunk.

Issue 44 asks that a cached loader's first epoch be no slower than the same loader without a cache. Three
settings, each a fresh loader reading one cold epoch, alternate within every round in one process (a machine that
slows down for a while slows the three alike), against one server process (``servers.HttpStoreProcess``):

- ``no cache``: today's remote read;
- ``cache``: ``ReadOptions(cache_dir=...)`` on an empty folder: every chunk is looked for, fetched and kept;
- ``cache, nothing kept``: the same loader with the cache's hand-over of fetched chunks
  (``zarrtorch._read.cache.write_soon``) replaced by one that keeps nothing, so the epoch pays the cache's look-ups
  and not its writes. Put back after each such epoch (a check says the folder stayed empty).

Per round: rows/s of each setting, its ratio to ``no cache`` of the same round, the CPU seconds this process spent
(user, system: every thread, the loop's, the decoders', the cache's writer) and the server process's.

    .venv/bin/python benchmarks/cache_cold.py --rows 200000 --rounds 16
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path

from layouts import spread  # median, low, high: as layouts.py reports its rounds

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.remote import epoch_rate, generated_store, server_cpu_s  # noqa: E402
from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset  # noqa: E402
from zarrtorch._read import cache as cache_module  # noqa: E402
from zarrtorch.course import servers  # noqa: E402

SETTINGS = ("no cache", "cache", "cache, nothing kept")


def _keep_nothing(*_args, **_kwargs) -> None:
    """``write_soon``'s stand-in for the ``cache, nothing kept`` setting."""


def packs_in(folder: str) -> int:
    """Packs the cache folder holds (every store's)."""
    return sum(1 for _ in Path(folder).rglob(f"*{cache_module.SUFFIX}"))


def cold_epoch(url: str, setting: str, *, seed: int, workers: int, batch_size: int, server) -> dict:
    """One cold epoch of a fresh loader in ``setting``: rows/s, this process's CPU and the server's, packs written."""
    with tempfile.TemporaryDirectory(prefix="zarrtorch-cache-") as cache_dir:
        read = ReadOptions() if setting == "no cache" else ReadOptions(cache_dir=cache_dir)
        loader = ZarrDataLoader(
            ZarrIterableDataset(url, seed=seed, read=read),
            batch_size=batch_size,
            num_workers=workers,
            persistent_workers=workers > 0,
        )
        write_soon = cache_module.write_soon
        if setting == "cache, nothing kept":
            cache_module.write_soon = _keep_nothing
        try:
            before, server_before = resource.getrusage(resource.RUSAGE_SELF), server_cpu_s(server)
            rate = epoch_rate(loader, 0)
            after, server_after = resource.getrusage(resource.RUSAGE_SELF), server_cpu_s(server)
        finally:
            cache_module.write_soon = write_soon
        cache_module.wait_for_writes()  # this epoch's last packs, before their folder goes
        packs = packs_in(cache_dir)
    server_s = None if server_before is None or server_after is None else server_after - server_before
    return {
        "rows_per_s": rate,
        "user_s": after.ru_utime - before.ru_utime,
        "system_s": after.ru_stime - before.ru_stime,
        "server_s": server_s,
        "packs": packs,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000, help="rows of the generated store (64-row chunks)")
    p.add_argument("--store", help="read this store instead of the generated one")
    p.add_argument("--delay-ms", type=float, default=20.0, help="the server's delay per request")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--workers", type=int, default=0, help="0 only: the CPU counted is this process's")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if args.workers:
        p.error("--workers must be 0: the CPU of worker processes is not counted here")

    store = Path(args.store) if args.store else generated_store(args.rows)
    runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    with servers.HttpStoreProcess(store.parent, delay_ms=args.delay_ms, asyncio=True) as server:
        url = f"{server.url}/{store.name}"
        for r in range(args.rounds):
            for setting in SETTINGS:
                runs[setting].append(
                    cold_epoch(url, setting, seed=r, workers=args.workers, batch_size=args.batch_size, server=server)
                )
    results: dict = {"store": str(store), "delay_ms": args.delay_ms, "rounds": args.rounds, "settings": {}}
    print(f"{store.name} over HTTP at {args.delay_ms:g} ms per request, cold epochs, {args.rounds} rounds:")
    print(f"  {'setting':<22}{'rows/s':>10}{'x no cache':>24}{'user s':>8}{'sys s':>7}{'server s':>9}{'packs':>7}")
    for setting, got in runs.items():
        ratios = [g["rows_per_s"] / n["rows_per_s"] for g, n in zip(got, runs["no cache"], strict=True)]
        server_s = [g["server_s"] for g in got if g["server_s"] is not None]
        summary = {
            "rows_per_s": spread([g["rows_per_s"] for g in got]),
            "vs_no_cache": spread(ratios),
            "user_s": spread([g["user_s"] for g in got]),
            "system_s": spread([g["system_s"] for g in got]),
            "server_s": spread(server_s) if server_s else None,
            "packs": spread([g["packs"] for g in got]),
            "per_round": got,
        }
        results["settings"][setting] = summary
        v = summary["vs_no_cache"]
        print(
            f"  {setting:<22}{summary['rows_per_s']['median']:>10,.0f}"
            f"{v['median']:>8.2f} [{v['low']:.2f}-{v['high']:.2f}]{'':>5}"
            f"{summary['user_s']['median']:>8.2f}{summary['system_s']['median']:>7.2f}"
            f"{(summary['server_s'] or {}).get('median', float('nan')):>9.2f}{summary['packs']['median']:>7.0f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
