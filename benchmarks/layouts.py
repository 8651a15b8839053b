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
* ``zarr's path``: ``ZarrDataLoader`` with 0 workers (``--workers``) and default settings, shuffled, every array
  forced through zarr's codecs (:mod:`zarrtorch._read.chunks`: what every layout but v3 zstd took before issue
  43);
* ``direct``: the same loader as it now reads the layout (:mod:`zarrtorch._read.fastpath`).

Each figure is the median of ``--repeats`` runs (epochs for the loader), with the lowest and highest, the runs
of one layout interleaved, each after the store's files were read into the page cache; ratios are from this
one run. The machine's load average is printed before and after: on a shared machine the spread says how much
to trust a ratio. Last, whether each codec (and each way to byte-swap) releases the GIL while it decodes, by
how late a thread waking every millisecond wakes meanwhile (a 2-thread rate says it only on an idle machine).

``--cold`` measures every figure twice in the same run, interleaved: warm (as above) and cold (the store's files
dropped from the page cache first, :mod:`pagecache`, no root needed), with the share of the store's pages
resident just before each timed pass, and the ratio cold / warm. ``--era5`` replaces the stores by ERA5's scale
per field: three fields (t2m, u10, v10) of 721 x 1440 float32, three arrays of one time step a chunk (4 MiB), a
sample the three fields of a time step; layouts v3 zstd, v2 Blosc lz4 shuffle and v2 no compressor, the
loaders with 0 and 2 workers, MB/s of decoded bytes beside rows/s:

    .venv/bin/python benchmarks/layouts.py --cold                       # every layout, warm and cold
    .venv/bin/python benchmarks/layouts.py --era5 --cold --rows 96 --repeats 2   # ~3 GB under data/bench
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
import pagecache

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import zarr  # noqa: E402

from zarrtorch import ZarrDataLoader, ZarrIterableDataset  # noqa: E402
from zarrtorch._read.chunks import chunk_key  # noqa: E402
from zarrtorch._read.fastpath import read_path_text, stored_decoder  # noqa: E402

ROW_SHAPE = (32, 32, 32)  # 128 KiB of float32 per row: one row per chunk, as a weather store's time step
BATCH = 32
ERA5_FIELDS = ("t2m", "u10", "v10")
ERA5_GRID = (721, 1440)  # 0.25 degrees: 4 MiB of float32 a field and time step
ERA5_BATCH = 4  # 50 MB of samples a batch
ERA5_LAYOUTS = ("v3 zstd", "v2 blosc lz4 shuffle", "v2 no compressor")
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


def era5_field(name: str, t: int, grid: tuple[int, int]) -> np.ndarray:
    """Time step ``t`` of one field: a smooth field of the field's own scale (t2m about 280 K, winds about 0 m/s)
    that drifts with ``t``, plus noise of its own ``(field, t)`` seed, rounded to 0.01 as ``values``."""
    k = ERA5_FIELDS.index(name)
    lat, lon = np.meshgrid(
        np.linspace(-np.pi / 2, np.pi / 2, grid[0]), np.linspace(0, 2 * np.pi, grid[1]), indexing="ij"
    )
    mean, amplitude = (280.0, 30.0) if name == "t2m" else (0.0, 8.0)
    field = mean + amplitude * np.cos(lat) * np.cos((1 + k) * lon + t / 24.0)
    noise = np.random.default_rng([k, t]).standard_normal(grid, np.float32)
    return (field.astype(np.float32) + noise).round(2)


def era5_path(layout: str, rows: int, grid: tuple[int, int], data_dir: Path) -> Path:
    return Path(data_dir) / f"era5-{layout.replace(' ', '-')}-{rows}x{grid[0]}x{grid[1]}.zarr"


def generated_era5_store(layout: str, rows: int, grid: tuple[int, int], data_dir: Path) -> dict[str, zarr.Array]:
    """The layout's ERA5-scale store (written once, time step by time step, kept under ``data_dir``): a group of
    one array per field of ``ERA5_FIELDS``, one time step a chunk."""
    path = era5_path(layout, rows, grid, data_dir)
    if not path.exists():
        options = dict(LAYOUTS[layout])
        fmt, dtype = options.pop("zarr_format"), options.pop("dtype", "f4")
        writing = path.with_name(path.name + ".writing")
        group = zarr.open_group(str(writing), mode="w", zarr_format=fmt)
        for name in ERA5_FIELDS:
            arr = group.create_array(name, shape=(rows, *grid), chunks=(1, *grid), dtype=dtype, **options)
            for t in range(rows):
                arr[t] = era5_field(name, t, grid)
        writing.rename(path)
    group = zarr.open_group(str(path), mode="r")
    return {name: group[name] for name in ERA5_FIELDS}


def store_root(arrays: dict[str, zarr.Array]) -> Path:
    """The directory holding every file of the arrays' store."""
    return Path(str(next(iter(arrays.values())).store_path.store.root))


def raw_rate(arrays: dict[str, zarr.Array], threads: int) -> tuple[float, float]:
    """Rows/s of ``threads`` plain threads reading their share of the stored objects (of every array) and decoding
    each, and the process's CPU seconds per wall second meanwhile (above 1: the threads decoded at the same
    time)."""
    root = store_root(arrays)
    objects = []
    for arr in arrays.values():
        decode, unit = stored_decoder(arr), (arr.shards or arr.chunks)[0]
        objects += [(arr, decode, unit, k) for k in range(-(-arr.shape[0] // unit))]

    def work(part: list) -> None:
        for arr, decode, unit, k in part:
            decode((root / chunk_key(arr, k)).read_bytes(), min(unit, arr.shape[0] - k * unit))

    start, cpu = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, [objects[i::threads] for i in range(threads)]))
    wall = time.perf_counter() - start
    return next(iter(arrays.values())).shape[0] / wall, (time.process_time() - cpu) / wall


def forced_through_zarr():
    """Every array read through zarr's codecs (the loader's workers, forked meanwhile, keep it)."""
    return mock.patch("zarrtorch._read.reader.direct_decoder", return_value=None)


def epoch_rate(loader: ZarrDataLoader, epoch: int, through_zarr: bool, before=None) -> float:
    """Rows/s of one epoch of ``loader``, its arrays forced through zarr's codecs or not; ``before()`` is called
    after ``set_epoch``, just before the epoch starts (the page cache made cold or warm)."""
    with forced_through_zarr() if through_zarr else contextlib.nullcontext():
        loader.set_epoch(epoch)
        if before is not None:
            before()
        start, n = time.perf_counter(), 0
        for batch in loader:
            n += len(next(iter(batch.values())))
    return n / (time.perf_counter() - start)


def a_loader(arrays: dict[str, zarr.Array], batch_size: int = BATCH, workers: int = 0) -> ZarrDataLoader:
    """ZarrDataLoader with default settings, shuffled (a sharded store by whole shards), ``workers`` persistent
    workers."""
    ds = ZarrIterableDataset(arrays, seed=0)
    persistent = {"persistent_workers": True} if workers else {}
    return ZarrDataLoader(ds, batch_size=batch_size, num_workers=workers, **persistent)


def measure_layout(
    arrays: dict[str, zarr.Array], repeats: int, *, batch_size: int = BATCH, workers=(0,), cold: bool = False
) -> dict:
    """Each figure ``repeats`` times, interleaved (raw 1 and 2 threads, zarr's path, direct, per worker count: the
    loaders' order alternating), so that the machine's load changing during the run weighs on all of them alike;
    with ``cold``, each figure warm then cold (``<figure> cold``), the share of the store's pages resident before
    each timed pass under ``resident``. A first epoch of each loader is not timed (the process's pools, zarr's
    event loop and the workers start)."""
    root = store_root(arrays)
    loaders = {}
    for w in workers:
        for path in ("zarr", "direct"):
            loaders[f"{path} {w}w"] = loader = a_loader(arrays, batch_size, w)
            epoch_rate(loader, 0, through_zarr=path == "zarr")
    states = (False, True) if cold else (False,)
    rates: dict[str, list[float]] = {}
    resident: dict[str, list[float]] = {"warm": [], "cold": []}

    def record(name: str, is_cold: bool, rate: float) -> None:
        rates.setdefault(f"{name} cold" if is_cold else name, []).append(rate)

    for r in range(repeats):
        for is_cold in states:
            for threads in (1, 2):
                resident["cold" if is_cold else "warm"].append(pagecache.prepare_pass(root, is_cold))
                rate, cpu = raw_rate(arrays, threads)
                record(f"raw_{threads}t", is_cold, rate)
                if threads == 2:
                    record("raw_2t_cpu_per_wall", is_cold, cpu)
        order = list(loaders) if r % 2 == 0 else list(reversed(loaders))
        for name in order:
            for is_cold in states:

                def before(c=is_cold):
                    resident["cold" if c else "warm"].append(pagecache.prepare_pass(root, c))

                rate = epoch_rate(loaders[name], r + 1, through_zarr=name.startswith("zarr"), before=before)
                record(name, is_cold, rate)
    out = {"path": read_path_text(next(iter(arrays.values()))), **{k: spread(v) for k, v in rates.items()}}
    out["resident"] = {k: {"min": min(v), "max": max(v)} for k, v in resident.items() if v}
    if pagecache.STILL_RESIDENT:
        out["files_left_after_drop"] = pagecache.STILL_RESIDENT[:10]
    return out


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
    p.add_argument("--rows", type=int, default=None, help="rows (time steps) a store; default 1024, --era5: 96")
    p.add_argument("--repeats", type=int, default=None, help="runs of each figure; default 5, --era5: 2")
    p.add_argument("--layouts", nargs="+", default=None, choices=list(LAYOUTS), help="default: all; --era5: 3")
    p.add_argument("--cold", action="store_true", help="every figure also with the store dropped from the page cache")
    p.add_argument("--era5", action="store_true", help="ERA5's scale: 3 fields of 721 x 1440 float32, 4 MiB chunks")
    p.add_argument("--workers", type=int, nargs="+", default=None, help="the loaders' workers; default 0, --era5: 0 2")
    p.add_argument("--era5-grid", type=int, nargs=2, default=list(ERA5_GRID), help=argparse.SUPPRESS)  # tests
    p.add_argument("--no-gil-probe", action="store_true", help=argparse.SUPPRESS)  # tests
    p.add_argument("--data-dir", default=str(DATA))
    p.add_argument("--out", default=None, help="default benchmarks/results/layouts.json (--era5: layouts_era5.json)")
    args = p.parse_args(argv)
    era5 = args.era5
    rows = args.rows or (96 if era5 else 1024)
    repeats = args.repeats or (2 if era5 else 5)
    layouts = args.layouts or list(ERA5_LAYOUTS if era5 else LAYOUTS)
    workers = args.workers or ([0, 2] if era5 else [0])
    grid = tuple(args.era5_grid)
    batch = ERA5_BATCH if era5 else BATCH
    row_bytes = len(ERA5_FIELDS) * int(np.prod(grid)) * 4 if era5 else int(np.prod(ROW_SHAPE)) * 4
    out = args.out or str(ROOT / "benchmarks" / "results" / ("layouts_era5.json" if era5 else "layouts.json"))
    result = {"rows": rows, "row_bytes": row_bytes, "cpus": os.cpu_count(), "era5": era5, "cold": args.cold}
    result |= {"grid": list(grid) if era5 else None, "batch_size": batch, "workers": workers}
    result["load_before"] = os.getloadavg()
    runs = {}
    for layout in layouts:
        if era5:
            arrays = generated_era5_store(layout, rows, grid, args.data_dir)
        else:
            arrays = {"x": generated_store(layout, rows, args.data_dir)}
        runs[layout] = measure_layout(arrays, repeats, batch_size=batch, workers=workers, cold=args.cold)
        runs[layout]["stored_mb"] = sum(f.stat().st_size for f in pagecache.store_files(store_root(arrays))) / 1e6
    result["gil_wake_latency_ms"] = gil = {} if args.no_gil_probe else gil_probe()
    result["load_after"] = os.getloadavg()
    result["layouts"] = runs
    print(heading(result, repeats))
    print(table(result))
    if gil:
        print("\nthe GIL while decoding 64 MiB in one call: median lateness of a thread waking every 1 ms (ms)")
    for name, ms in gil.items():
        print(f"  {name:<34}{ms:>8.2f}  {'holds the GIL' if ms > 1 else 'releases it'}")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1))
    return result


def heading(result: dict, repeats: int) -> str:
    if result["era5"]:
        h, w = result["grid"]
        what = f"{result['rows']} time steps of {len(ERA5_FIELDS)} fields of {h} x {w} float32 (one step a chunk)"
    else:
        what = f"{result['rows']} rows of {result['row_bytes'] // 1024} KiB, one row per chunk"
    load = f"load average {result['load_before'][0]:.1f} before, {result['load_after'][0]:.1f} after"
    return f"{what}; {result['cpus']} CPUs, {load}; rows/s, median (low-high) of {repeats}"


def figure_names(run: dict) -> list[str]:
    """The run's figures in the table's order: raw, then each loader (zarr's path, direct) per worker count."""
    loaders = sorted((k for k in run if k.split()[0] in ("zarr", "direct") and not k.endswith("cold")), key=_by_workers)
    return ["raw_1t", "raw_2t", *loaders]


def _by_workers(name: str) -> tuple[int, bool]:
    path, workers = name.split()
    return int(workers[:-1]), path != "zarr"  # zarr's path first, as the warm table always showed it


def table(result: dict) -> str:
    """The rows/s table: per layout, each figure warm (and cold, with cold/warm, where measured), direct / zarr
    and direct / raw 2t per worker count, and MB/s of decoded bytes at ERA5 scale."""
    lines, mb = [], result["row_bytes"] / 1e6
    for layout, r in result["layouts"].items():
        lines.append(f"\n{layout} ({r['path']}, {r['stored_mb']:,.0f} MB stored)")
        if "resident" in r:
            shares = ", ".join(f"{k} {v['min']:.2f}-{v['max']:.2f}" for k, v in r["resident"].items())
            lines.append(f"  share of the store's pages in the page cache before each timed pass: {shares}")
        head = f"  {'figure':<12}{'warm rows/s':>26}"
        head += f"{'cold rows/s':>26}{'cold/warm':>10}" if result["cold"] else ""
        head += f"{'warm MB/s':>11}" + (f"{'cold MB/s':>11}" if result["cold"] else "") if result["era5"] else ""
        lines.append(head)
        for name in figure_names(r):
            line = f"  {name:<12}{shown(r[name]):>26}"
            if result["cold"]:
                line += f"{shown(r[name + ' cold']):>26}{r[name + ' cold']['median'] / r[name]['median']:>10.2f}"
            if result["era5"]:
                line += f"{r[name]['median'] * mb:>11,.0f}"
                line += f"{r[name + ' cold']['median'] * mb:>11,.0f}" if result["cold"] else ""
            lines.append(line)
        for suffix in ("", " cold") if result["cold"] else ("",):
            ratios = []
            for w in result["workers"]:
                direct = r[f"direct {w}w{suffix}"]["median"]
                ratios.append(
                    f"{w}w: direct/zarr {direct / r[f'zarr {w}w{suffix}']['median']:.2f}, "
                    f"direct/raw2t {direct / r[f'raw_2t{suffix}']['median']:.2f}"
                )
            cpu = r[f"raw_2t_cpu_per_wall{suffix}"]["median"]
            two = r[f"raw_2t{suffix}"]["median"] / r[f"raw_1t{suffix}"]["median"]
            lines.append(
                f"  {suffix.strip() or 'warm'}: {'; '.join(ratios)}; raw 2t/1t {two:.2f}, 2t cpu/wall {cpu:.2f}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
