"""Decode chunks straight from their stored bytes for every common layout; the rest through zarr's codecs.

Zarr's general read path sends every read through its asyncio loop and copies the decoded chunk into a new
output array, an overhead measured against the decode itself in ``benchmarks/README.md`` (about 4x per window
on 2 cores). For the layouts most stores have, the loader reads each chunk's bytes itself (a local file, or one
request with a deadline and retries for a remote store, :mod:`zarrtorch._read.fetch`) and decodes them in the
reading thread straight into the array it returns, with codecs that release the GIL:

* Zarr v2 (C order, no filters) and Zarr v3 (the bytes codec, no array-to-array codec);
* no compressor, zstd, Blosc (any of its compressors and shuffles), gzip, zlib (v2), each optionally followed by
  Zarr v3's ``crc32c`` checksum codec (checked here, before the decode: :mod:`zarrtorch._read.checksum`);
* stored in either byte order: a big-endian array is byte-swapped into this machine's order, as a tensor needs;
* Zarr v3 shards whose inner chunks span the other axes (any of the codecs above inside): the shard's index is
  read once and cached (:data:`SHARD_INDEX_CACHE_BYTES` per process), and the inner chunks a piece needs are
  read by byte range, one read per run of them stored one after the other (a piece that needs every inner
  chunk of a shard whose index is not cached yet reads the whole shard: one request, not two).

Anything else (filters such as delta or fixedscaleoffset, F order, object or string dtypes, other codecs, nested
shards) is read through zarr's codecs (:mod:`zarrtorch._read.chunks`);
:func:`read_path_text` says which path an array takes and why (``audit`` and ``roofline`` print it).
Every check zarr's path makes holds here too: a chunk that does not decode to exactly its bytes, a frame
followed by other bytes, a wrong checksum (crc32c, zstd's, gzip's, zlib's), a shard index that points outside the
shard or lacks an inner chunk is a ``ValueError`` the reader names (:class:`zarrtorch._read.reader.ChunkReadError`).
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import struct
import sys
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, ZstdCodec

from zarrtorch._compat.numcodecs import blosc_decompressor, blosc_decompressor_at
from zarrtorch._compat.zarr import NO_INNER_CHUNK, chunk_spec, decode_shard_index, shard_index_size
from zarrtorch._read.checksum import shard_index_checksum_mismatch, without_crc32c, zstd_checksum_mismatch
from zarrtorch._read.chunks import missing_inner_message
from zarrtorch._read.fetch import RetryPolicy, get_bytes
from zarrtorch._util.pool import Pools
from zarrtorch._util.sizes import ceil_div, native

# -- which arrays are read directly, and how ---------------------------------------------------------------


@dataclass(frozen=True)
class Shards:
    """How a sharded array's shards hold their inner chunks, as the direct reader reads them: ``per_shard``
    inner chunks of ``inner_rows`` rows along the first axis (each spanning the other axes), an index of
    ``index_bytes`` at the shard's start or end, decoded with ``codec`` and ``spec`` (zarr's own index codecs)."""

    inner_rows: int
    per_shard: int
    index_bytes: int
    index_at_start: bool
    codec: ShardingCodec
    spec: object


@dataclass(frozen=True)
class DirectLayout:
    """An array the direct reader decodes: ``compressor`` (``"zstd"``, ``"blosc"``, ``"gzip"``, ``"zlib"`` or
    ``"none"``, described as ``detail``), the ``stored`` dtype and ``byteswap`` when it is not this machine's
    byte order, one compressed unit of ``unit_shape`` (the chunk, or a shard's inner chunk), ``shards`` or None;
    ``crc32c``: each unit's bytes end with a ``crc32c`` codec's checksum of them, checked before the decode."""

    zarr_format: int
    compressor: str
    detail: str
    dtype: np.dtype  # decoded into: the stored dtype in this machine's byte order
    byteswap: bool
    unit_shape: tuple[int, ...]
    shards: Shards | None = None
    crc32c: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        """The decoded shape of one stored object: a chunk, or a shard."""
        if self.shards is None:
            return self.unit_shape
        return (self.shards.inner_rows * self.shards.per_shard, *self.unit_shape[1:])

    @property
    def unit_bytes(self) -> int:
        return math.prod(self.unit_shape) * self.dtype.itemsize

    def text(self) -> str:
        """``direct (v2, blosc lz4 shuffle)``, as ``audit`` and ``roofline`` print it."""
        fmt = f"v{self.zarr_format}"
        if self.shards is not None:
            rows = self.shards.inner_rows
            fmt += f" sharded, {self.shards.per_shard} inner chunks of {rows} row{'s' * (rows != 1)} per shard"
        order = ", big-endian, byte-swapped" if self.byteswap and sys.byteorder == "little" else ""
        order = ", little-endian, byte-swapped" if self.byteswap and sys.byteorder == "big" else order
        crc = ", crc32c" if self.crc32c else ""
        return f"direct ({fmt}, {self.detail}{crc}{order})"


def read_path(arr: zarr.Array) -> DirectLayout | str:
    """How ``arr`` is read directly (:class:`DirectLayout`), or why it goes through zarr's codecs (a reason,
    ``"filter Delta not read directly"``)."""
    dtype = np.dtype(arr.dtype)
    if dtype.hasobject or dtype.kind in "UOSVT" or dtype.fields is not None:
        return f"dtype {dtype} not read directly"
    if arr.metadata.zarr_format == 2:
        return _v2_path(arr, dtype)
    return _v3_path(arr, dtype)


def read_path_text(arr: zarr.Array) -> str:
    """One line saying how ``arr``'s chunks are read: ``direct (v2, blosc lz4 shuffle)``, or ``zarr's path:
    filter Delta not read directly``."""
    layout = read_path(arr)
    return layout.text() if isinstance(layout, DirectLayout) else f"zarr's path: {layout}"


def _v2_path(arr: zarr.Array, dtype: np.dtype) -> DirectLayout | str:
    meta = arr.metadata
    if meta.order != "C":
        return f"order {meta.order} (column-major chunks) not read directly"
    if meta.filters:
        return f"filter {_name(meta.filters[0])} not read directly"
    found = _compressor(meta.compressor)
    if isinstance(found, str):
        return found
    swap = dtype.itemsize > 1 and not dtype.isnative and dtype.byteorder != "|"
    return DirectLayout(2, *found, native(dtype), swap, tuple(arr.chunks))


def _v3_path(arr: zarr.Array, dtype: np.dtype) -> DirectLayout | str:
    codecs = tuple(arr.metadata.codecs)
    shards = None
    if codecs and isinstance(codecs[0], ShardingCodec):
        if len(codecs) > 1 or arr.shards is None:  # zarr then reads the shard as one chunk, decoded whole
            after = " + ".join(_name(c) for c in codecs[1:])
            return f"a sharding codec followed by {after} (a shard compressed again whole) not read directly"
        shards = _shards(arr, codecs[0])
        if isinstance(shards, str):
            return shards
        codecs = tuple(codecs[0].codecs)
        if codecs and isinstance(codecs[0], ShardingCodec):
            return "nested shards (inner chunks sharded again) not read directly"
    if not codecs or not isinstance(codecs[0], BytesCodec):
        return f"codec {_name(codecs[0]) if codecs else 'none'} not read directly"
    crc32c = isinstance(codecs[-1], Crc32cCodec)
    codecs = codecs[:-1] if crc32c else codecs
    if len(codecs) > 2:
        return f"codecs {' + '.join(_name(c) for c in codecs[1:])} not read directly (one compressor at most)"
    found = _compressor(codecs[1] if len(codecs) == 2 else None)
    if isinstance(found, str):
        return found
    endian = getattr(codecs[0].endian, "value", codecs[0].endian)
    swap = dtype.itemsize > 1 and endian is not None and endian != sys.byteorder
    return DirectLayout(3, *found, native(dtype), swap, tuple(arr.chunks), shards, crc32c)


def _shards(arr: zarr.Array, codec: ShardingCodec) -> Shards | str:
    inner, shard = tuple(arr.chunks), tuple(arr.shards)
    if inner[1:] != shard[1:]:
        return f"inner chunks {inner} split a shard {shard} along another axis than the first: not read directly"
    spec = chunk_spec(arr, (0,) * arr.ndim)
    return Shards(
        inner_rows=int(inner[0]),
        per_shard=int(shard[0] // inner[0]),
        index_bytes=int(shard_index_size(codec, spec)),
        index_at_start=getattr(codec.index_location, "value", codec.index_location) == "start",
        codec=codec,
        spec=spec,
    )


_SHUFFLES = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle", -1: "autoshuffle"}


def _compressor(codec) -> tuple[str, str] | str:
    """``(compressor, detail)`` of a Zarr v2 compressor or a v3 bytes-to-bytes codec (``None``: none), or the
    reason it is not read directly."""
    if codec is None:
        return "none", "no compressor"
    if isinstance(codec, (numcodecs.Zstd, ZstdCodec)):
        return "zstd", "zstd"
    if isinstance(codec, (numcodecs.GZip, GzipCodec)):
        return "gzip", "gzip"
    if isinstance(codec, numcodecs.Zlib):
        return "zlib", "zlib"
    if isinstance(codec, numcodecs.Blosc):
        return "blosc", f"blosc {codec.cname} {_SHUFFLES.get(codec.shuffle, codec.shuffle)}"
    if isinstance(codec, BloscCodec):
        cname, shuffle = (getattr(v, "value", v) for v in (codec.cname, codec.shuffle))
        return "blosc", f"blosc {cname} {shuffle}"
    return f"{'compressor' if isinstance(codec, numcodecs.abc.Codec) else 'codec'} {_name(codec)} not read directly"


def _name(codec) -> str:
    """A codec's name as a message says it: ``Delta``, ``Transpose``, ``Crc32c``."""
    return type(codec).__name__.removesuffix("Codec") or str(codec)


# -- one compressed unit (a chunk, an inner chunk) into its destination's bytes --------------------------


def _unzstd(raw, dest: np.ndarray) -> None:
    """zstd checks a frame's content checksum (when it has one) itself; its error is said as a checksum's."""
    try:
        _unzstd_frame(raw, dest)
    except RuntimeError as exc:
        mismatch = zstd_checksum_mismatch(exc)
        if mismatch is None:
            raise
        raise mismatch from None


def _unzstd_frame(raw, dest: np.ndarray) -> None:
    size = frame_content_size(raw)
    if size is None:  # a frame that does not state its size (written by a streaming compressor)
        decoded = _ZSTD.decode(raw)
        _check_size(len(decoded), dest, "zstd frame")
        dest[:] = np.frombuffer(decoded, np.uint8)
        return
    _check_size(size, dest, "zstd frame")  # zstd would fill a larger buffer only in part, and leave the rest
    _ZSTD.decode(raw, out=dest)


_BLOSC_SIZES = struct.Struct("<4xI4xI")  # a Blosc header's decoded size (bytes 4-8) and stored size (12-16)


def _unblosc(raw, dest: np.ndarray) -> None:
    """Blosc fills a larger destination only in part and ignores bytes after its frame: its header (the
    decoded and the stored sizes) is checked against both first."""
    _check_blosc_header(raw, len(raw), dest.nbytes)
    # c-blosc's one-thread decode itself, not ``Blosc().decode`` (checks of the buffers' types) nor numcodecs'
    # ``decompress`` (a check of the process and a lock): their Python is twice the decode of a 4 KiB chunk
    _BLOSC_DECOMPRESS(raw, dest)


def _check_blosc_header(raw, stored: int, nbytes: int) -> None:
    """A Blosc frame's header, at the start of ``raw`` (``stored`` bytes of it were read), states ``stored`` bytes
    and ``nbytes`` decoded bytes (the chunk's), or the chunk is refused."""
    if stored < 16:
        raise ValueError(f"it holds {stored} bytes, fewer than a Blosc header (16)")
    decoded, framed = _BLOSC_SIZES.unpack_from(raw)  # one call: two int.from_bytes of slices cost 12x more
    if framed != stored:
        raise ValueError(f"its Blosc frame says {framed} bytes, the stored chunk has {stored}: it is damaged")
    _check_nbytes(decoded, nbytes, "Blosc frame")


def _inflater(wbits: int, what: str) -> Callable[[object, np.ndarray], None]:
    """A decoder of one deflate stream (``wbits``: gzip's wrapper, 31, or zlib's, 15), checked to end exactly
    where the chunk's bytes end and to hold exactly the chunk (zlib's checksum or gzip's CRC and length are
    checked by zlib itself). Python's zlib inflates without the GIL; the one copy into ``dest`` is a memcpy."""

    def inflate(raw, dest: np.ndarray) -> None:
        stream = zlib.decompressobj(wbits)
        try:
            decoded = stream.decompress(raw, dest.nbytes + 1)  # no more than the chunk and a byte: a bomb stops
        except zlib.error as exc:
            raise ValueError(f"its {what} stream does not decode ({exc})") from None
        if not stream.eof:
            raise ValueError(f"its {what} stream is cut short (it decodes to {len(decoded)} bytes or more, no end)")
        _check_size(len(decoded), dest, f"{what} stream")
        if stream.unused_data:
            raise ValueError(f"{len(stream.unused_data)} bytes follow its {what} stream: the chunk is damaged")
        dest[:] = np.frombuffer(decoded, np.uint8)

    return inflate


def _uncompressed(raw, dest: np.ndarray) -> None:
    _check_size(len(raw), dest, "stored chunk (no compressor)")
    dest[:] = np.frombuffer(raw, np.uint8)


_ZSTD = numcodecs.Zstd()
_BLOSC_DECOMPRESS = blosc_decompressor()
_BLOSC_DECOMPRESS_AT = blosc_decompressor_at()
UNPACK: dict[str, Callable[[object, np.ndarray], None]] = {
    "zstd": _unzstd,
    "blosc": _unblosc,
    "gzip": _inflater(31, "gzip"),
    "zlib": _inflater(15, "zlib"),
    "none": _uncompressed,
}


def unpacker(layout: DirectLayout) -> Callable[[object, np.ndarray], None]:
    """The decoder of one of ``layout``'s compressed units, checking its crc32c first where it ends with one."""
    unpack = UNPACK[layout.compressor]
    if not layout.crc32c:
        return unpack
    return lambda raw, dest: unpack(without_crc32c(raw), dest)


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


def to_native_order(decoded: np.ndarray) -> None:
    """Byte-swap ``decoded`` (this machine's dtype, holding the bytes of the other byte order) in place. A cast
    from the other order: numpy casts without the GIL, where ``ndarray.byteswap`` holds it for the whole array
    (``benchmarks/layouts.py`` measures both)."""
    np.copyto(decoded, decoded.view(decoded.dtype.newbyteorder()))


def _check_size(size: int, dest: np.ndarray, what: str) -> None:
    _check_nbytes(size, dest.nbytes, what)


def _check_nbytes(size: int, nbytes: int, what: str) -> None:
    if size != nbytes:
        raise ValueError(
            f"its {what} decodes to {size} bytes where the chunk holds {nbytes}: the chunk is damaged, or "
            "was written for another shape or data type"
        )


# -- the bytes each reading thread holds ----------------------------------------------------------------------


def largest_stored(nbytes: int, units: int = 1) -> int:
    """The most bytes ``units`` compressed units holding ``nbytes`` decoded bytes together can take: what any of
    the codecs read directly may add (``ZSTD_COMPRESSBOUND``, Blosc's 16-byte header, deflate's 5 bytes per
    stored block and gzip's header), with room for headers."""
    return nbytes + (nbytes >> 8) + units * (max(0, (128 << 10) - nbytes // max(1, units)) // 2048 + 64) + (64 << 10)


def read_buffer_bytes(arr: zarr.Array) -> int:
    """Bytes of the buffer each reading thread keeps for ``arr``'s chunk files (0 when none is kept: a store not
    on this machine's file system, an array read through zarr, or chunks stored uncompressed, read straight into
    the array returned): the largest a chunk can be stored, or a whole shard (read at once when a piece needs every
    inner chunk of it and its index is not cached yet)."""
    layout = read_path(arr)
    if not _in_files(arr) or not isinstance(layout, DirectLayout):
        return 0
    if layout.shards is None:
        return 0 if _read_into(layout) else largest_stored(layout.unit_bytes)
    shards = layout.shards
    return largest_stored(layout.unit_bytes * shards.per_shard, shards.per_shard) + shards.index_bytes


def shard_index_cache_bytes(arr: zarr.Array) -> int:
    """The most bytes the shard indexes of ``arr`` take in this process's cache (:data:`SHARD_INDEX_CACHE_BYTES`
    for all arrays together at most)."""
    layout = read_path(arr)
    if not isinstance(layout, DirectLayout) or layout.shards is None:
        return 0
    shards = ceil_div(int(arr.shape[0]), layout.shape[0])
    return min(SHARD_INDEX_CACHE_BYTES, shards * _index_entry_bytes(layout.shards.per_shard))


def _read_into(layout: DirectLayout) -> bool:
    """Whether a local chunk file of ``layout`` is read straight into the decoded array: stored as it is decoded,
    with no checksum after it."""
    return layout.compressor == "none" and not layout.crc32c and layout.shards is None


def _in_files(arr: zarr.Array) -> bool:
    """Whether ``arr``'s chunks are files this process opens (a local store, not one in memory)."""
    return isinstance(arr.store_path.store, zarr.storage.LocalStore)


# -- the decoders the reader calls -------------------------------------------------------------------------


Decoder = Callable[..., np.ndarray]


class Span(NamedTuple):
    """Rows ``[start, stop)`` of a chunk (or shard) counted from its first row, which holds ``held`` rows of the
    array (fewer than its shape in the array's last chunk): what a shard's reader needs to tell a piece of the
    whole shard (read at once) from a part of it (read by byte range)."""

    start: int
    stop: int
    held: int


def direct_decoder(
    arr: zarr.Array, policy: RetryPolicy | None = None, pools: Pools | None = None, *, check_missing: bool = True
) -> Decoder | None:
    """A function decoding one chunk (or shard) of ``arr``, ``decode(key, raw=None, into=None, rows=None)``:
    given its store key, and optionally its bytes fetched already, it decodes into ``into`` where given (a whole
    chunk's C-contiguous array of the decoded dtype) or into a full-chunk array from a pool
    (:mod:`zarrtorch._util.pool`: reused once nothing references it; a new array for a chunk under
    :data:`~zarrtorch._util.pool.POOLED_CHUNK_BYTES`), and returns it. ``rows``
    (:class:`Span`): the rows the caller needs; a shard reads only the inner chunks holding them (the others' rows
    are left as they were), a missing one is an error with ``check_missing``, else the fill value. ``None`` when
    ``arr`` is read through zarr's codecs (:func:`read_path`)."""
    layout = read_path(arr)
    if not isinstance(layout, DirectLayout):
        return None
    pools = pools or Pools()
    if layout.shards is not None:
        return _ShardDecoder(arr, layout, policy, pools, check_missing).decode
    return _chunk_decoder(arr, layout, policy, pools)


def _fits(into: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> bool:
    return into is not None and into.shape == shape and into.dtype == dtype and into.flags.c_contiguous


def _bytes_of(out: np.ndarray) -> np.ndarray:
    """A C-contiguous array's memory as flat bytes (a view)."""
    return out.reshape(-1).view(np.uint8)


def _chunk_decoder(arr: zarr.Array, layout: DirectLayout, policy: RetryPolicy | None, pools: Pools) -> Decoder:
    store, shape, dtype = arr.store_path.store, layout.shape, layout.dtype
    unpack, swap = unpacker(layout), layout.byteswap
    chunk_buffer = pools.chunks(shape, dtype)
    local = _in_files(arr)
    read = _local_reader(store, largest_stored(layout.unit_bytes)) if local else _remote_reader(store, policy)
    read_into = _local_reader_into(store) if local and _read_into(layout) else None
    fused = local and layout.compressor == "blosc" and not layout.crc32c and _BLOSC_DECOMPRESS_AT is not None
    read_unblosc = _local_blosc_reader(store, largest_stored(layout.unit_bytes), read) if fused else None

    def decode(key: str, raw=None, into: np.ndarray | None = None, rows=None) -> np.ndarray:
        out = into if _fits(into, shape, dtype) else chunk_buffer()
        if raw is None and read_unblosc is not None:  # a local Blosc chunk: read and decoded in one step
            read_unblosc(key, out)
        elif raw is None and read_into is not None:  # stored as it is decoded: read straight into the array
            read_into(key, _bytes_of(out))
        else:  # a missing chunk: FileNotFoundError, named by the caller
            unpack(read(key) if raw is None else raw, _bytes_of(out))
        if swap:
            to_native_order(out)
        return out

    return decode


# -- shards: the index read once, inner chunks by byte range ----------------------------------------------


SHARD_INDEX_CACHE_BYTES = 16 << 20  # shard indexes one process keeps, all arrays together (LRU beyond)
_INDEX_ENTRY_OVERHEAD = 256  # a cached index's Python objects: its array's header, the key, the dict's entry


def _index_entry_bytes(per_shard: int) -> int:
    """A cached index's bytes: its decoded ``(offset, length)`` per inner chunk, and as many again in the key of a
    local file's (its stored bytes, :meth:`_ShardSource.cache_key`)."""
    return 2 * 16 * per_shard + _INDEX_ENTRY_OVERHEAD


class _IndexCache:
    """Shard indexes, ``(offset, length)`` per inner chunk, by :meth:`_ShardSource.cache_key`, least recently used
    dropped past :data:`SHARD_INDEX_CACHE_BYTES`. The process's (:data:`SHARD_INDEXES`) starts
    afresh in a forked child: a lock held by a parent's thread at the fork would never be released there."""

    def __init__(self, most: int = SHARD_INDEX_CACHE_BYTES):
        self.most = most
        self.reset()

    def reset(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict = OrderedDict()
        self.nbytes = 0

    def get(self, key) -> np.ndarray | None:
        with self._lock:
            index = self._entries.get(key)
            if index is not None:
                self._entries.move_to_end(key)
            return index

    def put(self, key, index: np.ndarray) -> None:
        size = _index_entry_bytes(len(index))
        with self._lock:
            if key in self._entries or size > self.most:
                return
            self._entries[key] = index
            self.nbytes += size
            while self.nbytes > self.most:
                _, old = self._entries.popitem(last=False)
                self.nbytes -= _index_entry_bytes(len(old))

    def forget(self, key) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= _index_entry_bytes(len(old))


SHARD_INDEXES = _IndexCache()
os.register_at_fork(after_in_child=SHARD_INDEXES.reset)


class _ShardSource:
    """One shard's bytes, read by byte range: a local file (opened once for the shard's reads), a remote object
    (a request with the policy's deadline and retries per range), or bytes given whole."""

    def __init__(
        self, store, root: str | None, key: str, raw, policy: RetryPolicy | None, buffer: Callable, scope: object
    ):
        self.store, self.key, self.raw, self.policy, self._buffer = store, key, raw, policy, buffer
        self.scope = scope  # the decoder reading it (its token): what a shard with no file version keys its index by
        self.fd, self.size = None, None
        self.stored_index: bytes | None = None  # the index's stored bytes, once read (a local file's key holds them)
        if raw is not None:
            self.size = len(raw)
        elif root is not None:
            self.fd = os.open(root + key, READ_FLAGS)  # FileNotFoundError for a missing shard: the caller names it
            self.size = os.fstat(self.fd).st_size

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def cache_key(self, shards: Shards) -> tuple:
        """The key of the shard's index in :data:`SHARD_INDEXES`. A local file's is its index's stored bytes, read
        again at every decode (one small read; the cache saves decoding them): a file's size and time do not tell
        a shard written again within the file system's time resolution, or copied with its time kept (``cp -p``,
        ``rsync -t``), and an old index read the new inner chunks at their old offsets. A shard in memory or on a
        server has no version to tell one written again under the same key (a store's name is even reused by a
        new store in memory), and reading its index again is a request: its index holds for the decoder that read
        it only (one epoch's reader in one process), so that a dataset made after a write reads the new index, as
        zarr does."""
        if self.fd is not None:
            self.stored_index = self.read_index(shards.index_bytes, shards.index_at_start)
            return (str(self.store), self.key, self.stored_index)
        return (str(self.store), self.key, self.scope)

    def read(self, start: int, stop: int, into_buffer: bool = True):
        """Bytes ``[start, stop)`` of the shard; ``ValueError`` where the shard ends before ``stop``."""
        if self.size is not None and stop > self.size:
            raise ValueError(f"the shard's index points past its {self.size} bytes: it is cut short or damaged")
        if self.raw is not None:
            return memoryview(self.raw)[start:stop]
        if self.fd is not None:
            view = self._buffer(stop - start) if into_buffer else memoryview(bytearray(stop - start))
            got = os.preadv(self.fd, [view], start)
            got_view = view[:got]
        else:
            got_view = memoryview(_get_range(self.store, self.key, self.policy, start, stop))
        if len(got_view) != stop - start:
            raise ValueError(f"the shard ends before byte {stop} its index points to: it is cut short or damaged")
        return got_view

    def read_whole(self) -> None:
        """Read the whole shard at once (one request): its index and inner chunks are then cut from it."""
        if self.fd is not None:
            view = self._buffer(self.size)
            got = os.preadv(self.fd, [view], 0)
            self.raw, self.size = view[:got], got
        else:
            self.raw = memoryview(get_bytes(self.store, self.key, self.policy or RetryPolicy()))
            self.size = len(self.raw)

    def read_index(self, size: int, at_start: bool) -> bytes:
        if self.size is not None:
            if self.size < size:
                raise ValueError(f"the shard holds {self.size} bytes, fewer than its index alone ({size})")
            start = 0 if at_start else self.size - size
            return bytes(self.read(start, start + size, into_buffer=False))
        if at_start:
            return bytes(self.read(0, size))
        return _get_suffix(self.store, self.key, self.policy, size)


class _ShardDecoder:
    """Decodes the inner chunks of one shard a piece needs into a shard-shaped array."""

    def __init__(self, arr: zarr.Array, layout: DirectLayout, policy: RetryPolicy | None, pools: Pools, check_missing):
        self.layout, self.shards = layout, layout.shards
        self.store, self.policy, self.check_missing = arr.store_path.store, policy, check_missing
        self.fill = arr.fill_value if arr.fill_value is not None else 0
        self.chunk_buffer = pools.chunks(layout.shape, layout.dtype)
        self.unpack = unpacker(layout)
        self.root = str(Path(str(self.store.root))) + os.sep if _in_files(arr) else None
        self.buffer = _thread_buffer(read_buffer_bytes(arr)) if self.root is not None else None
        # a token, not the decoder: a cached key keeps it alive, and the decoder holds chunk buffers
        self.index_scope = object()

    def decode(self, key: str, raw=None, into: np.ndarray | None = None, rows=None) -> np.ndarray:
        shape = self.layout.shape
        out = into if _fits(into, shape, self.layout.dtype) else self.chunk_buffer()
        lo, hi, held = rows if rows is not None else Span(0, shape[0], shape[0])
        source = _ShardSource(self.store, self.root, key, raw, self.policy, self.buffer, self.index_scope)
        # a stored object's index is cached; given bytes are not
        key = source.cache_key(self.shards) if raw is None else None
        try:
            if key is not None and self._needs_all(lo, hi, held) and SHARD_INDEXES.get(key) is None:
                source.read_whole()  # one request for the index and every inner chunk, not two
            index = self._index(source, key)
            try:
                self._decode_inner(source, index, out, int(lo), int(hi))
            except (ValueError, RuntimeError):  # zstd's errors are RuntimeErrors
                if key is not None:  # the shard may have been rewritten since its index was read: read it again
                    SHARD_INDEXES.forget(key)
                raise
        finally:
            source.close()
        return out

    def _needs_all(self, lo: int, hi: int, held: int) -> bool:
        """Whether rows ``[lo, hi)`` lie in every inner chunk holding the shard's ``held`` rows."""
        inner = self.shards.inner_rows
        return lo < inner and ceil_div(hi, inner) >= ceil_div(held, inner)

    def _index(self, source: _ShardSource, key: tuple | None) -> np.ndarray:
        """The shard's ``(offset, length)`` per inner chunk along the first axis, from the cache when read before
        (``key``: its place there; ``None``, bytes given whole, not cached)."""
        shards = self.shards
        index = SHARD_INDEXES.get(key) if key is not None else None
        if index is None:
            stored = source.stored_index or source.read_index(shards.index_bytes, shards.index_at_start)
            index = _decoded_index(shards, stored)
            if key is not None:
                SHARD_INDEXES.put(key, index)
        return index

    def _decode_inner(self, source: _ShardSource, index: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:
        inner = self.shards.inner_rows
        first, last = lo // inner, ceil_div(hi, inner)
        entries = index[first:last]
        absent = entries[:, 0] == NO_INNER_CHUNK
        if absent.any() and self.check_missing:
            coords = [(first + int(i),) + (0,) * (out.ndim - 1) for i in np.nonzero(absent)[0]]
            raise ValueError(missing_inner_message(coords, self.fill))
        for i in np.nonzero(absent)[0]:
            out[(first + i) * inner : (first + i + 1) * inner] = self.fill
        present = np.nonzero(~absent)[0]
        for run in _runs(entries, present):
            start = int(entries[run[0], 0])
            stop = int(entries[run[-1], 0] + entries[run[-1], 1])
            data = source.read(start, stop)  # one read for inner chunks stored one after the other
            for i in run:
                at = int(entries[i, 0]) - start
                rows = out[(first + i) * inner : (first + i + 1) * inner]
                self.unpack(data[at : at + int(entries[i, 1])], _bytes_of(rows))
                if self.layout.byteswap:
                    to_native_order(rows)


def _decoded_index(shards: Shards, stored: bytes) -> np.ndarray:
    """A shard's ``(offset, length)`` per inner chunk, its index's checksum checked by zarr's index codecs; a
    mismatch said as a chunk's is."""
    try:
        return decode_shard_index(shards.codec, stored, shards.spec).reshape(-1, 2)
    except ValueError as exc:
        mismatch = shard_index_checksum_mismatch(exc)
        if mismatch is None:
            raise
        raise mismatch from None


def _runs(entries: np.ndarray, present: np.ndarray) -> list[list[int]]:
    """The present inner chunks (positions in ``entries``) in runs of consecutive ones whose bytes follow each
    other in the shard: each run is one read."""
    runs: list[list[int]] = []
    for i in present.tolist():
        if runs and runs[-1][-1] == i - 1 and entries[i - 1, 0] + entries[i - 1, 1] == entries[i, 0]:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


# -- reading stored objects -----------------------------------------------------------------------------


# A chunk file is opened without blocking: a named pipe (FIFO) in its place would wait in open() for a writer
# forever; so opened, it reads as empty and is refused as a damaged chunk. A regular file reads as ever.
READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)


def _private_map(size: int) -> mmap.mmap:
    """``size`` bytes of anonymous memory mapped private: a forked child gets a copy of it on its first write, where
    mmap's default (shared) would have it write the very pages its parent's thread reads chunks into."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)


def _thread_buffer(size: int) -> Callable[[int], memoryview]:
    """``buffer(n)``: ``n`` bytes of the calling thread's buffer, reused for its next read (the bytes are
    decoded before that thread reads again). Mapped memory of ``size`` bytes (the largest a read can be): only
    the pages a read fills become resident, it is never reallocated, and it is unmapped when the thread ends,
    not kept by the C allocator."""
    mine = threading.local()

    def buffer(need: int) -> memoryview:
        whole = getattr(mine, "view", None)
        if whole is None or len(whole) < need:
            mine.view = whole = memoryview(_private_map(max(size, need)))
        return whole[:need]

    return buffer


def _local_reader(store: zarr.storage.LocalStore, size: int) -> Callable[[str], memoryview]:
    """Reads a chunk file into a buffer of the calling thread's (:func:`_thread_buffer`) of ``size`` bytes, the
    most a chunk can be stored in: one read, no ``fstat`` (a system call per chunk). A file that fills the buffer
    may hold more (damaged, or written for a larger chunk): it is read again whole, at its size, so that the
    decoder sees every byte of it and refuses it."""
    root = str(Path(str(store.root))) + os.sep
    buffer = _thread_buffer(size + 1)  # a byte more than any chunk: a full buffer means a larger file

    def read(key: str) -> memoryview:
        fd = os.open(root + key, READ_FLAGS)  # no file object: half the cost of open() for a 32 KiB chunk
        try:
            view = buffer(size + 1)
            got = os.readv(fd, [view])
            if got == len(view):
                view = buffer(os.fstat(fd).st_size + 1)
                got = os.preadv(fd, [view], 0)
        finally:
            os.close(fd)
        return view[:got]

    return read


def _thread_frame(size: int) -> Callable[[], tuple[memoryview, int, object]]:
    """``frame()``: the calling thread's read buffer of ``size`` bytes (mapped memory, as :func:`_thread_buffer`'s,
    never reallocated), its address and what keeps that address valid (an export of the buffer, held with it)."""
    mine = threading.local()

    def frame() -> tuple[memoryview, int, object]:
        held = getattr(mine, "held", None)
        if held is None:
            memory = _private_map(size)
            pinned = ctypes.c_char.from_buffer(memory)
            mine.held = held = (memoryview(memory), ctypes.addressof(pinned), pinned)
        return held

    return frame


def _local_blosc_reader(
    store: zarr.storage.LocalStore, size: int, read: Callable[[str], memoryview]
) -> Callable[[str, np.ndarray], None]:
    """``read_unblosc(key, out)``: a Blosc chunk file read into the calling thread's buffer and decoded from there
    into ``out``, in one step, checked as :func:`_unblosc` checks. The work of :func:`_local_reader` and
    :func:`_unblosc` without their layers (a slice of the buffer, two exports of buffers per chunk): for a chunk of a
    few KiB, a WeatherBench2 variable's row, those cost as much as the decode. ``size``: the most a chunk can be
    stored in; a file that fills the buffer is read again whole by ``read`` and refused by the frame's checks."""
    root = str(Path(str(store.root))) + os.sep
    frame = _thread_frame(size + 1)  # a byte more than any chunk: a full buffer means a larger file

    def read_unblosc(key: str, out: np.ndarray) -> None:
        view, address, _ = frame()
        fd = os.open(root + key, READ_FLAGS)
        try:
            got = os.readv(fd, [view])
        finally:
            os.close(fd)
        if got == len(view):
            _unblosc(read(key), _bytes_of(out))
            return
        _check_blosc_header(view, got, out.nbytes)
        _BLOSC_DECOMPRESS_AT(address, out)

    return read_unblosc


def _local_reader_into(store: zarr.storage.LocalStore) -> Callable[[str, np.ndarray], None]:
    """Reads an uncompressed chunk file straight into the decoded array's bytes, refusing one of another size."""
    root = str(Path(str(store.root))) + os.sep

    def read_into(key: str, dest: np.ndarray) -> None:
        fd = os.open(root + key, READ_FLAGS)
        try:
            _check_size(os.fstat(fd).st_size, dest, "stored chunk (no compressor)")
            got = os.readv(fd, [dest])
        finally:
            os.close(fd)
        _check_size(got, dest, "stored chunk (no compressor), as read,")

    return read_into


def _remote_reader(store, policy: RetryPolicy | None) -> Callable[[str], bytes]:
    policy = policy or RetryPolicy()
    return lambda key: get_bytes(store, key, policy)


def _get_range(store, key: str, policy: RetryPolicy | None, start: int, stop: int) -> bytes:
    from zarr.abc.store import RangeByteRequest

    return get_bytes(store, key, policy or RetryPolicy(), byte_range=RangeByteRequest(start, stop))


def _get_suffix(store, key: str, policy: RetryPolicy | None, size: int) -> bytes:
    from zarr.abc.store import SuffixByteRequest

    return get_bytes(store, key, policy or RetryPolicy(), byte_range=SuffixByteRequest(size))


# -- one stored object decoded whole, from its bytes (roofline, benchmarks) -------------------------------


def stored_decoder(arr: zarr.Array) -> Callable[..., np.ndarray] | None:
    """``decode(raw, rows=None)``: one stored object of ``arr`` (a chunk, or a whole shard) decoded from its bytes
    into a new array, as the loader decodes it (of a shard, the inner chunks holding its first ``rows`` rows, all
    of them by default: each must be stored); ``None`` for an array read through zarr's codecs. What ``roofline``
    and the benchmarks time as a codec's decode limit."""
    layout = read_path(arr)
    if not isinstance(layout, DirectLayout):
        return None
    decode = direct_decoder(arr, RetryPolicy())

    def whole(raw, rows: int | None = None) -> np.ndarray:
        held = layout.shape[0] if rows is None else rows
        return decode("", raw, rows=Span(0, held, held))

    return whole
