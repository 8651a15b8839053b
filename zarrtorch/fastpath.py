"""Decode chunks straight from their stored bytes in the common case: no sharding, bytes + zstd.

Zarr's general read path sends every read through its asyncio loop and copies the decoded chunk into a
new output array. For the loader's one-chunk reads that overhead was about a fifth of the decode itself
(``benchmarks/README.md``). When an array is stored the simple way, the loader reads the chunk's bytes (a
local file, or one request with a deadline and retries for a remote store, :mod:`zarrtorch.fetch`) and
decodes them straight into the array it returns; any other array (sharding, other codecs, Zarr v2) is read
through zarr as usual.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BytesCodec, ZstdCodec

from zarrtorch.fetch import RetryPolicy, get_bytes
from zarrtorch.pool import Pools


def direct_decoder(
    arr: zarr.Array, policy: RetryPolicy | None = None, pools: Pools | None = None
) -> Callable[..., np.ndarray] | None:
    """A function decoding one chunk (given its store key, and optionally its bytes fetched already) into a
    full-chunk array from a pool (:mod:`zarrtorch.pool`: reused once nothing references it), or ``None``
    when ``arr`` is not stored in the simple layout this shortcut understands."""
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
    chunk_buffer = (pools or Pools()).chunks(shape, dtype)

    def decode(key: str, raw: bytes | None = None) -> np.ndarray:
        if raw is None:
            raw = read(key)  # FileNotFoundError for a missing chunk: the caller names it
        out = chunk_buffer()
        zstd.decode(raw, out=out)
        return out

    return decode


def _local_reader(store: zarr.storage.LocalStore) -> Callable[[str], memoryview]:
    """Reads a chunk file into a buffer of the calling thread's, reused for its next chunk (the bytes are
    decoded before that thread reads again)."""
    root = Path(str(store.root))
    mine = threading.local()

    def read(key: str) -> memoryview:
        with open(root / key, "rb", buffering=0) as fh:
            size = os.fstat(fh.fileno()).st_size
            if len(getattr(mine, "buffer", b"")) < size:
                mine.buffer = bytearray(size)  # grows to the thread's largest chunk file
            view = memoryview(mine.buffer)[:size]
            got = fh.readinto(view)
        return view[:got]

    return read


def _remote_reader(store, policy: RetryPolicy | None) -> Callable[[str], bytes]:
    policy = policy or RetryPolicy()
    return lambda key: get_bytes(store, key, policy)
