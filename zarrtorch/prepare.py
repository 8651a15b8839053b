"""Write training stores: Zarr v3 arrays chunked along the first (sample) axis only.

Training reads whole chunks and shuffles at chunk granularity, so a chunk must hold complete samples
(every variable, every grid point) for a run of consecutive rows. Archives are usually chunked the other
way (by variable, by tile); ``prepare_zarr`` rechunks them block by block, so memory stays bounded by
``max_memory_mb`` whatever the dataset's size, and keeps xarray coordinates and attributes so the store
still opens with ``xarray.open_zarr``.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import sys
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from zarrtorch._compat.dask import graph_tasks, task_parts
from zarrtorch._compat.fsspec import exists, strip_protocol
from zarrtorch._compat.xarray import wrapped
from zarrtorch._compat.zarr import run
from zarrtorch._read.cache import WRITE_ID
from zarrtorch._read.columns import CF_ENCODING, NOT_TENSORS, decoding_attributes
from zarrtorch._read.listing import EVERY_CHUNK_WRITTEN
from zarrtorch._read.source import is_url, sample_dimension
from zarrtorch._util.sizes import ceil_div, row_bytes
from zarrtorch.layout import LayoutError, check_first_axis_layout

__all__ = ["CODECS", "make_codec", "prepare_zarr", "rows_for_chunk_mb"]


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def update(self, n: int) -> None:
        return None


def _progress_bar(total: int, desc: str, enabled: bool):
    """A tqdm bar when asked for and tqdm is installed (the course installs it; the core does not need it)."""
    if enabled:
        try:
            from tqdm import tqdm  # tqdm.auto would warn in Jupyter without ipywidgets
        except ImportError:
            return _NoBar()
        return tqdm(total=total, desc=desc, unit="row")
    return _NoBar()


def _is_xarray_dataset(obj) -> bool:
    """Without importing xarray: an xarray.Dataset can only exist if xarray was imported already."""
    xr = sys.modules.get("xarray")
    return xr is not None and isinstance(obj, xr.Dataset)


def _resolve_chunk_rows(rows: int, row_bytes: int, chunk_rows: int | None, chunk_mb: float | None) -> int:
    if chunk_rows is not None and chunk_mb is not None:
        raise ValueError("give chunk_rows or chunk_mb, not both")
    if chunk_rows is None:
        chunk_rows = rows_for_chunk_mb(row_bytes, 8.0 if chunk_mb is None else chunk_mb)
    if isinstance(chunk_rows, bool) or int(chunk_rows) != chunk_rows or int(chunk_rows) < 1:
        raise ValueError(f"chunk_rows must be an integer >= 1, got {chunk_rows!r}")
    return min(int(chunk_rows), rows)


def _block_rows(unit_rows: int, row_bytes: int, max_memory_mb: float) -> int:
    """Rows computed and written at once: whole chunks (or shards), as many as fit in the memory budget
    (at least one)."""
    per_unit = unit_rows * max(1, row_bytes)
    return unit_rows * max(1, int(max_memory_mb * 2**20 // per_unit))


def _sample_dim(ds, variables: list[str] | None, dim: str | None):
    """The dataset's data variables to write, each with the sample dimension first, and that dimension."""
    # sorted: a store opened with xarray lists its variables in file-system order, which varies by machine
    names = sorted(ds.data_vars) if variables is None else list(variables)
    if not names:
        raise LayoutError("the dataset has no data variables to write")
    missing = [n for n in names if n not in ds.data_vars]
    if missing:
        raise KeyError(f"unknown data variable(s) {missing}: the dataset has {list(ds.data_vars)}")
    if dim is not None:
        lacking = [n for n in names if dim not in ds[n].dims]
        if dim not in ds.dims or lacking:
            raise LayoutError(
                f"dim={dim!r}: variables {lacking or names} lack that dimension (the dataset has {list(ds.dims)})"
            )
        return _with_every_coordinate(ds, names).transpose(dim, ...), dim
    # one rule with the loader (zarrtorch._read.source), so that the error below names the odd variable (a static
    # field), not the data
    dim = sample_dimension({n: ds[n].dims for n in names}, {n: ds[n].nbytes for n in names})
    others = [n for n in names if not ds[n].dims or ds[n].dims[0] != dim]
    if dim is None or others:
        raise LayoutError(
            f"data variables {others or names[:1]} do not have {dim!r} as their first dimension: every array "
            "written for training needs the sample dimension first. Pass dim='...' (the variables are then "
            "transposed), select variables with variables=[...], or turn static fields into coordinates "
            "(ds.set_coords(...): they are written whole, and Windows(static=[...]) returns them with every window)."
        )
    dated = [d for d in ds[names[0]].dims if d != dim and d in ds.coords and np.issubdtype(ds[d].dtype, np.datetime64)]
    if dated:
        raise LayoutError(
            f"the variables' first dimension is {dim!r}, but {dated[0]!r} holds dates: samples are usually time "
            f"steps. Pass dim={dated[0]!r} (the variables are transposed to put it first), or dim={dim!r} if "
            f"each {dim!r} really is a sample."
        )
    return _with_every_coordinate(ds, names), dim


def _with_every_coordinate(ds, names: list[str]):
    """The data variables ``names`` of ``ds`` and every coordinate: ``ds[names]`` would keep only the coordinates
    along their dimensions, and leave out a static field set as a coordinate with an axis of its own (a time axis
    of one step) without a word."""
    return ds.drop_vars([n for n in ds.data_vars if n not in names])


def prepare_zarr(
    source,
    store: str | Path,
    *,
    chunk_rows: int | None = None,
    chunk_mb: float | None = None,
    codec: str | Any | None = "zstd",
    level: int = 3,
    variables: list[str] | None = None,
    dim: str | None = None,
    overwrite: bool = False,
    max_memory_mb: float = 256,
    progress: bool = True,
    shard_chunks: int | None = None,
    storage_options: dict | None = None,
) -> zarr.Group:
    """Write ``source`` to ``store`` as Zarr v3 chunked only along the first axis and return the group (read-only).

    ``source``: an ``xarray.Dataset`` (its data variables sharing the sample dimension, or ``variables``)
    or a mapping name -> array (NumPy, dask, torch, or anything sliceable with ``shape``/``dtype``).
    ``dim``: the dataset's sample dimension (default: the first dimension the data variables share, see
    :mod:`zarrtorch._read.source`; a dataset whose dates lie along another dimension must name it); variables are
    transposed to put it first. The chunk length is ``chunk_rows``, or derived from ``chunk_mb`` (one row of
    every array counted together), default 8 MiB. At most ``max_memory_mb`` of source rows are computed at a
    time (on the cluster's workers when a ``dask.distributed`` client is active). ``shard_chunks``: write Zarr
    v3 shards of that many chunks (fewer objects, for object storage; the loader then reads and shuffles whole shards).
    ``store`` may be a URL (``s3://bucket/x.zarr``) with fsspec ``storage_options``. With ``overwrite``, a local
    store is replaced once the new one is complete, so a store can be rewritten from itself (rechunked in place).
    """
    if not isinstance(max_memory_mb, (int, float)) or not math.isfinite(max_memory_mb) or max_memory_mb <= 0:
        raise ValueError(f"max_memory_mb must be a finite number of MiB > 0, got {max_memory_mb!r}")
    args = (chunk_rows, chunk_mb, codec, level, max_memory_mb, progress, shard_chunks)
    if _is_xarray_dataset(source):
        ds, dim = _sample_dim(source, variables, dim)
        sources = [ds[n].variable for n in ds.data_vars]
    elif isinstance(source, Mapping):
        if variables is not None or dim is not None:
            raise ValueError("variables= and dim= apply to an xarray.Dataset; a mapping is written whole, rows first")
        source = _checked_mapping(source)
        sources = list(source.values())
    else:
        raise TypeError(f"prepare_zarr takes an xarray.Dataset or a mapping name -> array, got {type(source).__name__}")
    with target_store(store, storage_options, overwrite, [source, *sources]) as out:
        if _is_xarray_dataset(source):
            _prepare_xarray(ds, dim, out, Path(str(store)).name, *args)
        else:
            _prepare_mapping(source, out, Path(str(store)).name, *args)
        _say_every_chunk_written(out)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
            zarr.consolidate_metadata(out)  # lets xarray.open_zarr open the store without a warning
    final = out if is_url(store) else str(Path(os.fspath(store).removeprefix("file://")).expanduser())
    group = zarr.open_group(final, mode="r")
    names = group.attrs["zarrtorch"]["variables"]
    check_first_axis_layout({n: group[n] for n in names})
    return group


def _prepare_xarray(ds, dim, out, label, chunk_rows, chunk_mb, codec, level, max_memory_mb, progress, shard_chunks):
    names = list(ds.data_vars)
    rows = ds.sizes[dim]
    if rows == 0:
        raise LayoutError(f"dimension {dim!r} has zero rows: there is nothing to write")
    arrays = {n: ds[n] for n in names}
    for n, a in arrays.items():
        if a.dtype.kind in NOT_TENSORS:  # stored CF-encoded or as text, then refused by the loader as not numbers
            raise TypeError(
                f"variable {n!r} has dtype {a.dtype}, which a tensor cannot hold: convert it to numbers "
                f"(ds[{n!r}].astype('datetime64[s]').astype('int64') for dates), or leave it out "
                "(variables=[...] or ds.drop_vars)"
            )
        packed = sorted(k for k in CF_ENCODING if k in a.attrs)
        if packed:  # xarray's block writes would fail on them, saying to drop them: the integers then stored as values
            raise ValueError(
                f"variable {n!r} holds packed values, with {packed} among its attributes (opened with "
                "mask_and_scale=False or decode_cf=False): open the source with xarray's defaults, so that its values "
                "are decoded, and prepare_zarr writes those values (or give a mapping {name: ds[name]}: its arrays "
                "are copied packed, with their attributes, without coordinates)"
            )
    nbytes_row = row_bytes(arrays)
    chunk_rows = _resolve_chunk_rows(rows, nbytes_row, chunk_rows, chunk_mb)
    shard_rows = shard_shape(chunk_rows, shard_chunks, rows)
    compressors = make_codec(codec, level)

    target = ds.chunk({d: ((shard_rows or chunk_rows) if d == dim else -1) for d in ds.dims})
    # Coordinates without the sample dimension (a static field, cell areas) are not in the block-by-block
    # writes below: load them so that the metadata write stores their values, not just their fill value.
    static = [c for c in target.coords if dim not in target[c].dims and c not in target.xindexes]
    target = target.assign_coords({c: target[c].compute() for c in static})
    encoding = {}
    for n in names:
        target[n].encoding = {}
        encoding[n] = {"chunks": (chunk_rows, *ds[n].shape[1:]), "compressors": compressors}
        if shard_rows:
            encoding[n]["shards"] = (shard_rows, *ds[n].shape[1:])
    for c in target.coords:
        # a packed or masked coordinate is written as xarray shows it, as the data variables are: its encoding's
        # dtype alone, without its scale and fill, would not hold its values, and xarray cannot write every
        # encoding it reads (a list of missing values). Others keep how their times are stored.
        packed = any(k in target[c].encoding for k in CF_ENCODING)
        kept = () if packed else ("units", "calendar", "dtype")
        target[c].encoding = {k: v for k, v in target[c].encoding.items() if k in kept}
    target.attrs = {**ds.attrs, "zarrtorch": {"dim": dim, "variables": names, "chunk_rows": chunk_rows}}

    # Metadata and coordinates first; the data variables are then filled block by block.
    with warnings.catch_warnings():
        # string coordinate labels (e.g. variable names) have no frozen Zarr v3 spec yet; they are only labels
        warnings.filterwarnings("ignore", message=".*does not have a Zarr V3 specification.*")
        target.to_zarr(
            out,
            mode="w",
            compute=False,
            zarr_format=3,
            consolidated=False,
            encoding=encoding,
            write_empty_chunks=True,
        )
    along_dim = [n for n in target.variables if dim in target[n].dims]
    step = _block_rows(shard_rows or chunk_rows, nbytes_row, max_memory_mb)
    with _progress_bar(rows, f"prepare {label} (rows along {dim!r})", progress) as bar:
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            block = target[along_dim].isel({dim: slice(start, stop)}).compute()
            block = block.drop_vars([v for v in block.variables if dim not in block[v].dims])
            block.to_zarr(
                out, region={dim: slice(start, stop)}, zarr_format=3, consolidated=False, write_empty_chunks=True
            )
            bar.update(stop - start)


def _say_every_chunk_written(out) -> None:
    """Say in the group's attributes that its variables hold every chunk (each written with
    ``write_empty_chunks=True``), once they are all written: zarr records nowhere whether it skipped a chunk of
    fill values, and the loader then need not list the store's keys to know (:mod:`zarrtorch._read.listing`).
    With it, an id of this write, which the chunk cache's store ids hold."""
    group = zarr.open_group(out, mode="r+")
    # a write_id of each write's own: a node's chunk cache never serves an earlier write's chunks (_read.cache)
    group.attrs["zarrtorch"] = {**group.attrs["zarrtorch"], EVERY_CHUNK_WRITTEN: True, WRITE_ID: uuid.uuid4().hex}


def _checked_mapping(source: Mapping) -> dict:
    """The mapping's arrays, each with a first axis, a NumPy dtype and the same number of rows."""
    if not source:
        raise LayoutError("the mapping holds no arrays to write")
    out = {}
    for n, a in source.items():
        if not hasattr(a, "shape") or not hasattr(a, "dtype") or len(a.shape) == 0:
            raise TypeError(f"{n!r} is not an array with a first axis (got {type(a).__name__})")
        if str(n) in out:
            first = next(k for k in source if str(k) == str(n))
            raise ValueError(f"two arrays would both be stored as {str(n)!r}: the keys {first!r} and {n!r}")
        if isinstance(a, np.ma.MaskedArray):
            raise TypeError(
                f"{n!r} is a masked array: its mask would be lost. Write a.filled(value) (and the mask as an array "
                "of its own if the model needs it)"
            )
        kind = getattr(np.dtype(a.dtype) if not type(a).__module__.startswith("torch") else None, "kind", "f")
        if kind in NOT_TENSORS:
            raise TypeError(
                f"{n!r} has dtype {a.dtype}, which a tensor cannot hold: convert it to numbers first (datetimes: "
                "a.astype('datetime64[s]').astype('int64'); categories: integer codes)"
            )
        out[str(n)] = _TorchRows(a) if type(a).__module__.startswith("torch") else a
    names = list(out)
    rows = int(out[names[0]].shape[0])
    for n, a in out.items():
        if int(a.shape[0]) != rows:
            raise LayoutError(
                f"arrays have different first-axis lengths: {names[0]!r} has {rows}, {n!r} has {a.shape[0]}"
            )
    if rows == 0:
        raise LayoutError(f"array {names[0]!r} has zero rows: there is nothing to write")
    return out


class _TorchRows:
    """A torch tensor seen as an array with a NumPy dtype, copied to NumPy a block of rows at a time."""

    def __init__(self, tensor):
        self.tensor = tensor.detach()
        self.shape = tuple(tensor.shape)
        self.dtype = self.tensor[:0].cpu().numpy().dtype

    def __getitem__(self, rows):
        return self.tensor[rows].cpu().numpy()


def _prepare_mapping(
    source, out_store, label, chunk_rows, chunk_mb, codec, level, max_memory_mb, progress, shard_chunks
):
    names = list(source)
    rows = int(source[names[0]].shape[0])
    nbytes_row = row_bytes(source)
    chunk_rows = _resolve_chunk_rows(rows, nbytes_row, chunk_rows, chunk_mb)
    shard_rows = shard_shape(chunk_rows, shard_chunks, rows)
    compressors = make_codec(codec, level)
    group = zarr.open_group(out_store, mode="w", zarr_format=3)
    group.attrs["zarrtorch"] = {"dim": "row", "variables": names, "chunk_rows": chunk_rows}
    out = {
        n: group.create_array(
            n,
            shape=a.shape,
            chunks=(chunk_rows, *a.shape[1:]),
            shards=(shard_rows, *a.shape[1:]) if shard_rows else None,
            dtype=a.dtype,
            compressors=compressors,
            config={"write_empty_chunks": True},
        )
        for n, a in source.items()
    }
    for n, a in source.items():  # the values are copied as stored: their CF packing goes with them
        out[n].attrs.update(decoding_attributes(a))
    step = _block_rows(shard_rows or chunk_rows, nbytes_row, max_memory_mb)
    with _progress_bar(rows, f"prepare {label}", progress) as bar:
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            for n, a in source.items():
                block = a[start:stop]
                out[n][start:stop] = np.asarray(block.compute() if hasattr(block, "compute") else block)
            bar.update(stop - start)


# -- how and where to write: codecs, the chunk length, the target store --------------------------------------
CODECS = ("zstd", "blosc-zstd", "blosc-lz4", "none")


def make_codec(codec: str | Any | None = "zstd", level: int = 3) -> list:
    """Zarr v3 compressors for a codec name (``zstd`` default, ``blosc-zstd``, ``blosc-lz4``, ``none``), each with a
    checksum, or a codec object used as is.

    A flipped bit inside compressed data often still decodes, to other values: a checksum is what tells. zstd frames
    carry their content's checksum (zstd checks it as it decodes); Blosc and uncompressed chunks are followed by
    Zarr v3's ``crc32c`` codec (part of the spec: zarr, tensorstore and other readers check it). zarrtorch's reader
    checks both: about 5% of zstd's decode time, a quarter of Blosc lz4's (the fastest decode;
    ``benchmarks/README.md``, "Checksums"). A codec object without one (``zarr.codecs.ZstdCodec(level=3)``) writes
    none."""
    if codec is None or codec == "none":
        return [zarr.codecs.Crc32cCodec()]
    if not isinstance(codec, str):
        return [codec]
    if codec == "zstd":
        return [zarr.codecs.ZstdCodec(level=level, checksum=True)]
    if codec in ("blosc-zstd", "blosc-lz4"):
        blosc = zarr.codecs.BloscCodec(cname=codec.split("-")[1], clevel=level, shuffle="shuffle")
        return [blosc, zarr.codecs.Crc32cCodec()]
    raise ValueError(f"unknown codec {codec!r}: choose one of {', '.join(CODECS)} or pass a zarr codec object")


def rows_for_chunk_mb(row_bytes: int, chunk_mb: float) -> int:
    """Chunk length giving chunks of about ``chunk_mb`` MiB, counting one row of every array together
    (the unit the loader reads at once)."""
    if not isinstance(chunk_mb, (int, float)) or not math.isfinite(chunk_mb) or chunk_mb <= 0:
        raise ValueError(f"chunk_mb must be a finite number of MiB > 0, got {chunk_mb!r}")
    return max(1, int(chunk_mb * 2**20 // max(1, row_bytes)))


@contextlib.contextmanager
def target_store(store: str | os.PathLike, storage_options: dict | None, overwrite: bool, sources=()):
    """What zarr and xarray write to: the local path, or an fsspec store for a URL. An existing store is
    replaced only with ``overwrite``. A local store appears only once complete (a writer killed midway once
    left a store whose metadata said it was whole, and the loader ran into the missing chunks thousands of rows
    later): it is written beside its place and then moved there, so data read lazily from an old store
    (rechunking a store in place) is still there while it is read, and a failed write leaves it as it was.
    ``sources``: arrays being written, to refuse a remote target they are read from."""
    if not is_url(store):
        if storage_options:
            raise ValueError(f"storage_options apply to a URL (s3://...), not to the local path {store}")
        path = Path(os.fspath(store).removeprefix("file://")).expanduser()  # "~/x.zarr", as the loader reads it
        if path.is_symlink():
            path = path.resolve()  # the link's target is replaced; the link goes on pointing at it
        if path.exists():
            if not path.is_dir():
                raise FileExistsError(f"{path} is a file, not a Zarr store: remove it or choose another path")
            if not overwrite:
                raise FileExistsError(f"{path} exists: pass overwrite=True to replace it, or choose another path")
            _refuse_other_directory(path)
            yield from _replace_when_done(path)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        yield from _replace_when_done(path)  # a writer killed midway leaves no store that looks complete
        return
    remote = zarr.storage.FsspecStore.from_url(store, storage_options=storage_options, read_only=False)
    fs, path = remote.fs, remote.path
    if exists(fs, path):
        if not overwrite:
            raise FileExistsError(f"{store} exists: pass overwrite=True to replace it, or choose another URL")
        if any(_reads_from(location, fs, path) for location in _stored_at(sources)):
            raise ValueError(
                f"the data to write is read from {store}, which overwrite=True would delete first (object "
                "storage cannot write a new store beside it and move it into place): write to another URL, "
                "then copy or move it over this one (e.g. `aws s3 sync`, or fsspec's fs.copy), or use the new URL"
            )
        run(remote.delete_dir(""))
    yield remote


ZARR_MARKERS = ("zarr.json", ".zgroup", ".zarray")  # what a Zarr store (v3, v2 group, v2 array) holds at its root


def _refuse_other_directory(path: Path) -> None:
    """``overwrite=True`` replaces a Zarr store, never a directory of something else (a results folder given as
    the path by mistake keeps its files). An empty directory is fine."""
    if any((path / marker).exists() for marker in ZARR_MARKERS):
        return
    held = sorted(p.name for p in path.iterdir())
    if held:
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        raise FileExistsError(
            f"{path} is a directory that is not a Zarr store (it holds {shown}): overwrite=True replaces only a "
            "Zarr store. Choose another path, or remove the directory yourself if its contents can go"
        )


def _leftovers_of_dead_writers(path: Path) -> None:
    """A writer killed mid-write leaves ``.NAME.writing-PID`` (and ``.NAME.old-PID``) beside the store: removed
    once no process of that PID runs."""
    for stale in path.parent.glob(f".{path.name}.*-*"):
        kind, _, pid = stale.name.rpartition("-")
        if not kind.endswith((".writing", ".old")) or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except PermissionError:  # another user's running process
            pass


def _replace_when_done(path: Path):
    _leftovers_of_dead_writers(path)
    writing = path.with_name(f".{path.name}.writing-{os.getpid()}")
    shutil.rmtree(writing, ignore_errors=True)
    try:
        yield str(writing)
    except BaseException:
        shutil.rmtree(writing, ignore_errors=True)
        raise
    if not path.exists():
        writing.rename(path)
        return
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    path.rename(old)
    writing.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def _stored_at(sources) -> list[tuple[tuple[str, ...] | str, str]]:
    """Where the data of ``sources`` is read from: ``(protocols, path)`` for each zarr array behind them,
    directly or inside an xarray dataset or variable (its lazy wrappers, or its dask graph), and ``(url,
    "")`` for a dataset's ``encoding["source"]`` (what ``xarray.open_zarr`` records)."""
    found: list = []
    seen: set[int] = set()

    def walk(obj, depth: int) -> None:
        if obj is None or depth > 12 or id(obj) in seen or isinstance(obj, (str, bytes, int, float, np.ndarray)):
            return
        seen.add(id(obj))
        store_path = getattr(obj, "store_path", None)
        if store_path is not None:
            store = store_path.store
            fs = getattr(store, "fs", None)
            if fs is not None:
                protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
                found.append((protocols, f"{store.path.rstrip('/')}/{store_path.path}".rstrip("/")))
            elif isinstance(store, zarr.storage.LocalStore):
                found.append((("file", "local"), f"{store.root.as_posix()}/{store_path.path}".rstrip("/")))
            return
        source = getattr(obj, "encoding", None)
        if isinstance(source, Mapping) and isinstance(source.get("source"), str):
            found.append((source["source"], ""))
        if _is_xarray_dataset(obj):
            for v in obj.variables.values():
                walk(v, depth + 1)
            return
        tasks = graph_tasks(obj)
        if tasks is not None:
            for task in tasks:
                walk(task, depth + 1)
            return
        if isinstance(obj, (list, tuple)):
            for item in obj:
                walk(item, depth + 1)
            return
        for inner in (*wrapped(obj), *task_parts(obj)):  # xarray's lazy wrappers, dask's tasks
            walk(inner, depth + 1)

    for source in sources:
        walk(source, 0)
    return found


def _reads_from(location, fs, path: str) -> bool:
    """Whether ``location`` (from :func:`_stored_at`) lies in the store at ``path`` on the file system ``fs``."""
    import fsspec.core

    where, inner = location
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if isinstance(where, str):  # a URL
        protocol, _ = fsspec.core.split_protocol(where)
        if protocol not in protocols:
            return False
        inner = strip_protocol(fs, where)
    elif not set(where) & set(protocols):
        return False
    inner, path = inner.rstrip("/"), path.rstrip("/")
    return inner == path or inner.startswith(f"{path}/")


def shard_shape(chunk_rows: int, shard_chunks: int | None, rows: int) -> int | None:
    """Rows per shard (``shard_chunks`` inner chunks), or ``None`` for no sharding."""
    if shard_chunks is None:
        return None
    if int(shard_chunks) < 1:
        raise ValueError(f"shard_chunks must be >= 1 (inner chunks per shard), got {shard_chunks}")
    return min(int(shard_chunks) * chunk_rows, ceil_div(rows, chunk_rows) * chunk_rows)
