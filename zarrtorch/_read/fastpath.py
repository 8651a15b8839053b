"""Decode chunks straight from their stored bytes in the common case: no sharding, bytes + zstd.

Zarr's general read path sends every read through its asyncio loop and copies the decoded chunk into a
new output array, an overhead measured against the decode itself in ``benchmarks/README.md``. When an
array is stored the simple way, the loader reads the chunk's bytes (a local file, or one request with a
deadline and retries for a remote store, :mod:`zarrtorch._read.fetch`) and decodes them straight into the
array it returns; any other array (sharding, other codecs, Zarr v2) is read through zarr's codecs
(:mod:`zarrtorch._read.chunks`).
"""

from __future__ import annotations

import math
import mmap
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BytesCodec, ZstdCodec

from zarrtorch._read.fetch import RetryPolicy, get_bytes
from zarrtorch._util.pool import Pools


def _simple(arr: zarr.Array) -> bool:
    """Whether ``arr`` is stored the way the shortcut understands: Zarr v3, no sharding, bytes (native
    order) + zstd, a plain numeric dtype."""
    if getattr(arr, "shards", None) is not None or getattr(arr.metadata, "zarr_format", None) != 3:
        return False
    codecs = tuple(arr.metadata.codecs)
    if len(codecs) != 2 or not isinstance(codecs[0], BytesCodec) or not isinstance(codecs[1], ZstdCodec):
        return False
    dtype = np.dtype(arr.dtype)
    endian = getattr(codecs[0].endian, "value", codecs[0].endian)
    return not (dtype.itemsize > 1 and endian != sys.byteorder) and not (dtype.hasobject or dtype.kind in "UOSV")


def read_buffer_bytes(arr: zarr.Array) -> int:
    """Bytes of the buffer each reading thread keeps for ``arr``'s chunk files (0 when chunks are not read
    through one): the largest a zstd frame of one chunk can be, so it is never reallocated."""
    return _largest_frame(arr) if _in_files(arr) and _simple(arr) else 0


def _in_files(arr: zarr.Array) -> bool:
    """Whether ``arr``'s chunks are files this process opens (a local store, not one in memory)."""
    return isinstance(arr.store_path.store, zarr.storage.LocalStore)


def _largest_frame(arr: zarr.Array) -> int:
    n = math.prod(arr.chunks) * np.dtype(arr.dtype).itemsize
    return n + (n >> 8) + max(0, (128 << 10) - n) // 2048 + (64 << 10)  # ZSTD_COMPRESSBOUND + headers


def direct_decoder(
    arr: zarr.Array, policy: RetryPolicy | None = None, pools: Pools | None = None
) -> Callable[..., np.ndarray] | None:
    """A function decoding one chunk (given its store key, and optionally its bytes fetched already) into
    ``into`` where given (a whole chunk's C-contiguous array) or a full-chunk array from a pool
    (:mod:`zarrtorch._util.pool`: reused once nothing references it), and returning it; ``None`` when ``arr``
    is not stored in the simple layout this shortcut understands."""
    if not _simple(arr):
        return None
    store = arr.store_path.store
    zstd = numcodecs.Zstd()
    read = _local_reader(store, _largest_frame(arr)) if _in_files(arr) else _remote_reader(store, policy)
    chunk_buffer = (pools or Pools()).chunks(tuple(arr.chunks), np.dtype(arr.dtype))

    shape, dtype = tuple(arr.chunks), np.dtype(arr.dtype)

    def decode(key: str, raw: bytes | None = None, into: np.ndarray | None = None) -> np.ndarray:
        if raw is None:
            raw = read(key)  # FileNotFoundError for a missing chunk: the caller names it
        fits = into is not None and into.shape == shape and into.dtype == dtype and into.flags.c_contiguous
        out = into if fits else chunk_buffer()
        size = frame_content_size(raw)
        if size is None:  # a frame that does not state its size (written by a streaming compressor)
            decoded = zstd.decode(raw)
            _check_size(len(decoded), out)
            out.reshape(-1).view(np.uint8)[:] = np.frombuffer(decoded, np.uint8)
            return out
        _check_size(size, out)  # zstd would fill a larger buffer only in part, and leave the rest as it was
        zstd.decode(raw, out=out)
        return out

    return decode


ZSTD_MAGIC = 0xFD2FB528


def frame_content_size(raw) -> int | None:
    """The decoded size a zstd frame states in its header (RFC 8878, section 3.1.1.1), or ``None`` when it
    does not state one. Raises ``ValueError`` for bytes that do not start with a zstd frame header."""
    head = bytes(raw[:18])
    if len(head) < 6 or int.from_bytes(head[:4], "little") != ZSTD_MAGIC:
        raise ValueError(f"it does not start with a zstd frame ({len(raw)} bytes, first ones {head[:4].hex()})")
    descriptor = head[4]
    fcs_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    at = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]  # after the window and dictionary fields
    width = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if width == 0:
        return None
    if len(head) < at + width:
        raise ValueError(f"its zstd frame header is cut short ({len(raw)} bytes)")
    value = int.from_bytes(head[at : at + width], "little")
    return value + 256 if width == 2 else value


def _check_size(size: int, out: np.ndarray) -> None:
    if size != out.nbytes:
        raise ValueError(
            f"its zstd frame decodes to {size} bytes where the chunk holds {out.nbytes} ({tuple(out.shape)} "
            f"{out.dtype}): the chunk is damaged, or was written for another shape or data type"
        )


def _local_reader(store: zarr.storage.LocalStore, size: int) -> Callable[[str], memoryview]:
    """Reads a chunk file into a buffer of the calling thread's, reused for its next chunk (the bytes are
    decoded before that thread reads again). The buffer is mapped memory of ``size`` bytes (the largest a
    chunk file can be): only the pages a file fills become resident, it is never reallocated, and it is
    unmapped when the thread ends, not kept by the C allocator."""
    root = str(Path(str(store.root))) + os.sep
    mine = threading.local()

    def read(key: str) -> memoryview:
        fd = os.open(root + key, os.O_RDONLY)  # no file object: half the cost of open() for a 32 KiB chunk
        try:
            need = os.fstat(fd).st_size
            if len(getattr(mine, "buffer", b"")) < need:
                mine.buffer = mmap.mmap(-1, max(size, need))
            view = memoryview(mine.buffer)[:need]
            got = os.readv(fd, [view])
        finally:
            os.close(fd)
        return view[:got]

    return read


def _remote_reader(store, policy: RetryPolicy | None) -> Callable[[str], bytes]:
    policy = policy or RetryPolicy()
    return lambda key: get_bytes(store, key, policy)
