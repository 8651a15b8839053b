"""How and where :func:`zarrtorch.prepare_zarr` writes: codecs, the chunk length, and the target store, a
local path or a URL (``s3://...`` with fsspec ``storage_options``), so that preparation can run on a
cluster and write straight to object storage."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from pathlib import Path
from typing import Any

import zarr

CODECS = ("zstd", "blosc-zstd", "blosc-lz4", "none")


def make_codec(codec: str | Any | None = "zstd", level: int = 3) -> list:
    """Zarr v3 compressors for a codec name (``zstd`` default, ``blosc-zstd``, ``blosc-lz4``, ``none``)
    or a codec object used as is."""
    if codec is None or codec == "none":
        return []
    if not isinstance(codec, str):
        return [codec]
    if codec == "zstd":
        return [zarr.codecs.ZstdCodec(level=level)]
    if codec in ("blosc-zstd", "blosc-lz4"):
        return [zarr.codecs.BloscCodec(cname=codec.split("-")[1], clevel=level, shuffle="shuffle")]
    raise ValueError(f"unknown codec {codec!r}: choose one of {', '.join(CODECS)} or pass a zarr codec object")


def rows_for_chunk_mb(row_bytes: int, chunk_mb: float) -> int:
    """Chunk length giving chunks of about ``chunk_mb`` MiB, counting one row of every array together
    (the unit the loader reads at once)."""
    if not isinstance(chunk_mb, (int, float)) or not math.isfinite(chunk_mb) or chunk_mb <= 0:
        raise ValueError(f"chunk_mb must be a finite number of MiB > 0, got {chunk_mb!r}")
    return max(1, int(chunk_mb * 2**20 // max(1, row_bytes)))


def is_url(store) -> bool:
    """Whether ``store`` names a remote store (``s3://``, ``https://``...), not a local path."""
    return isinstance(store, str) and "://" in store and not store.startswith("file://")


@contextlib.contextmanager
def target_store(store: str | os.PathLike, storage_options: dict | None, overwrite: bool, sources=()):
    """What zarr and xarray write to: the local path, or an fsspec store for a URL. An existing store is
    replaced only with ``overwrite``, and a local one only once the new one is complete: the new store is
    written beside it and then moved into place, so data read lazily from the old store (rechunking a store
    in place) is still there while it is read, and a failed write leaves the old store as it was.
    ``sources``: arrays being written, to refuse a remote target they are read from."""
    if not is_url(store):
        if storage_options:
            raise ValueError(f"storage_options apply to a URL (s3://...), not to the local path {store}")
        path = Path(os.fspath(store).removeprefix("file://"))
        if path.exists() or path.is_symlink():
            if not path.is_dir():
                raise FileExistsError(f"{path} is a file, not a Zarr store: remove it or choose another path")
            if not overwrite:
                raise FileExistsError(f"{path} exists: pass overwrite=True to replace it, or choose another path")
            yield from _replace_when_done(path)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            yield str(path)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return
    remote = zarr.storage.FsspecStore.from_url(store, storage_options=storage_options, read_only=False)
    fs, path = remote.fs, remote.path
    exists = fs.exists(path) if not fs.async_impl else zarr.core.sync.sync(fs._exists(path))
    if exists:
        if not overwrite:
            raise FileExistsError(f"{store} exists: pass overwrite=True to replace it, or choose another URL")
        if any(_reads_from(a, path) for a in sources):
            raise ValueError(
                f"the arrays to write are read from {store}, which overwrite=True would delete first: write to "
                "another URL (object storage cannot move a store into place afterwards)"
            )
        zarr.core.sync.sync(remote.delete_dir(""))
    yield remote


def _replace_when_done(path: Path):
    writing = path.with_name(f".{path.name}.writing-{os.getpid()}")
    shutil.rmtree(writing, ignore_errors=True)
    try:
        yield str(writing)
    except BaseException:
        shutil.rmtree(writing, ignore_errors=True)
        raise
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    path.rename(old)
    writing.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def _reads_from(array, path: str) -> bool:
    """Whether ``array`` (a zarr array) is stored under the remote ``path``."""
    store_path = getattr(array, "store_path", None)
    root = getattr(getattr(store_path, "store", None), "path", None)
    return isinstance(root, str) and root.rstrip("/").startswith(path.rstrip("/"))


def shard_shape(chunk_rows: int, shard_chunks: int | None, rows: int) -> int | None:
    """Rows per shard (``shard_chunks`` inner chunks), or ``None`` for no sharding."""
    if shard_chunks is None:
        return None
    if int(shard_chunks) < 1:
        raise ValueError(f"shard_chunks must be >= 1 (inner chunks per shard), got {shard_chunks}")
    return min(int(shard_chunks) * chunk_rows, -(-rows // chunk_rows) * chunk_rows)
