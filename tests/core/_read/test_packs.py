"""The cache's pack format (:mod:`zarrtorch._read.packs`): an index a listing reads without the chunks, records that
verify alone; every damage (a flipped bit, a cut, a record read at another key's place, another format) is refused,
never read as chunk bytes. The cache's use of them is in test_cache.py."""

from __future__ import annotations

import zlib

import google_crc32c
import pytest

from zarrtorch._read import packs
from zarrtorch._read.cache import ChunkCache, _read_index

ENTRIES = [("x/c/0/0", b"first chunk" * 50), ("x/c/1/0", bytes(range(256)) * 8), ("x/c/2/0", b"")]


def packed(entries=ENTRIES, magic=packs.MAGIC) -> tuple[bytes, list]:
    parts, placed = packs.pack_parts(entries, magic)
    return b"".join(bytes(p) for p in parts), placed


@pytest.mark.parametrize("magic", [packs.MAGIC_CRC32C, packs.MAGIC_CRC32])
def test_a_packs_index_and_records_give_back_each_chunk(magic):
    data, placed = packed(magic=magic)
    assert packs.parse_index(data[: packs.index_length(data[: packs.HEADER_BYTES])], len(data)) == placed
    for (key, body), (_, offset, length) in zip(ENTRIES, placed, strict=True):
        assert bytes(packs.record_body(data[offset : offset + length], key)) == body


def test_a_records_check_is_the_crc_its_magic_names():
    body = ENTRIES[1][1]
    for magic, crc in ((packs.MAGIC_CRC32C, google_crc32c.value(body)), (packs.MAGIC_CRC32, zlib.crc32(body))):
        data, placed = packed([ENTRIES[1]], magic)
        _, offset, length = placed[0]
        assert data[offset + length - len(body) - 4 : offset + length - len(body)] == crc.to_bytes(4, "little")


def test_a_record_flipped_cut_lengthened_or_read_as_another_key_is_refused():
    data, placed = packed()
    key, offset, length = placed[1]
    record = data[offset : offset + length]
    for at in range(0, length, 7):  # a flipped bit anywhere: its magic, key, length, check or body
        damaged = bytearray(record)
        damaged[at] ^= 0x10
        assert packs.record_body(bytes(damaged), key) is None, at
    assert packs.record_body(record[:-1], key) is None
    assert packs.record_body(record + b"\0", key) is None
    assert packs.record_body(record, "x/c/0/0") is None  # the record of another key: never its bytes
    first = placed[0][1]
    assert packs.record_body(data[first : first + length], key) is None  # a wrong place: another record's bytes


def test_a_damaged_or_cut_index_is_refused():
    data, placed = packed()
    end = packs.index_length(data[: packs.HEADER_BYTES])
    for at in range(end):
        damaged = bytearray(data)
        damaged[at] ^= 0x01
        assert packs.parse_index(bytes(damaged[:end]), len(data)) != placed, at
    assert packs.parse_index(data[: end - 1], len(data)) is None
    last_offset, last_length = placed[-2][1:]
    assert packs.parse_index(data[:end], last_offset + last_length) is None  # the file cut: a record past its end


def test_a_file_of_another_format_is_not_a_pack():
    body = b"chunk" * 30
    former = b"ZTCACHE3" + len(body).to_bytes(8, "little") + google_crc32c.value(body).to_bytes(4, "little") + body
    assert packs.index_length(former) is None and packs.parse_index(former, len(former)) is None
    assert packs.record_body(former, "x/c/0") is None


def test_a_pack_with_one_damaged_record_is_deleted_and_none_of_its_chunks_is_served(tmp_path):
    """A chunk that fails its check drops its pack: the damaged one is never served, and the pack's others are
    fetched again (the next read finds no pack) rather than read from a file known to be damaged."""
    cache = ChunkCache(tmp_path / "cache")
    cache.prepare()
    store_id = "0" * 32
    cache.write_pack(store_id, ENTRIES)
    assert bytes(cache.read(store_id, ENTRIES[0][0])) == ENTRIES[0][1]
    (path,) = (cache.root / store_id).iterdir()
    name, offset, length, _ = cache.where(store_id, ENTRIES[1][0])
    damaged = bytearray(path.read_bytes())
    damaged[offset + length - 3] ^= 0x04
    path.write_bytes(bytes(damaged))
    assert cache.read(store_id, ENTRIES[1][0]) is None
    assert not path.exists()
    assert [cache.read(store_id, key) for key, _ in ENTRIES] == [None] * len(ENTRIES)


@pytest.mark.parametrize("damage", ["index", "cut"])
def test_a_pack_whose_index_is_damaged_or_that_is_cut_short_is_deleted_when_listed(tmp_path, damage):
    cache = ChunkCache(tmp_path / "cache")
    cache.prepare()
    store_id = "0" * 32
    cache.write_pack(store_id, ENTRIES)
    (path,) = (cache.root / store_id).iterdir()
    data = bytearray(path.read_bytes())
    if damage == "index":
        data[packs.HEADER_BYTES + 3] ^= 0x01
    else:
        del data[-5:]
    path.write_bytes(bytes(data))
    assert _read_index(path) is None
    fresh = ChunkCache(cache.root)  # another process: lists the folder, reads the index
    assert fresh.keys_held(store_id).size == 0 and not path.exists()
    assert all(fresh.read(store_id, key) is None for key, _ in ENTRIES)
