"""How and where :func:`zarrtorch.prepare_zarr` writes: codecs, the chunk length, and the target store, a
local path or a URL (``s3://...`` with fsspec ``storage_options``), so that preparation can run on a
cluster and write straight to object storage."""

from __future__ import annotations

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
    if chunk_mb <= 0:
        raise ValueError(f"chunk_mb must be > 0, got {chunk_mb}")
    return max(1, int(chunk_mb * 2**20 // max(1, row_bytes)))


def is_url(store) -> bool:
    return isinstance(store, str) and "://" in store and not store.startswith("file://")


def target_store(store: str | os.PathLike, storage_options: dict | None, overwrite: bool):
    """What zarr and xarray write to: the local path, or an fsspec store for a URL. An existing store is
    replaced only with ``overwrite``."""
    if not is_url(store):
        if storage_options:
            raise ValueError(f"storage_options apply to a URL (s3://...), not to the local path {store}")
        path = Path(os.fspath(store).removeprefix("file://"))
        if path.exists():
            if not overwrite:
                raise FileExistsError(f"{path} exists: pass overwrite=True to replace it, or choose another path")
            shutil.rmtree(path)
        return str(path)
    remote = zarr.storage.FsspecStore.from_url(store, storage_options=storage_options, read_only=False)
    fs, path = remote.fs, remote.path
    exists = fs.exists(path) if not fs.async_impl else zarr.core.sync.sync(fs._exists(path))
    if exists:
        if not overwrite:
            raise FileExistsError(f"{store} exists: pass overwrite=True to replace it, or choose another URL")
        zarr.core.sync.sync(remote.delete_dir(""))
    return remote


def shard_shape(chunk_rows: int, shard_chunks: int | None, rows: int) -> int | None:
    """Rows per shard (``shard_chunks`` inner chunks), or ``None`` for no sharding."""
    if shard_chunks is None:
        return None
    if int(shard_chunks) < 1:
        raise ValueError(f"shard_chunks must be >= 1 (inner chunks per shard), got {shard_chunks}")
    return min(int(shard_chunks) * chunk_rows, -(-rows // chunk_rows) * chunk_rows)
