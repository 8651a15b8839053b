"""Rows/s against requests in flight: one store read from local disk and over HTTP, with and without a
fixed delay per request (a stand-in for object-storage latency), all in one run.

    .venv/bin/python benchmarks/remote.py                 # a generated store, delays 0, 20 and 100 ms
    .venv/bin/python benchmarks/remote.py --store data/tiny/train.zarr --delay-ms 0 20 --in-flight 1 4 16

Each figure is one fresh ``ZarrDataLoader`` (0 and 2 workers, shuffling on, batch 64) run for ``--epochs``
epochs, the median of them (the first one learns the requests in flight), repeated ``--repeats`` times; the
table gives the median of the repeats and their spread. The default requests in flight (adaptive for a remote
store: ``zarrtorch._read.inflight``) run besides fixed numbers. A repeat measures every row in turn, so a
machine that slows down for a while slows every column alike; a delay's ratio to the same setting without delay
is taken within each repeat. The default store is generated once under ``data/bench`` (20,000 rows of 8 x 32
float32, 64-row chunks: 313 chunks), enough pieces per epoch for the requests in flight to settle; at 100 ms
an epoch that short loses a quarter to its first round trip, so ``--rows 100000`` (1,563 chunks) measures hiding
latency more fairly. The server runs in a process of its own (``servers.HttpStoreProcess``), as a store on
another machine would (in the loader's process its threads would share the loader's GIL), and answers from one
event loop without a web framework (``--server bare``, ``zarrtorch.course.bare_http``): a request waiting out its
delay costs a timer, not a thread, as in an object store, and each answer as little of the shared cores as Python
allows (aiohttp's web server, ``--server asyncio``, spent about twice the CPU per request and answered late at
100 ms: ``benchmarks/README.md``); ``--server threads`` is the thread-per-request server of the tests and lessons.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import zarr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset, prepare_zarr  # noqa: E402
from zarrtorch.course import servers  # noqa: E402


def generated_store(rows: int = 20_000, chunk_rows: int = 64) -> Path:
    """A store with enough chunks for the requests in flight to matter, made once."""
    path = ROOT / "data" / "bench" / f"remote-{rows}x{chunk_rows}.zarr"
    if not path.exists():
        values = np.random.default_rng(0).standard_normal((rows, 8, 32)).astype(np.float32)
        prepare_zarr({"fields": values}, path, chunk_rows=chunk_rows)
    return path


def epoch_rate(loader, epoch: int) -> float:
    """Rows/s of ``loader``'s epoch ``epoch``, from its first ``next()`` to its last batch."""
    loader.set_epoch(epoch)
    start, rows = time.perf_counter(), 0
    for batch in loader:
        rows += len(next(iter(batch.values())))
    return rows / (time.perf_counter() - start)


def rows_per_second(
    source: str, in_flight: int | None, *, workers: int, epochs: int, batch_size: int, threads: int, log=None
) -> float:
    """Median rows/s over ``epochs`` epochs of one fresh loader; ``log``, when given, is called with each epoch's
    rate and the requests in flight each reading process ended the epoch with."""
    read = ReadOptions(requests_in_flight=in_flight, decode_threads=threads)
    ds = ZarrIterableDataset(source, seed=0, read=read)
    loader = ZarrDataLoader(ds, batch_size=batch_size, num_workers=workers)
    rates = []
    for epoch in range(epochs):
        rates.append(epoch_rate(loader, epoch))
        if log is not None:
            state = loader.job.epochs
            own = loader.dataset.process_state().in_flight
            levels = [own.level] if not workers else [state.level(w) for w in range(workers)]
            log(rates[-1], levels)
    return statistics.median(rates)


def chunk_keys(store: Path) -> list[str]:
    """Every chunk object of ``store``, as keys under the folder the server serves."""
    metadata = {"zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata"}
    found = (p for p in store.rglob("*") if p.is_file() and p.name not in metadata)
    return sorted(str(p.relative_to(store.parent)) for p in found)


def plain_client_rate(url: str, keys: list[str], in_flight: int, requests: int) -> float:
    """Requests/s of a bare aiohttp client keeping ``in_flight`` chunk requests going, after one untimed round
    that opens its connections: no zarr, no decoding, no loader. Run in a process of its own, it says what the
    stand-in server and one client event loop give at most, so that a loader's shortfall can be placed."""
    import asyncio

    import aiohttp

    async def measure() -> float:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def fetch(i: int) -> None:
                async with session.get(f"{url}/{keys[i % len(keys)]}") as response:
                    response.raise_for_status()
                    await response.read()

            await asyncio.gather(*(fetch(i) for i in range(in_flight)))  # connections open: not timed
            todo = iter(range(in_flight, in_flight + requests))

            async def one_after_another() -> None:
                for i in todo:
                    await fetch(i)

            start = time.perf_counter()
            await asyncio.gather(*(one_after_another() for _ in range(in_flight)))
            return requests / (time.perf_counter() - start)

    return asyncio.run(measure())


def summary(values: list[float], digits: int = 0) -> str:
    """Median and spread (lowest-highest) of the repeats."""
    if len(values) == 1:
        return f"{values[0]:,.{digits}f}"
    return f"{statistics.median(values):,.{digits}f} [{min(values):,.{digits}f}-{max(values):,.{digits}f}]"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", help="a first-axis-chunked store (default: generated, see above)")
    p.add_argument("--rows", type=int, default=20_000, help="rows of the generated store (64-row chunks)")
    p.add_argument("--delay-ms", type=float, nargs="+", default=[0.0, 20.0, 100.0])
    p.add_argument("--in-flight", type=int, nargs="*", default=[8, 32], help="fixed settings besides the default")
    p.add_argument("--workers", type=int, nargs="*", default=[0, 2], help="none: the bare client only")
    p.add_argument("--epochs", type=int, default=3, help="epochs per loader (the median is taken)")
    p.add_argument("--repeats", type=int, default=3, help="fresh loaders per figure (median and spread)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=None, help="decode threads (default: zarrtorch's, the CPUs' share)")
    p.add_argument(
        "--server",
        choices=["bare", "asyncio", "threads", "in-process"],
        default="bare",
        help="the stand-in store: one event loop in a process of its own, answering from an asyncio.Protocol "
        "(default) or from aiohttp's web server, a thread per request in a process of its own, or threads of this "
        "process (as the earliest tables did)",
    )
    p.add_argument(
        "--server-processes",
        type=int,
        default=1,
        help="with --server bare or asyncio: processes answering from one socket (4 changed nothing beyond the "
        "spread on a 16-core node, benchmarks/README.md; more processes take cores from the client on a small machine)",
    )
    p.add_argument(
        "--plain-client",
        type=int,
        nargs="*",
        default=[],
        help="also measure a bare aiohttp client in a process of its own (no decoding) against each delayed server, "
        "with this many requests at once: the most the server and one client loop give",
    )
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--verbose", action="store_true", help="print each epoch's rows/s and requests in flight")
    args = p.parse_args(argv)
    store = Path(args.store).resolve() if args.store else generated_store(args.rows)
    if not store.exists():
        raise SystemExit(f"no store at {store}")
    settings = [None, *args.in_flight]
    label = {None: "default"} | {n: f"{n} fixed" for n in args.in_flight}
    kw = dict(epochs=args.epochs, batch_size=args.batch_size, threads=args.threads)
    rows = [(w, None) for w in args.workers] + [(w, d) for w in args.workers for d in args.delay_ms]
    rates: dict = {(w, d, label[n]): [] for w, d in rows for n in settings}
    with ExitStack() as stack:

        def serve(delay: float):
            if args.server == "in-process":
                return servers.HttpStoreServer(store.parent, delay_ms=delay)
            loops = args.server_processes if args.server in ("bare", "asyncio") else 1
            return servers.HttpStoreProcess(
                store.parent,
                delay_ms=delay,
                asyncio=args.server == "asyncio",
                bare=args.server == "bare",
                processes=loops,
            )

        hosts = {d: stack.enter_context(serve(d)) for d in args.delay_ms}
        for _ in range(args.repeats):
            for (workers, delay), n in ((row, n) for row in rows for n in settings):
                source = str(store) if delay is None else f"{hosts[delay].url}/{store.name}"
                where = "local" if delay is None else f"{delay:g} ms"

                def log(rate, levels, name=f"{workers} workers, {where}, {label[n]}"):
                    print(f"  {name}: {rate:,.0f} rows/s, requests in flight at the end {levels}", flush=True)

                rate = rows_per_second(source, n, workers=workers, log=log if args.verbose else None, **kw)
                rates[workers, delay, label[n]].append(rate)
        keys = chunk_keys(store)
        plain = plain_clients(keys, hosts, args.plain_client, args.repeats)
    answered = {f"{d:g}": sum(host.requests.values()) for d, host in hosts.items()}  # every read reached it
    print(
        f"rows/s through ZarrDataLoader ({args.threads or 'default'} decode threads, batch {args.batch_size}); "
        f"{store.name}; server: {args.server}"
        f"{f' x {args.server_processes} processes' if args.server_processes > 1 else ''}; "
        f"median of {args.repeats} loaders [lowest-highest], each the median of {args.epochs} epochs; "
        "(x): the same setting over HTTP without delay, median of the repeats' ratios"
    )
    head = f"{'':>26}" + "".join(f"{label[n]:>42}" for n in settings)
    print(head + "\n" + "-" * len(head))
    results: dict = {"store": str(store), "repeats": args.repeats, "epochs": args.epochs, "rows": []}
    results["requests"] = answered  # requests each delayed server answered: the table measures reads, not a cache
    for workers, delay in rows:
        base = rates.get((workers, 0.0, "default")) is not None and delay
        cells = []
        for n in settings:
            values = rates[workers, delay, label[n]]
            ratios = [v / b for v, b in zip(values, rates[workers, 0.0, label[n]], strict=True)] if base else []
            cell = summary(values) + (f" ({summary(ratios, 2)})" if ratios else "")
            cells.append(f"{cell:>42}")
            results["rows"].append(
                {"workers": workers, "delay_ms": delay, "setting": label[n], "rows_per_s": values, "ratio": ratios}
            )
        where = "local disk" if delay is None else f"HTTP {delay:g} ms"
        print(f"{f'{workers} workers, {where}':>26}" + "".join(cells))
    if plain:
        arrays = len({Path(k).parts[1] for k in keys})
        rows_per_request = zarr.open_array(store / sorted(zarr.open_group(store).array_keys())[0]).chunks[0] / arrays
        print(
            f"a bare aiohttp client in a process of its own, no decoding ({arrays} array(s): rows per request "
            f"{rows_per_request:g}); median [lowest-highest] of {args.repeats}:"
        )
        for (delay, in_flight), (values, cpu) in plain.items():
            rows_s = [v * rows_per_request for v in values]
            ratios = [v / b for v, b in zip(values, plain.get((0.0, in_flight), ([], []))[0], strict=False)]
            print(
                f"  {delay:g} ms, {in_flight} at once: {summary(values)} requests/s = {summary(rows_s)} rows/s"
                + (f" ({summary(ratios, 2)})" if ratios and delay else "")
                + (f"; server CPU per request {summary([c * 1e6 for c in cpu])} us" if cpu else "")
            )
        results["plain_client"] = [
            {
                "delay_ms": d,
                "in_flight": n,
                "requests_per_s": v,
                "rows_per_s": [x * rows_per_request for x in v],
                "server_cpu_s_per_request": cpu,
            }
            for (d, n), (v, cpu) in plain.items()
        ]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return results


def plain_clients(keys: list[str], hosts: dict, in_flight: list[int], repeats: int) -> dict:
    """Requests/s of :func:`plain_client_rate` for each delayed server and number at once, ``repeats`` times, and
    the server's CPU seconds per request meanwhile (empty where ``/proc`` cannot tell): ``(delay, n) -> (rates,
    cpu)``. The delays alternate within each repeat, so that a machine slowing down slows them alike."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    if not in_flight:
        return {}
    out: dict = {}
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:  # its own interpreter and loop
        for _ in range(repeats):
            for delay, host in hosts.items():
                for n in in_flight:
                    requests = max(len(keys), 8 * n, 1000)
                    before = server_cpu_s(host)
                    rate = pool.submit(plain_client_rate, host.url, keys, n, requests).result()
                    after = server_cpu_s(host)
                    rates, cpu = out.setdefault((delay, n), ([], []))
                    rates.append(rate)
                    if before is not None and after is not None:  # the untimed first round included: n more
                        cpu.append((after - before) / (requests + n))
    return out


def server_cpu_s(host) -> float | None:
    """CPU seconds the stand-in server's process and the processes it forked (``--server-processes``) have used,
    from ``/proc`` (Linux); ``None`` where it cannot tell (a server in this process, another system)."""
    proc = getattr(host, "_proc", None)
    if proc is None:
        return None
    try:
        pids = [proc.pid, *map(int, Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split())]
        ticks = 0
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except (OSError, ValueError, IndexError):
        return None
    import os

    return ticks / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
