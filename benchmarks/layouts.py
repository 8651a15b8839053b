"""Rows/s on the store layouts users already have: zarr's general read path against the direct decode (issue 43).

    .venv/bin/python benchmarks/layouts.py                  # generated stores under data/bench, about a minute
    .venv/bin/python benchmarks/layouts.py --rows 256 --repeats 1   # a quick look

For each layout (Zarr v3 zstd, v2 Blosc lz4 + shuffle, v2 Blosc zstd + bitshuffle, v2 zlib, v3 shards of 32
one-row inner chunks with zstd, v2 with no compressor, v2 big-endian with Blosc lz4 + shuffle), the same data
(one row of 32 x 32 x 32 float32 per chunk: 128 KiB, sin + noise rounded to 2 decimals, as windows.py):

* ``raw 1t`` / ``raw 2t``: the decode limit of the codec, rows/s of plain threads that read their share of the
  chunk files (whole shards) and decode them into an array of their own, nothing else
  (:func:`zarrtorch._read.fastpath.stored_decoder`); 1 and 2 threads: a codec that holds the GIL gains nothing
  from the second;
* ``zarr's path``: ``ZarrDataLoader`` with 0 workers and default settings, shuffled, every array forced through
  zarr's codecs (:mod:`zarrtorch._read.chunks`: what every layout but v3 zstd took before issue 43);
* ``direct``: the same loader as it now reads the layout (:mod:`zarrtorch._read.fastpath`).

Each figure is the median of ``--repeats`` runs (epochs for the loader), with the lowest and highest, the runs
of one layout interleaved; ratios are from this one run. The machine's load average is printed before and
after: on a shared machine the spread says how much to trust a ratio. Last, whether each codec (and each way to
byte-swap) releases the GIL while it decodes, by how late a thread waking every millisecond wakes meanwhile
(a 2-thread rate says it only on an idle machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import numcodecs
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import zarr  # noqa: E402

from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset  # noqa: E402
from zarrtorch._read.chunks import chunk_key  # noqa: E402
from zarrtorch._read.fastpath import read_path_text, stored_decoder  # noqa: E402

ROW_SHAPE = (32, 32, 32)  # 128 KiB of float32 per row: one row per chunk, as a weather store's time step
BATCH = 32
DATA = ROOT / "data" / "bench"
SHARD_ROWS = 32

LAYOUTS = {
    "v3 zstd": dict(zarr_format=3, compressors=[zarr.codecs.ZstdCodec()]),
    "v2 blosc lz4 shuffle": dict(zarr_format=2, compressors=numcodecs.Blosc("lz4", shuffle=numcodecs.Blosc.SHUFFLE)),
    "v2 blosc zstd bitshuffle": dict(
        zarr_format=2, compressors=numcodecs.Blosc("zstd", shuffle=numcodecs.Blosc.BITSHUFFLE)
    ),
    "v2 zlib": dict(zarr_format=2, compressors=numcodecs.Zlib()),
    "v3 sharded zstd": dict(zarr_format=3, compressors=[zarr.codecs.ZstdCodec()], shards=True),
    "v2 no compressor": dict(zarr_format=2, compressors=None),
    "v2 big-endian blosc lz4": dict(
        zarr_format=2, compressors=numcodecs.Blosc("lz4", shuffle=numcodecs.Blosc.SHUFFLE), dtype=">f4"
    ),
}


def values(rows: int) -> np.ndarray:
    t = np.arange(rows, dtype=np.float32)[:, None, None, None]
    noise = np.random.default_rng(0).standard_normal((rows, *ROW_SHAPE)).astype(np.float32)
    return (np.sin(t / 24.0) + 0.1 * noise).round(2)


def store_path(layout: str, rows: int, data_dir: Path) -> Path:
    return Path(data_dir) / f"layout-{layout.replace(' ', '-')}-{rows}.zarr"


def generated_store(layout: str, rows: int, data_dir: Path) -> zarr.Array:
    """The layout's store of ``rows`` rows (written once, kept under ``data_dir``)."""
    path = store_path(layout, rows, data_dir)
    if not path.exists():
        options = dict(LAYOUTS[layout])
        fmt, dtype = options.pop("zarr_format"), options.pop("dtype", "f4")
        if options.pop("shards", False):
            options["shards"] = (SHARD_ROWS, *ROW_SHAPE)
        writing = path.with_name(path.name + ".writing")
        arr = zarr.create_array(
            str(writing), shape=(rows, *ROW_SHAPE), chunks=(1, *ROW_SHAPE), dtype=dtype, zarr_format=fmt, **options
        )
        arr[...] = values(rows)
        writing.rename(path)
    return zarr.open_array(str(path), mode="r")


def raw_rate(arr: zarr.Array, threads: int) -> tuple[float, float]:
    """Rows/s of ``threads`` plain threads reading their share of the stored objects and decoding each, and the
    process's CPU seconds per wall second meanwhile (above 1: the threads decoded at the same time)."""
    decode = stored_decoder(arr)
    root = Path(str(arr.store_path.store.root))
    unit = (arr.shards or arr.chunks)[0]
    objects = list(range(-(-arr.shape[0] // unit)))

    def work(part: list[int]) -> None:
        for k in part:
            decode((root / chunk_key(arr, k)).read_bytes(), min(unit, arr.shape[0] - k * unit))

    start, cpu = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, [objects[i::threads] for i in range(threads)]))
    wall = time.perf_counter() - start
    return arr.shape[0] / wall, (time.process_time() - cpu) / wall


def epoch_rate(loader: ZarrDataLoader, epoch: int, through_zarr: bool) -> float:
    """Rows/s of one epoch of ``loader`` (0 workers), its arrays forced through zarr's codecs or not."""
    forced = mock.patch("zarrtorch._read.reader.direct_decoder", return_value=None) if through_zarr else None
    with forced or contextlib.nullcontext():
        loader.set_epoch(epoch)
        start, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch["x"])
    return n / (time.perf_counter() - start)


def a_loader(arr: zarr.Array) -> ZarrDataLoader:
    """ZarrDataLoader with 0 workers and default settings, shuffled (a sharded store: ``allow_shards=True``)."""
    ds = ZarrIterableDataset({"x": arr}, read=ReadOptions(allow_shards=arr.shards is not None), seed=0)
    return ZarrDataLoader(ds, batch_size=BATCH)


def measure_layout(arr: zarr.Array, repeats: int) -> dict:
    """Each figure ``repeats`` times, interleaved (raw 1 and 2 threads, zarr's path, direct: the order alternating),
    so that the machine's load changing during the run weighs on all of them alike. A first epoch of each
    loader is not timed (the process's pools and zarr's event loop start)."""
    loaders = {"zarr": a_loader(arr), "direct": a_loader(arr)}
    for path, loader in loaders.items():
        epoch_rate(loader, 0, through_zarr=path == "zarr")
    rates: dict[str, list[float]] = {"raw_1t": [], "raw_2t": [], "raw_2t_cpu_per_wall": [], "zarr": [], "direct": []}
    for r in range(repeats):
        rates["raw_1t"].append(raw_rate(arr, 1)[0])
        rate, cpu = raw_rate(arr, 2)
        rates["raw_2t"].append(rate)
        rates["raw_2t_cpu_per_wall"].append(cpu)
        for path in ("zarr", "direct") if r % 2 == 0 else ("direct", "zarr"):
            rates[path].append(epoch_rate(loaders[path], r + 1, through_zarr=path == "zarr"))
    return {"path": read_path_text(arr), **{k: spread(v) for k, v in rates.items()}}


# -- whether each codec releases the GIL while it decodes -------------------------------------------------


def wake_latency_ms(work, calls: int) -> float:
    """Median lateness (ms) of a thread that sleeps 1 ms at a time while ``work`` runs ``calls`` times in this
    one. Waking needs the GIL: a call that holds it for its whole length (tens of ms here) keeps the sleeper
    waiting for most of it; one that releases it lets the sleeper wake about on time, however loaded the
    machine (a sleeping thread is first in line for a core)."""
    late, stop = [], threading.Event()

    def sleeper() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            time.sleep(0.001)
            late.append(time.perf_counter() - t - 0.001)

    thread = threading.Thread(target=sleeper)
    thread.start()
    time.sleep(0.01)
    late.clear()
    for _ in range(calls):
        work()
    stop.set()
    thread.join()
    return 1000 * statistics.median(late)


def gil_probe(calls: int = 4) -> dict[str, float]:
    """:func:`wake_latency_ms` of each codec decoding 64 MiB of the benchmark's values in one call, of the two
    ways to byte-swap it, and of a call that holds the GIL (``sorted``) and one that does not (``time.sleep``)."""
    import random

    from zarrtorch._read.fastpath import UNPACK, to_native_order

    data = values(512).reshape(-1)  # 64 MiB
    dest = np.empty(data.nbytes, np.uint8)
    codecs = {
        "zstd": ("zstd", numcodecs.Zstd()),
        "blosc lz4 shuffle": ("blosc", numcodecs.Blosc("lz4", shuffle=numcodecs.Blosc.SHUFFLE)),
        "blosc zstd bitshuffle": ("blosc", numcodecs.Blosc("zstd", shuffle=numcodecs.Blosc.BITSHUFFLE)),
        "zlib": ("zlib", numcodecs.Zlib()),
        "gzip": ("gzip", numcodecs.GZip()),
    }
    out = {}
    for name, (kind, codec) in codecs.items():
        stored = codec.encode(data)
        out[f"decode {name}"] = wake_latency_ms(lambda k=kind, s=stored: UNPACK[k](s, dest), calls)
    out["copy (no compressor)"] = wake_latency_ms(lambda: UNPACK["none"](data.view(np.uint8), dest), calls)
    swapped = data.copy()
    out["ndarray.byteswap (not used)"] = wake_latency_ms(lambda: swapped.byteswap(inplace=True), calls)
    out["byte-swap by a cast (used)"] = wake_latency_ms(lambda: to_native_order(swapped), calls)
    shuffled = [random.random() for _ in range(1_000_000)]
    out["control: sorted(list) holds it"] = wake_latency_ms(lambda: sorted(shuffled), 2)
    out["control: time.sleep releases it"] = wake_latency_ms(lambda: time.sleep(0.1), 2)
    return out


def spread(rates: list[float]) -> dict:
    return {"median": statistics.median(rates), "low": min(rates), "high": max(rates)}


def shown(s: dict) -> str:
    return f"{s['median']:>7,.0f} ({s['low']:,.0f}-{s['high']:,.0f})"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    p.add_argument("--data-dir", default=str(DATA))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "layouts.json"))
    args = p.parse_args(argv)
    result = {"rows": args.rows, "row_kib": int(np.prod(ROW_SHAPE)) * 4 // 1024, "cpus": os.cpu_count()}
    result["load_before"] = os.getloadavg()
    runs = {}
    for layout in args.layouts:
        runs[layout] = measure_layout(generated_store(layout, args.rows, args.data_dir), args.repeats)
    result["gil_wake_latency_ms"] = gil = gil_probe()
    result["load_after"] = os.getloadavg()
    result["layouts"] = runs
    print(
        f"{args.rows} rows of {result['row_kib']} KiB, one row per chunk; {result['cpus']} CPUs, load average "
        f"{result['load_before'][0]:.1f} before, {result['load_after'][0]:.1f} after; rows/s, median (low-high) of "
        f"{args.repeats}"
    )
    head = f"{'layout':<26}{'raw 1t':>24}{'raw 2t':>24}{'zarr path 0w':>24}{'direct 0w':>24}"
    print(head + f"{'direct/zarr':>13}{'direct/raw2t':>14}{'2t/1t':>7}{'2t cpu/wall':>13}")
    for layout, r in runs.items():
        direct, raw_2t = r["direct"]["median"], r["raw_2t"]["median"]
        ratios = f"{direct / r['zarr']['median']:>13.2f}{direct / raw_2t:>14.2f}{raw_2t / r['raw_1t']['median']:>7.2f}"
        ratios += f"{r['raw_2t_cpu_per_wall']['median']:>13.2f}"
        cells = "".join(f"{shown(r[k]):>24}" for k in ("raw_1t", "raw_2t", "zarr", "direct"))
        print(f"{layout:<26}{cells}{ratios}")
    print("\nthe GIL while decoding 64 MiB in one call: median lateness of a thread waking every 1 ms (ms)")
    for name, ms in gil.items():
        print(f"  {name:<34}{ms:>8.2f}  {'holds the GIL' if ms > 1 else 'releases it'}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
