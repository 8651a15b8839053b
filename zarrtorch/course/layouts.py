"""Write the same arrays in several on-disk layouts and measure how fast training-style reads are.

Lesson 01 measures the chunk length through the loader (:func:`loader_read_rates`); ``docs/chunk-size.md``
reports that sweep and the comparison of three layouts (:func:`compare_layouts`):

* ``zarr``: a Zarr v3 store chunked along the first axis (``zarrtorch.prepare_zarr``), one object per chunk;
* ``npy``: a stack of ``.npy`` files, one file per block of ``chunk_rows`` rows and one folder per array
  (``dask.array.to_npy_stack``, the format ``dask.array.from_npy_stack`` reads back);
* ``hdf5``: one HDF5 file, one dataset per array, chunked along the first axis (h5py), with or without a
  compression filter.

Every writer takes a mapping ``name -> array`` whose arrays share their first axis (a *sample*, or *row*,
is row ``i`` of every array) and returns a dict describing what it wrote. :func:`open_layout` opens any of
the three for reading; :func:`read_throughput` reads every block once (in order or shuffled) and
:func:`sample_latency` reads single random rows. All results are plain dicts, ready for a
``pandas.DataFrame``. Timings use :func:`time.perf_counter`; the files are read right after being written,
so they normally come from the operating system's page cache: the numbers measure decoding and per-request
overhead, not the disk or the network file system.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

MB = 1e6  # throughputs and sizes are reported in MB = 10**6 bytes

LAYOUTS = ("zarr", "npy", "hdf5")


# ---------------------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------------------
def _check_arrays(arrays: Mapping[str, Any]) -> int:
    if not arrays:
        raise ValueError("no arrays given: pass a mapping name -> array")
    rows = {n: int(a.shape[0]) for n, a in arrays.items()}
    if len(set(rows.values())) != 1:
        raise ValueError(f"arrays must share their first-axis length, got {rows}")
    n = next(iter(rows.values()))
    if n == 0:
        raise ValueError("arrays have zero rows: nothing to write")
    return n


def _check_chunk_rows(chunk_rows: int, rows: int) -> int:
    """The chunk length actually used: ``chunk_rows``, at most the number of rows (as ``prepare_zarr`` does)."""
    if int(chunk_rows) < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    return min(int(chunk_rows), rows)


def _fresh(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def row_nbytes(arrays: Mapping[str, Any]) -> int:
    """Bytes of one sample: row ``i`` of every array, uncompressed."""
    return sum(int(np.dtype(a.dtype).itemsize * math.prod(a.shape[1:])) for a in arrays.values())


def sweep_lengths(row_bytes: int, *, min_mb: float = 0.25, max_mb: float = 12.0, rows: int | None = None) -> list[int]:
    """Chunk lengths (powers of two, in rows) whose chunks hold between ``min_mb`` and ``max_mb`` MB
    (10**6 bytes, every array together), and at most ``rows`` rows when given: the same range of chunk
    sizes whatever the size of one row, so that a sweep costs about the same on every dataset."""
    if row_bytes < 1 or not 0 < min_mb <= max_mb:
        raise ValueError(f"need row_bytes >= 1 and 0 < min_mb <= max_mb, got {row_bytes}, {min_mb}, {max_mb}")
    out, c = [], 1
    while c * row_bytes <= max_mb * MB and (rows is None or c <= rows):
        if c * row_bytes >= min_mb * MB:
            out.append(c)
        c *= 2
    return out or [1]


def disk_usage(path: str | Path) -> dict:
    """``{"bytes": ..., "files": ...}`` of a file or of every file below a folder."""
    path = Path(path)
    if path.is_file():
        return {"bytes": path.stat().st_size, "files": 1}
    total, files = 0, 0
    for root, _, names in os.walk(path):
        for name in names:
            total += (Path(root) / name).stat().st_size
            files += 1
    return {"bytes": total, "files": files}


def _written(layout: str, path: Path, rows: int, chunk_rows: int, seconds: float, raw_bytes: int, **extra) -> dict:
    usage = disk_usage(path)
    return {
        "layout": layout,
        "path": path,
        "rows": rows,
        "chunk_rows": chunk_rows,
        "n_chunks": ceil_div(rows, chunk_rows),
        "write_s": seconds,
        "bytes": usage["bytes"],
        "files": usage["files"],
        "ratio": raw_bytes / max(1, usage["bytes"]),
        **extra,
    }


# ---------------------------------------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------------------------------------
def write_zarr(arrays: Mapping[str, Any], path: str | Path, *, chunk_rows: int, codec="zstd", level: int = 3) -> dict:
    """Write ``arrays`` with :func:`zarrtorch.prepare_zarr` (first-axis chunks of ``chunk_rows``) and time it."""
    from zarrtorch.prepare import prepare_zarr

    rows = _check_arrays(arrays)
    chunk_rows, path = _check_chunk_rows(chunk_rows, rows), Path(path)
    _fresh(path)
    start = time.perf_counter()
    prepare_zarr(dict(arrays), path, chunk_rows=chunk_rows, codec=codec, level=level, overwrite=True, progress=False)
    seconds = time.perf_counter() - start
    name = codec if isinstance(codec, str) or codec is None else type(codec).__name__
    return _written("zarr", path, rows, chunk_rows, seconds, rows * row_nbytes(arrays), codec=str(name))


def write_npy_stack(arrays: Mapping[str, Any], path: str | Path, *, chunk_rows: int) -> dict:
    """Write one folder per array, each a stack of ``.npy`` files of ``chunk_rows`` rows
    (``dask.array.to_npy_stack``: files ``0.npy``, ``1.npy``, ... and an ``info`` file)."""
    import dask
    import dask.array as da

    rows = _check_arrays(arrays)
    chunk_rows, path = _check_chunk_rows(chunk_rows, rows), Path(path)
    _fresh(path)
    path.mkdir()
    start = time.perf_counter()
    for name, a in arrays.items():
        chunks = (chunk_rows, *a.shape[1:])
        x = a.rechunk(chunks) if isinstance(a, da.Array) else da.from_array(a, chunks=chunks)
        with dask.config.set(scheduler="threads"):
            da.to_npy_stack(str(path / name), x, axis=0)
    seconds = time.perf_counter() - start
    return _written("npy", path, rows, chunk_rows, seconds, rows * row_nbytes(arrays), codec="none")


def write_hdf5(
    arrays: Mapping[str, Any],
    path: str | Path,
    *,
    chunk_rows: int,
    compression: str | None = None,
    level: int | None = None,
) -> dict:
    """Write one HDF5 file, one dataset per array chunked ``(chunk_rows, *rest)``; ``compression``:
    ``None``, ``"gzip"`` (``level`` 0-9) or ``"lzf"`` (the filters every h5py build has)."""
    import h5py

    rows = _check_arrays(arrays)
    chunk_rows, path = _check_chunk_rows(chunk_rows, rows), Path(path)
    _fresh(path)
    start = time.perf_counter()
    with h5py.File(path, "w") as f:
        f.attrs["chunk_rows"] = chunk_rows
        for name, a in arrays.items():
            d = f.create_dataset(
                name,
                shape=a.shape,
                dtype=a.dtype,
                chunks=(chunk_rows, *a.shape[1:]),
                compression=compression,
                compression_opts=level if compression == "gzip" else None,
            )
            step = chunk_rows * max(1, (64 * 2**20) // max(1, chunk_rows * row_nbytes({name: a})))
            for lo in range(0, rows, step):  # bounded memory: whole chunks, about 64 MiB at a time
                block = a[lo : lo + step]
                d[lo : lo + step] = np.asarray(block.compute() if hasattr(block, "compute") else block)
    seconds = time.perf_counter() - start
    codec = "none" if compression is None else f"{compression}" + (f"-{level}" if level is not None else "")
    return _written("hdf5", path, rows, chunk_rows, seconds, rows * row_nbytes(arrays), codec=codec)


# ---------------------------------------------------------------------------------------------------------
# Readers: one interface for the three layouts
# ---------------------------------------------------------------------------------------------------------
class LayoutReader:
    """Read whole blocks (``read_chunk``) or single rows (``read_row``) of every array of one layout."""

    layout = "?"

    def __init__(self, names: list[str], rows: int, chunk_rows: int, row_bytes: int) -> None:
        self.names, self.rows, self.chunk_rows, self.row_bytes = names, rows, chunk_rows, row_bytes

    @property
    def n_chunks(self) -> int:
        return ceil_div(self.rows, self.chunk_rows)

    def chunk_bounds(self, i: int) -> tuple[int, int]:
        if not 0 <= i < self.n_chunks:
            raise IndexError(f"chunk {i} out of range: there are {self.n_chunks}")
        return i * self.chunk_rows, min(self.rows, (i + 1) * self.chunk_rows)

    def read_chunk(self, i: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def read_row(self, i: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ZarrReader(LayoutReader):
    """Reads through ``zarr.Array`` slicing: a row decodes the whole chunk that holds it."""

    layout = "zarr"

    def __init__(self, path: str | Path) -> None:
        from zarrtorch import open_arrays

        self.arrays = open_arrays(str(path))
        first = next(iter(self.arrays.values()))
        super().__init__(list(self.arrays), int(first.shape[0]), int(first.chunks[0]), row_nbytes(self.arrays))

    def read_chunk(self, i):
        lo, hi = self.chunk_bounds(i)
        return {n: a[lo:hi] for n, a in self.arrays.items()}

    def read_row(self, i):
        return {n: a[int(i)] for n, a in self.arrays.items()}


class NpyStackReader(LayoutReader):
    """Reads ``.npy`` files: a block with ``np.load``; a row through a memory map of its file (only that
    row's bytes are touched, the format being uncompressed). Each call opens the file, as a map-style
    dataset that does not keep thousands of files open would."""

    layout = "npy"

    def __init__(self, path: str | Path) -> None:
        import pickle

        self.path = Path(path)
        names = sorted(p.name for p in self.path.iterdir() if (p / "info").exists())
        if not names:
            raise FileNotFoundError(f"{self.path} holds no npy stack (no <array>/info file)")
        infos = {}
        for n in names:
            with open(self.path / n / "info", "rb") as f:
                infos[n] = pickle.load(f)
        first = infos[names[0]]["chunks"][0]
        for n, info in infos.items():
            if info["axis"] != 0 or tuple(info["chunks"][0]) != tuple(first):
                raise ValueError(f"npy stack {n!r} is not split like {names[0]!r} along axis 0")
        self.bounds = np.concatenate([[0], np.cumsum(first)]).astype(np.int64)
        self.dtypes = {n: np.dtype(i["dtype"]) for n, i in infos.items()}
        row_bytes = sum(self.dtypes[n].itemsize * int(np.prod([c[0] for c in infos[n]["chunks"][1:]])) for n in names)
        super().__init__(names, int(self.bounds[-1]), int(first[0]), row_bytes)

    def chunk_bounds(self, i):
        if not 0 <= i < len(self.bounds) - 1:
            raise IndexError(f"chunk {i} out of range: there are {len(self.bounds) - 1}")
        return int(self.bounds[i]), int(self.bounds[i + 1])

    @property
    def n_chunks(self) -> int:
        return len(self.bounds) - 1

    def read_chunk(self, i):
        self.chunk_bounds(i)
        return {n: np.load(self.path / n / f"{i}.npy") for n in self.names}

    def read_row(self, i):
        i = int(i)
        if not 0 <= i < self.rows:
            raise IndexError(f"row {i} out of range: there are {self.rows}")
        c = int(np.searchsorted(self.bounds, i, side="right") - 1)
        j = i - int(self.bounds[c])
        return {n: np.array(np.load(self.path / n / f"{c}.npy", mmap_mode="r")[j]) for n in self.names}


class Hdf5Reader(LayoutReader):
    """Reads h5py datasets from one open file (HDF5's default chunk cache of 1 MiB per dataset)."""

    layout = "hdf5"

    def __init__(self, path: str | Path) -> None:
        import h5py

        self.file = h5py.File(path, "r")
        self.datasets = {n: d for n, d in self.file.items() if isinstance(d, h5py.Dataset)}
        if not self.datasets:
            raise ValueError(f"{path} holds no datasets")
        first = next(iter(self.datasets.values()))
        chunk_rows = int(first.chunks[0]) if first.chunks else int(first.shape[0])
        super().__init__(list(self.datasets), int(first.shape[0]), chunk_rows, row_nbytes(self.datasets))

    def read_chunk(self, i):
        lo, hi = self.chunk_bounds(i)
        return {n: d[lo:hi] for n, d in self.datasets.items()}

    def read_row(self, i):
        return {n: d[int(i)] for n, d in self.datasets.items()}

    def close(self):
        self.file.close()


def layout_of(path: str | Path) -> str:
    """``zarr``, ``npy`` or ``hdf5``, from what is on disk at ``path``."""
    path = Path(path)
    if path.is_file():
        with open(path, "rb") as f:
            if f.read(8) == b"\x89HDF\r\n\x1a\n":
                return "hdf5"
        raise ValueError(f"{path} is a file but not HDF5")
    if (path / "zarr.json").exists() or (path / ".zgroup").exists() or (path / ".zarray").exists():
        return "zarr"
    if path.is_dir() and any((p / "info").exists() for p in path.iterdir()):
        return "npy"
    raise ValueError(f"{path}: not a Zarr store, an npy stack folder or an HDF5 file")


def open_layout(path: str | Path) -> LayoutReader:
    """A :class:`LayoutReader` for a Zarr store, an npy stack folder or an HDF5 file."""
    return {"zarr": ZarrReader, "npy": NpyStackReader, "hdf5": Hdf5Reader}[layout_of(path)](path)


def read_all(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of a layout, in memory (for checking round trips on small data)."""
    with open_layout(path) as r:
        parts = [r.read_chunk(i) for i in range(r.n_chunks)]
    return {n: np.concatenate([p[n] for p in parts]) for n in parts[0]}


# ---------------------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------------------
def read_throughput(path: str | Path, *, order: str = "random", seed: int = 0, repeats: int = 1) -> dict:
    """Read every block of the layout once, in order (``sequential``) or in a seeded random order
    (``random``, what a shuffling loader does), and report MB/s of uncompressed data (best of ``repeats``)."""
    if order not in ("random", "sequential"):
        raise ValueError(f"order must be 'random' or 'sequential', got {order!r}")
    best = None
    with open_layout(path) as r:
        chunks = np.arange(r.n_chunks)
        if order == "random":
            chunks = np.random.default_rng(seed).permutation(chunks)
        for _ in range(max(1, int(repeats))):
            nbytes = 0
            start = time.perf_counter()
            for i in chunks.tolist():
                nbytes += sum(a.nbytes for a in r.read_chunk(i).values())
            seconds = time.perf_counter() - start
            best = seconds if best is None else min(best, seconds)
        return {
            "layout": r.layout,
            "order": order,
            "chunk_rows": r.chunk_rows,
            "n_chunks": r.n_chunks,
            "bytes": nbytes,
            "seconds": best,
            "mb_per_s": nbytes / MB / max(best, 1e-9),
        }


def sample_latency(path: str | Path, *, n: int = 100, seed: int = 0, rows: Iterable[int] | None = None) -> dict:
    """Read ``n`` single rows (every array) at seeded random positions, one call each, as a map-style
    ``Dataset.__getitem__`` would; report per-sample times in milliseconds."""
    with open_layout(path) as r:
        idx = (
            np.asarray(list(rows), dtype=np.int64)
            if rows is not None
            else (np.random.default_rng(seed).integers(0, r.rows, size=int(n)))
        )
        if len(idx) == 0:
            raise ValueError("no rows to read: n must be >= 1")
        times = np.empty(len(idx))
        for k, i in enumerate(idx.tolist()):
            start = time.perf_counter()
            r.read_row(i)
            times[k] = time.perf_counter() - start
        ms = times * 1e3
        return {
            "layout": r.layout,
            "chunk_rows": r.chunk_rows,
            "samples": len(idx),
            "mean_ms": float(ms.mean()),
            "median_ms": float(np.median(ms)),
            "p90_ms": float(np.percentile(ms, 90)),
            "samples_per_s": float(len(idx) / times.sum()) if times.sum() > 0 else float("inf"),
        }


def chunk_length_sweep(
    arrays: Mapping[str, Any],
    folder: str | Path,
    chunk_rows: Iterable[int] = (8, 16, 32, 64, 128, 256),
    *,
    codec="zstd",
    level: int = 3,
    latency_samples: int = 50,
    seed: int = 0,
    repeats: int = 1,
    keep: bool = False,
) -> list[dict]:
    """For each chunk length: write a Zarr store, read every chunk once in random order, read single rows.

    One dict per chunk length: ``chunk_rows``, ``n_chunks``, ``chunk_mb`` (uncompressed), ``write_s``,
    ``random_mb_per_s`` (best of ``repeats`` passes), ``sample_ms`` (median single-row latency). Stores are
    deleted unless ``keep``.
    """
    folder = Path(folder)
    out = []
    for c in chunk_rows:
        store = folder / f"sweep_{int(c)}.zarr"
        w = write_zarr(arrays, store, chunk_rows=int(c), codec=codec, level=level)
        t = read_throughput(store, order="random", seed=seed, repeats=repeats)
        s = sample_latency(store, n=latency_samples, seed=seed)
        out.append(
            {
                "chunk_rows": w["chunk_rows"],
                "n_chunks": w["n_chunks"],
                "chunk_mb": w["chunk_rows"] * row_nbytes(arrays) / MB,
                "write_s": w["write_s"],
                "random_mb_per_s": t["mb_per_s"],
                "sample_ms": s["median_ms"],
            }
        )
        if not keep:
            shutil.rmtree(store)
    return out


DEFAULT_VARIANTS = (
    ("zarr zstd-3", "zarr", {"codec": "zstd", "level": 3}),
    ("zarr none", "zarr", {"codec": "none"}),
    ("npy stack", "npy", {}),
    ("hdf5 none", "hdf5", {}),
    ("hdf5 gzip-1", "hdf5", {"compression": "gzip", "level": 1}),
)


def compare_layouts(
    arrays: Mapping[str, Any],
    folder: str | Path,
    *,
    chunk_rows: int = 64,
    variants=DEFAULT_VARIANTS,
    latency_samples: int = 100,
    seed: int = 0,
    repeats: int = 1,
    keep: bool = False,
) -> list[dict]:
    """Write ``arrays`` once per layout variant ``(label, layout, writer kwargs)`` with the same chunk length
    and measure each: ``files``, ``disk_mb``, ``ratio`` (uncompressed / on disk), ``write_s``,
    ``seq_mb_per_s`` and ``random_mb_per_s`` (best of ``repeats`` passes), ``sample_ms`` (median single-row
    latency). Written data are deleted unless ``keep``."""
    writers = {"zarr": write_zarr, "npy": write_npy_stack, "hdf5": write_hdf5}
    folder = Path(folder)
    suffix = {"zarr": ".zarr", "npy": ".npy-stack", "hdf5": ".h5"}
    out = []
    for k, (label, layout, kwargs) in enumerate(variants):
        if layout not in writers:
            raise ValueError(f"unknown layout {layout!r}: one of {LAYOUTS}")
        target = folder / f"compare_{k}_{layout}{suffix[layout]}"
        w = writers[layout](arrays, target, chunk_rows=chunk_rows, **kwargs)
        seq = read_throughput(target, order="sequential", seed=seed, repeats=repeats)
        rnd = read_throughput(target, order="random", seed=seed, repeats=repeats)
        lat = sample_latency(target, n=latency_samples, seed=seed)
        out.append(
            {
                "layout": label,
                "files": w["files"],
                "disk_mb": w["bytes"] / MB,
                "ratio": w["ratio"],
                "write_s": w["write_s"],
                "seq_mb_per_s": seq["mb_per_s"],
                "random_mb_per_s": rnd["mb_per_s"],
                "sample_ms": lat["median_ms"],
            }
        )
        if not keep:
            _fresh(target)
    return out


def loader_read_rates(
    arrays: Mapping[str, Any],
    folder: str | Path,
    chunk_rows: Iterable[int],
    *,
    batch_size: int = 64,
    repeats: int = 3,
    seed: int = 0,
    delay_ms: float | None = None,
    requests_in_flight: int | None = None,
) -> list[dict]:
    """For each chunk length: write ``arrays`` with :func:`zarrtorch.prepare_zarr` (zstd), then read one shuffled
    epoch through :class:`zarrtorch.ZarrDataLoader` (no workers: one process, as the lesson's kernel) and keep
    the best of ``repeats`` epochs. One dict per length: ``chunk_rows``, ``chunk_MiB``, ``n_chunks``,
    ``seconds``, ``MB_per_s`` (decoded data, MB = 10**6 bytes), ``ms_per_chunk`` and ``cpu_s``, the least CPU
    time the reading process spent on an epoch (all its threads): on a shared machine the wall clock also counts
    the time spent waiting for a core, the CPU time does not. Stores are deleted after.

    ``delay_ms``: read the stores over HTTP from :class:`~zarrtorch.course.servers.HttpStoreProcess`, which
    waits that long before answering each request, as a store with latency would (lesson 01 shows the chunk
    length's floor with it); ``requests_in_flight``: ``ReadOptions(requests_in_flight=...)`` for the reads."""
    from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
    from zarrtorch.course.servers import HttpStoreProcess

    rows = _check_arrays(arrays)
    nbytes = row_nbytes(arrays)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    server = HttpStoreProcess(folder, delay_ms=delay_ms, asyncio=True).start() if delay_ms is not None else None
    out = []
    try:
        for c in (_check_chunk_rows(c, rows) for c in chunk_rows):  # one store on disk at a time
            store = folder / f"rate_{c}.zarr"
            _fresh(store)
            prepare_zarr(dict(arrays), store, chunk_rows=c, overwrite=True, progress=False)
            source = f"{server.url}/{store.name}" if server else str(store)
            read = ReadOptions(requests_in_flight=requests_in_flight)
            ds = ZarrIterableDataset(source, shuffle=True, seed=seed, read=read)
            best, cpu = math.inf, math.inf
            for epoch in range(max(1, int(repeats))):
                loader = ZarrDataLoader(ds, batch_size=batch_size, drop_last=False)
                loader.set_epoch(epoch)
                start, start_cpu = time.perf_counter(), time.process_time()
                seen = sum(int(next(iter(batch.values())).shape[0]) for batch in loader)
                best = min(best, time.perf_counter() - start)
                cpu = min(cpu, time.process_time() - start_cpu)
                if seen != rows:
                    raise AssertionError(f"an epoch of {rows} rows yielded {seen}")
            n_chunks = ceil_div(rows, c)
            out.append(
                {
                    "chunk_rows": c,
                    "chunk_MiB": c * nbytes / 2**20,
                    "n_chunks": n_chunks,
                    "seconds": best,
                    "MB_per_s": rows * nbytes / MB / best,
                    "ms_per_chunk": best / n_chunks * 1e3,
                    "cpu_s": cpu,
                }
            )
            shutil.rmtree(store)
    finally:
        if server:
            server.stop()
    return out
