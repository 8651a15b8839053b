"""Rows/s against requests in flight: one store read from local disk and over HTTP, with and without a
fixed delay per request (a stand-in for object-storage latency), all in one run.

    .venv/bin/python benchmarks/remote.py                 # a generated store, delays 0, 20 and 100 ms
    .venv/bin/python benchmarks/remote.py --store data/tiny/train.zarr --delay-ms 0 20 --in-flight 1 4 16

Every figure is the median of ``--repeats`` epochs through ``ZarrDataLoader`` (0 and 2 workers, shuffling on,
batch 64), with the default requests in flight (adaptive for a remote store: ``zarrtorch._read.inflight``)
and with fixed numbers; each delay's row is also printed as a ratio to the same setting without delay.
The default store is generated once under ``data/bench`` (20,000 rows of 8 x 32 float32, 64-row chunks:
313 chunks), enough pieces per epoch for the requests in flight to settle.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset, prepare_zarr  # noqa: E402
from zarrtorch.course.servers import HttpStoreServer  # noqa: E402


def generated_store(rows: int = 20_000, chunk_rows: int = 64) -> Path:
    """A store with enough chunks for the requests in flight to matter, made once."""
    path = ROOT / "data" / "bench" / f"remote-{rows}x{chunk_rows}.zarr"
    if not path.exists():
        values = np.random.default_rng(0).standard_normal((rows, 8, 32)).astype(np.float32)
        prepare_zarr({"fields": values}, path, chunk_rows=chunk_rows)
    return path


def rows_per_second(
    source: str, in_flight: int | None, *, workers: int, repeats: int, batch_size: int, threads: int
) -> float:
    read = ReadOptions(requests_in_flight=in_flight, decode_threads=threads)
    ds = ZarrIterableDataset(source, seed=0, read=read)
    loader = ZarrDataLoader(ds, batch_size=batch_size, num_workers=workers)
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
    p.add_argument("--store", help="a first-axis-chunked store (default: generated, see above)")
    p.add_argument("--delay-ms", type=float, nargs="+", default=[0.0, 20.0, 100.0])
    p.add_argument("--in-flight", type=int, nargs="*", default=[8, 32], help="fixed settings besides the default")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="decode threads")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    store = Path(args.store).resolve() if args.store else generated_store()
    if not store.exists():
        raise SystemExit(f"no store at {store}")
    settings = [None, *args.in_flight]
    label = {None: "default"} | {n: f"{n} fixed" for n in args.in_flight}
    kw = dict(repeats=args.repeats, batch_size=args.batch_size, threads=args.threads)
    results: dict = {"store": str(store), "local": {}, "http": {}}
    for workers in args.workers:
        results["local"][workers] = {label[n]: rows_per_second(str(store), n, workers=workers, **kw) for n in settings}
    for delay in args.delay_ms:
        with HttpStoreServer(store.parent, delay_ms=delay) as server:
            url = f"{server.url}/{store.name}"
            results["http"][delay] = {
                workers: {label[n]: rows_per_second(url, n, workers=workers, **kw) for n in settings}
                for workers in args.workers
            }
            results.setdefault("requests", {})[delay] = sum(server.requests.values())
    print(
        f"rows/s through ZarrDataLoader ({args.threads} decode threads, batch {args.batch_size}), median of "
        f"{args.repeats} epochs; {store.name}; in parentheses: x the same setting over HTTP without delay"
    )
    head = f"{'':>26}" + "".join(f"{label[n]:>18}" for n in settings)
    print(head + "\n" + "-" * len(head))
    for workers in args.workers:
        local = results["local"][workers]
        print(f"{f'{workers} workers, local disk':>26}" + "".join(f"{local[label[n]]:>18,.0f}" for n in settings))
        base = results["http"].get(0.0, {}).get(workers)
        for delay, by_workers in results["http"].items():
            row = by_workers[workers]
            cells = []
            for n in settings:
                ratio = f" ({row[label[n]] / base[label[n]]:.2f})" if base and delay else ""
                cells.append(f"{row[label[n]]:>11,.0f}{ratio:>7}")
            print(f"{f'{workers} workers, HTTP {delay:g} ms':>26}" + "".join(cells))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
