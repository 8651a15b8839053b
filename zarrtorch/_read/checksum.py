"""The checksum a chunk's stored bytes carry, checked before they are decoded or kept in the node's cache.

A flipped bit inside compressed data often still decodes, to other values: only a checksum over the stored (or
the decoded) bytes tells. Zarr v3's ``crc32c`` codec appends the CRC-32C of the bytes before it (4 bytes, little
endian); zstd frames may carry a checksum of their decoded content (zstd checks it itself); gzip and zlib
streams always carry one. Blosc (version 1) and chunks stored uncompressed carry none of their own.
"""

from __future__ import annotations

import google_crc32c
import numcodecs
import numpy as np
import zarr
from numcodecs.checksum32 import Checksum32
from zarr.codecs import Crc32cCodec, GzipCodec, ShardingCodec, ZstdCodec

CRC32C_BYTES = 4

DAMAGED_ADVICE = "the chunk's bytes are damaged: re-copy the store from its source, or write it again (prepare_zarr)"


def crc32c(data) -> int:
    """CRC-32C of a bytes-like ``data``, through a numpy view of it (google_crc32c refuses memoryviews; no copy)."""
    return google_crc32c.value(np.frombuffer(data, np.uint8))


def crc32c_in_hardware() -> bool:
    """Whether google_crc32c runs compiled (the processor's instruction, GB/s), not its pure-Python fallback."""
    return google_crc32c.implementation == "c"


def without_crc32c(raw) -> memoryview:
    """The bytes before a ``crc32c`` codec's checksum, once they match it; ``ValueError`` saying so where not."""
    view = memoryview(raw).cast("B")
    if len(view) < CRC32C_BYTES:
        raise ValueError(f"it holds {len(view)} bytes, fewer than its CRC-32C checksum (4): {DAMAGED_ADVICE}")
    data, stored = view[:-CRC32C_BYTES], int.from_bytes(view[-CRC32C_BYTES:], "little")
    computed = crc32c(data)  # holds the GIL, at ~11-18 GB/s
    if computed != stored:
        raise ValueError(
            f"checksum mismatch: its bytes give CRC-32C {computed:08x}, it stores {stored:08x}: {DAMAGED_ADVICE}"
        )
    return data


def crc32c_holds(raw) -> bool:
    """Whether ``raw`` ends with the crc32c codec's checksum of the bytes before it."""
    try:
        without_crc32c(raw)
    except ValueError:
        return False
    return True


def ends_with_crc32c(arr: zarr.Array) -> bool:
    """Whether each stored object of ``arr`` (a chunk, or a whole shard) ends with a crc32c of the bytes before it:
    its last codec is Zarr v3's crc32c."""
    codecs = arr.metadata.codecs if arr.metadata.zarr_format == 3 else ()
    return bool(codecs) and isinstance(codecs[-1], Crc32cCodec)


def zstd_checksum_mismatch(exc: RuntimeError) -> ValueError | None:
    """zstd's own error for a frame whose content checksum does not hold, said as :func:`without_crc32c` says it;
    ``None`` for another error."""
    if "match checksum" not in str(exc):
        return None
    return ValueError(f"checksum mismatch: its zstd frame's content checksum does not hold: {DAMAGED_ADVICE}")


def shard_index_checksum_mismatch(exc: ValueError) -> ValueError | None:
    """zarr's own error for a shard index whose crc32c (its default index codecs) does not hold, said as
    :func:`without_crc32c` says it, naming the index; ``None`` for another error."""
    if "checksum do not match" not in str(exc):
        return None
    return ValueError(f"checksum mismatch: its shard index's checksum does not hold ({exc}): {DAMAGED_ADVICE}")


def chunk_checksum(arr: zarr.Array) -> str | None:
    """What checks the bytes of ``arr``'s chunks (of a shard's inner chunks): ``"crc32c"``, ``"zstd content
    checksum"``, ``"gzip CRC-32"``, ``"zlib Adler-32"``; ``None`` when nothing does (a flipped byte inside
    compressed data may then decode to other values, unnoticed)."""
    if arr.metadata.zarr_format == 2:
        meta = arr.metadata
        codecs = [*(meta.filters or ()), meta.compressor]
    else:
        codecs = list(arr.metadata.codecs)
        if codecs and isinstance(codecs[0], ShardingCodec):
            codecs = [*codecs[0].codecs, *codecs[1:]]
    for codec in codecs:
        found = _checksum_of(codec)
        if found is not None:
            return found
    return None


def _checksum_of(codec) -> str | None:
    if isinstance(codec, Crc32cCodec):
        return "crc32c"
    if isinstance(codec, Checksum32):  # a Zarr v2 filter: crc32, crc32c, adler32, fletcher32, jenkins_lookup3
        return codec.codec_id
    if isinstance(codec, ZstdCodec) and codec.checksum or isinstance(codec, numcodecs.Zstd) and codec.checksum:
        return "zstd content checksum"
    if isinstance(codec, (GzipCodec, numcodecs.GZip)):
        return "gzip CRC-32"
    if isinstance(codec, numcodecs.Zlib):
        return "zlib Adler-32"
    return None
