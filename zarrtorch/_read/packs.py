"""The node-local cache's file format: a pack of several chunks in one file.

Creating a file costs a new inode: on an ext4 disk 183-193 us of CPU for ``os.open``, against 28-34 us for writing a
58 KiB chunk into it, and a first epoch through the cache ran at 0.73x the rate without it, one file per chunk. A
pack holds up to :data:`PACK_CHUNKS` chunks of one store, one inode for all. Its layout::

    header   magic (8) | entries (4) | index length (4) | check of the index (4)
    index    per entry: key length (2) | key (UTF-8) | record offset (8) | record length (8)
    records  per entry: magic (8) | key length (2) | key | body length (8) | check of the body (4) | body

The index lets a listing learn a pack's keys from its first bytes, without reading its chunks. Each record states
its own key, length and check, so that one chunk is read (one ``pread`` of its record) and verified without the
header: a record read at a wrong offset, cut short, lengthened or altered, or holding another key, is refused. The
magic names the check, CRC-32C (the processor's instruction) or zlib's CRC-32 (a process without google_crc32c's
compiled module), and the format: a file of another format is refused, never read as a pack.
"""

from __future__ import annotations

import struct
import zlib

from zarrtorch._read.checksum import crc32c, crc32c_in_hardware

MAGIC_CRC32C = b"ZTPACK1C"  # a pack (format 1) whose checks are CRC-32C
MAGIC_CRC32 = b"ZTPACK1Z"  # or zlib's CRC-32
_HEAD = struct.Struct("<8sIII")  # magic, entries, index length, check of the index
_RECORD_HEAD = struct.Struct("<8sH")  # magic, key length; then the key, then _BODY_HEAD
_BODY_HEAD = struct.Struct("<QI")  # body length, check of the body
_INDEX_ENTRY = struct.Struct("<QQ")  # after an entry's key length and key: record offset, record length
_KEY_LENGTH = struct.Struct("<H")
HEADER_BYTES = _HEAD.size
KEY_MOST_BYTES = 0xFFFF  # a key longer than this is not kept in the cache
SUFFIX = ".pack"  # a pack's file name ends with it; anything else in a store's folder is not a pack


def _crc32(data) -> int:
    return zlib.crc32(data)


_CHECKS = {MAGIC_CRC32C: crc32c, MAGIC_CRC32: _crc32}
# packs written with CRC-32C where the processor computes it; packs of either kind are read by any process
MAGIC = MAGIC_CRC32C if crc32c_in_hardware() else MAGIC_CRC32


def record_overhead(key: str) -> int:
    """Bytes a chunk of key ``key`` takes in a pack besides its body: its record's head and its index entry."""
    k = len(key.encode())
    return _RECORD_HEAD.size + k + _BODY_HEAD.size + _KEY_LENGTH.size + k + _INDEX_ENTRY.size


def pack_parts(entries: list[tuple[str, bytes]], magic: bytes = MAGIC) -> tuple[list, list[tuple[str, int, int]]]:
    """The buffers of a pack of ``entries`` (key, body), to be written one after another (the bodies as they are:
    not copied), and each entry's ``(key, record offset, record length)``."""
    check = _CHECKS[magic]
    keys = [key.encode() for key, _ in entries]
    index_bytes = sum(_KEY_LENGTH.size + len(k) + _INDEX_ENTRY.size for k in keys)
    offset = HEADER_BYTES + index_bytes
    index, records, placed = [], [], []
    for (key, body), k in zip(entries, keys, strict=True):
        head = _RECORD_HEAD.pack(magic, len(k)) + k + _BODY_HEAD.pack(len(body), check(body))
        length = len(head) + len(body)
        index.append(_KEY_LENGTH.pack(len(k)) + k + _INDEX_ENTRY.pack(offset, length))
        records += [head, body]
        placed.append((key, offset, length))
        offset += length
    index_data = b"".join(index)
    header = _HEAD.pack(magic, len(entries), len(index_data), check(index_data))
    return [header + index_data, *records], placed


def index_length(head: bytes) -> int | None:
    """The bytes of header and index together, from a pack's first :data:`HEADER_BYTES` bytes (``None``: not a
    pack of this format)."""
    if len(head) < HEADER_BYTES:
        return None
    magic, _, length, _ = _HEAD.unpack_from(head)
    return HEADER_BYTES + length if magic in _CHECKS else None


def parse_index(data: bytes, size: int) -> list[tuple[str, int, int]] | None:
    """The ``(key, record offset, record length)`` of each entry of a pack whose first bytes are ``data`` (its header
    and whole index at least) and whose file holds ``size`` bytes; ``None`` when the header or the index is damaged,
    cut, or of another format, or a record would lie outside the file."""
    if len(data) < HEADER_BYTES:
        return None
    magic, count, length, stored = _HEAD.unpack_from(data)
    check = _CHECKS.get(magic)
    if check is None or len(data) < HEADER_BYTES + length:
        return None
    index = memoryview(data)[HEADER_BYTES : HEADER_BYTES + length]
    if check(index) != stored:
        return None
    out, at = [], 0
    try:
        for _ in range(count):
            (k,) = _KEY_LENGTH.unpack_from(index, at)
            key = bytes(index[at + 2 : at + 2 + k]).decode()
            offset, record = _INDEX_ENTRY.unpack_from(index, at + 2 + k)
            at += 2 + k + _INDEX_ENTRY.size
            if offset < HEADER_BYTES + length or offset + record > size:
                return None
            out.append((key, offset, record))
    except (struct.error, UnicodeDecodeError):
        return None
    return out if at == length else None


def record_body(record: bytes, key: str) -> memoryview | None:
    """The body of a pack's ``record`` (a view: not copied) when the record is whole and intact and holds ``key``,
    else ``None``."""
    if len(record) < _RECORD_HEAD.size:
        return None
    magic, k = _RECORD_HEAD.unpack_from(record)
    check = _CHECKS.get(magic)
    start = _RECORD_HEAD.size + k + _BODY_HEAD.size
    if check is None or len(record) < start or record[_RECORD_HEAD.size : _RECORD_HEAD.size + k] != key.encode():
        return None
    length, stored = _BODY_HEAD.unpack_from(record, _RECORD_HEAD.size + k)
    body = memoryview(record)[start:]
    if length != len(body) or check(body) != stored:
        return None
    return body
