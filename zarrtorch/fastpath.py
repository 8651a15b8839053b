"""Decode chunks straight from their stored bytes in the common case: no sharding, bytes + zstd.

Zarr's general read path sends every read through its asyncio loop and copies the decoded chunk into a
new output array. For the loader's one-chunk reads that overhead was about a fifth of the decode itself
(``benchmarks/README.md``). When an array is stored the simple way, the loader reads the chunk's bytes (a
local file, or one request with a deadline and retries for a remote store, :mod:`zarrtorch.fetch`) and
decodes them straight into the array it returns; any other array (sharding, other codecs, Zarr v2) is read
through zarr as usual.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BytesCodec, ZstdCodec

from zarrtorch.fetch import RetryPolicy, get_bytes


def direct_decoder(arr: zarr.Array, policy: RetryPolicy | None = None) -> Callable[..., np.ndarray] | None:
    """A function decoding one chunk (given its store key, and optionally its bytes fetched already) into a
    fresh full-chunk array, or ``None`` when ``arr`` is not stored in the simple layout this shortcut
    understands."""
    store = arr.store_path.store
    if getattr(arr, "shards", None) is not None:
        return None
    if getattr(arr.metadata, "zarr_format", None) != 3:
        return None
    codecs = tuple(arr.metadata.codecs)
    if len(codecs) != 2 or not isinstance(codecs[0], BytesCodec) or not isinstance(codecs[1], ZstdCodec):
        return None
    dtype = np.dtype(arr.dtype)
    endian = getattr(codecs[0].endian, "value", codecs[0].endian)
    if dtype.itemsize > 1 and endian != sys.byteorder:
        return None
    if dtype.hasobject or dtype.kind in "UOSV":
        return None
    shape = tuple(arr.chunks)
    zstd = numcodecs.Zstd()
    read = _local_reader(store) if isinstance(store, zarr.storage.LocalStore) else _remote_reader(store, policy)

    def decode(key: str, raw: bytes | None = None) -> np.ndarray:
        if raw is None:
            raw = read(key)  # FileNotFoundError for a missing chunk: the caller names it
        out = np.empty(shape, dtype=dtype)
        zstd.decode(raw, out=out)
        return out

    return decode


def _local_reader(store: zarr.storage.LocalStore) -> Callable[[str], bytes]:
    root = Path(str(store.root))
    return lambda key: (root / key).read_bytes()


def _remote_reader(store, policy: RetryPolicy | None) -> Callable[[str], bytes]:
    policy = policy or RetryPolicy()
    return lambda key: get_bytes(store, key, policy)
