"""Rows/s against requests in flight: one store read from local disk and over HTTP, with and without a
fixed delay per request (a stand-in for object-storage latency), all in one run.

    .venv/bin/python benchmarks/remote.py                 # the tiny course store, delays 0 and 20 ms
    .venv/bin/python benchmarks/remote.py --store data/bench/<store>.zarr --delay-ms 0 20 50 --json out.json

Every figure is the median of ``--repeats`` epochs through ``ZarrDataLoader`` (0 workers, shuffling on,
batch 64); the table prints each as a ratio to the same server without delay at the same setting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset  # noqa: E402
from zarrtorch.course.servers import HttpStoreServer  # noqa: E402


def rows_per_second(source: str, in_flight: int, *, repeats: int, batch_size: int, threads: int) -> float:
    ds = ZarrIterableDataset(source, seed=0, read=ReadOptions(requests_in_flight=in_flight, decode_threads=threads))
    loader = ZarrDataLoader(ds, batch_size=batch_size)
    rates = []
    for epoch in range(repeats):
        loader.set_epoch(epoch)
        start, rows = time.perf_counter(), 0
        for batch in loader:
            rows += len(next(iter(batch.values())))
        rates.append(rows / (time.perf_counter() - start))
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", default=str(ROOT / "data" / "tiny" / "train.zarr"))
    p.add_argument("--delay-ms", type=float, nargs="+", default=[0.0, 20.0])
    p.add_argument("--in-flight", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="decode threads")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    store = Path(args.store).resolve()
    if not store.exists():
        raise SystemExit(f"no store at {store}: run `python -m zarrtorch make-data --size tiny` first")
    kw = dict(repeats=args.repeats, batch_size=args.batch_size, threads=args.threads)
    results: dict = {"store": str(store), "local": {}, "http": {}}
    for n in args.in_flight:
        results["local"][n] = rows_per_second(str(store), n, **kw)
    for delay in args.delay_ms:
        with HttpStoreServer(store.parent, delay_ms=delay) as server:
            url = f"{server.url}/{store.name}"
            results["http"][delay] = {n: rows_per_second(url, n, **kw) for n in args.in_flight}
            results.setdefault("requests", {})[delay] = sum(server.requests.values())
    print(
        f"rows/s through ZarrDataLoader (0 workers, {args.threads} decode threads, batch {args.batch_size}), "
        f"median of {args.repeats} epochs; {store.name}"
    )
    head = f"{'requests in flight':>20}" + "".join(f"{n:>10}" for n in args.in_flight)
    print(head + "\n" + "-" * len(head))
    print(f"{'local disk':>20}" + "".join(f"{results['local'][n]:>10,.0f}" for n in args.in_flight))
    base = results["http"].get(0.0)
    for delay, row in results["http"].items():
        print(f"{f'HTTP, {delay:g} ms/request':>20}" + "".join(f"{row[n]:>10,.0f}" for n in args.in_flight))
        if base is not None and delay:
            ratios = "".join(f"{row[n] / base[n]:>10.2f}" for n in args.in_flight)
            print(f"{'  x HTTP 0 ms':>20}" + ratios)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
