"""The node-local chunk cache (``ReadOptions(cache_dir=...)``): a store over HTTP with a delay per request, read
for a few epochs without the cache (today: every epoch fetches every chunk), with it (the first epoch fills it,
the next ones read it), and from local disk (the rate a warm epoch aims for).

    .venv/bin/python benchmarks/cache.py                   # generated store (313 chunks), 20 ms per request
    .venv/bin/python benchmarks/cache.py --delay-ms 50 --workers 2 --json /tmp/cache.json

Rates: rows/s of each epoch of one fresh loader per setting (shuffling on, batch 64), the settings taken in turn
``--repeats`` times (a machine that slows down for a while slows all of them alike), medians given with the
spread. The server runs in a process of its own (``servers.HttpStoreProcess``, one event loop), as a store on
another machine would. Bytes: a second, counting run against the tests' server (in this process, which counts
the requests as they come): the chunk requests of epoch 1 and of epoch 2 with a fresh cache, and their bytes.
The cache lives in a temporary folder on this machine's disk. Last, what ``redeal_every`` costs the shuffle,
from the plans alone (:func:`placement_cost`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.remote import epoch_rate, generated_store  # noqa: E402
from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset  # noqa: E402
from zarrtorch._read.cache import wait_for_writes  # noqa: E402
from zarrtorch.course import servers  # noqa: E402
from zarrtorch.plan import EpochSpec, Topology  # noqa: E402
from zarrtorch.quality import shuffle_quality  # noqa: E402
from zarrtorch.resume import batches_of  # noqa: E402


def epoch_rates(source: str, read: ReadOptions, *, epochs: int, workers: int, batch_size: int) -> list[float]:
    """Rows/s of each of ``epochs`` epochs of one fresh loader."""
    ds = ZarrIterableDataset(source, seed=0, read=read)
    loader = ZarrDataLoader(ds, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0)
    rates = [epoch_rate(loader, epoch) for epoch in range(epochs)]
    wait_for_writes()  # the last chunks kept in the background, before their folder is removed
    return rates


def chunk_traffic(store: Path, counts: dict[str, int]) -> tuple[int, int]:
    """Chunk requests among ``counts`` (answers per key) and the bytes of those chunks' files."""
    chunks = {k: n for k, n in counts.items() if "/c/" in k}
    return sum(chunks.values()), sum(n * (store.parent / k).stat().st_size for k, n in chunks.items())


def bytes_per_epoch(store: Path, delay_ms: float, batch_size: int, workers: int) -> dict:
    """Chunk requests and bytes the server answered in epoch 1 and epoch 2 of one loader with a fresh cache."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="zarrtorch-cache-") as cache_dir:
        with servers.HttpStoreServer(store.parent, delay_ms=delay_ms) as server:
            ds = ZarrIterableDataset(f"{server.url}/{store.name}", seed=0, read=ReadOptions(cache_dir=cache_dir))
            loader = ZarrDataLoader(ds, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0)
            for epoch in range(2):
                server.requests.clear()
                loader.set_epoch(epoch)
                for _ in loader:
                    pass
                requests, nbytes = chunk_traffic(store, server.requests)
                out[f"epoch {epoch + 1}"] = {"chunk_requests": requests, "bytes": nbytes}
            wait_for_writes()  # before the folder is removed
    return out


def placement_cost(rows: int, epochs: int = 8, world: int = 4, workers: int = 2, batch_size: int = 64) -> dict:
    """What ``redeal_every=K`` costs the shuffle, from the plans alone (no data read), per K: lesson 03's measures
    (``zarrtorch.quality``: chunk diversity of a batch, |order correlation| of an epoch, means over the ranks and
    ``epochs`` epochs) and the fraction of the store's chunks a rank sees over those epochs (1/world when its share
    never changes)."""
    out = {}
    for k in (0, 2, 4, epochs):
        spec = EpochSpec(rows, 64, batch_size, True, seed=0, buffer_chunks=8, redeal_every=k)
        diversity, correlation, seen = [], [], [set() for _ in range(world)]
        for epoch in range(epochs):
            for rank in range(world):
                batches = batches_of(spec, spec.plan(epoch, Topology(rank, world, workers)))
                quality = shuffle_quality(batches, rows, 64)
                diversity.append(quality.chunk_diversity)
                correlation.append(abs(quality.order_correlation))
                seen[rank] |= set((np.concatenate(batches) // 64).tolist())
        chunks = -(-rows // 64)
        out[f"redeal_every={k or None}"] = {
            "chunk_diversity": float(np.mean(diversity)),
            "abs_order_correlation": float(np.mean(correlation)),
            "chunks_seen_by_a_rank": float(np.mean([len(s) / chunks for s in seen])),
        }
    return out


def cache_run_arguments(p: argparse.ArgumentParser, workers: int) -> None:
    """The store, server and run arguments this benchmark shares with ``cache_starts.py``."""
    p.add_argument("--rows", type=int, default=20_000, help="rows of the generated store (64-row chunks)")
    p.add_argument("--delay-ms", type=float, default=20.0, help="the server's delay per request")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=workers)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cache_run_arguments(p, workers=0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)

    store = generated_store(args.rows)
    runs: dict[str, list[list[float]]] = {"http, no cache": [], "http, cache": [], "local disk": []}
    with servers.HttpStoreProcess(store.parent, delay_ms=args.delay_ms, asyncio=True) as server:
        url = f"{server.url}/{store.name}"
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="zarrtorch-cache-") as cache_dir:
                settings = {
                    "http, no cache": (url, ReadOptions()),
                    "http, cache": (url, ReadOptions(cache_dir=cache_dir)),
                    "local disk": (str(store), ReadOptions()),
                }
                for name, (source, read) in settings.items():
                    rates = epoch_rates(
                        source, read, epochs=args.epochs, workers=args.workers, batch_size=args.batch_size
                    )
                    runs[name].append(rates)
    traffic = bytes_per_epoch(store, args.delay_ms, args.batch_size, args.workers)

    def median_of(name: str, epochs: slice) -> float:
        return statistics.median(statistics.median(r[epochs]) for r in runs[name])

    cold, today = median_of("http, cache", slice(0, 1)), median_of("http, no cache", slice(0, 1))
    warm, local = median_of("http, cache", slice(1, None)), median_of("local disk", slice(1, None))
    later = median_of("http, no cache", slice(1, None))
    results = {
        "store": str(store.relative_to(ROOT)),
        "delay_ms": args.delay_ms,
        "workers": args.workers,
        "rates": runs,
        "rows_per_s": {
            "no cache, epoch 1": today,
            "no cache, epochs 2+": later,
            "cache, epoch 1": cold,
            "cache, epochs 2+": warm,
            "local disk, epochs 2+": local,
        },
        "cold_vs_no_cache": cold / today,
        "warm_vs_local_disk": warm / local,
        "traffic": traffic,
        "placement": placement_cost(args.rows),
    }
    print(f"{store.name} over HTTP at {args.delay_ms:g} ms per request, {args.workers} workers, rows/s (median):")
    print(f"  no cache, epoch 1:         {today:10,.0f}")
    print(f"  no cache, epochs 2+:       {later:10,.0f}")
    print(f"  cache, epoch 1 (cold):     {cold:10,.0f}   {cold / today:.2f}x no cache's epoch 1")
    print(f"  cache, epochs 2+ (warm):   {warm:10,.0f}   {warm / local:.2f}x local disk, {warm / later:.2f}x no cache")
    print(f"  local disk, epochs 2+:     {local:10,.0f}")
    for epoch, t in traffic.items():
        print(f"  {epoch}: {t['chunk_requests']} chunk requests, {t['bytes'] / 2**20:.2f} MiB from the server")
    print("redeal_every (4 ranks x 2 workers, 8 epochs): chunk diversity, |order correlation|, chunks a rank sees")
    for k, q in results["placement"].items():
        print(
            f"  {k:<20} {q['chunk_diversity']:.3f}  {q['abs_order_correlation']:.3f}  {q['chunks_seen_by_a_rank']:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
