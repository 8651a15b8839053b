"""Decode chunks straight from local files in the common case: local store, no sharding, bytes + zstd.

Zarr's general read path sends every read through its asyncio loop and copies the decoded chunk into a
new output array. For the loader's one-chunk reads that overhead was about a fifth of the decode itself
(``benchmarks/README.md``). When an array is stored the simple way, the loader reads the chunk file and
decodes it straight into the array it returns; any other array (remote store, sharding, other codecs,
Zarr v2) is read through zarr as usual.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BytesCodec, ZstdCodec


def direct_decoder(arr: zarr.Array) -> Callable[[str], np.ndarray] | None:
    """A function decoding one chunk (given its store key) into a fresh full-chunk array, or ``None``
    when ``arr`` is not stored in the simple layout this shortcut understands."""
    store = arr.store_path.store
    if not isinstance(store, zarr.storage.LocalStore) or getattr(arr, "shards", None) is not None:
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
    root = Path(str(store.root))
    shape = tuple(arr.chunks)
    zstd = numcodecs.Zstd()

    def decode(key: str) -> np.ndarray:
        raw = (root / key).read_bytes()  # FileNotFoundError for a missing chunk: the caller names it
        out = np.empty(shape, dtype=dtype)
        zstd.decode(raw, out=out)
        return out

    return decode
