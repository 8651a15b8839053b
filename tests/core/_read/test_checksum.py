"""A chunk's checksum: crc32c checked on the stored bytes, zstd's said as a checksum mismatch, and which arrays'
chunks carry one."""

import google_crc32c
import numcodecs
import numpy as np
import pytest
import zarr

from zarrtorch._read.checksum import (
    chunk_checksum,
    crc32c_holds,
    ends_with_crc32c,
    without_crc32c,
    zstd_checksum_mismatch,
)


def with_crc32c(data: bytes) -> bytes:
    return data + google_crc32c.value(data).to_bytes(4, "little")


def test_bytes_whose_crc32c_holds_are_given_without_it():
    data = np.random.default_rng(3).bytes(1000)
    stored = bytearray(with_crc32c(data))
    assert bytes(without_crc32c(stored)) == data
    assert bytes(without_crc32c(memoryview(stored)[:])) == data  # a writable view, as the reading threads hold


@pytest.mark.parametrize("at", [0, 500, 999, 1000, 1003])  # in the data, and in the checksum itself
def test_one_flipped_bit_anywhere_is_a_checksum_mismatch_saying_what_to_do(at):
    stored = bytearray(with_crc32c(np.random.default_rng(3).bytes(1000)))
    stored[at] ^= 0x10
    with pytest.raises(ValueError, match=r"checksum mismatch: .*damaged: re-copy the store"):
        without_crc32c(stored)


def test_crc32c_holds_says_whether_the_bytes_match_their_checksum():
    stored = with_crc32c(b"some chunk")
    assert crc32c_holds(stored)
    assert not crc32c_holds(stored[:-1] + bytes([stored[-1] ^ 1]))
    assert not crc32c_holds(b"ab")


@pytest.mark.parametrize(
    ("options", "ends"),
    [
        ({"compressors": [zarr.codecs.BloscCodec(), zarr.codecs.Crc32cCodec()]}, True),
        ({"compressors": [zarr.codecs.ZstdCodec(checksum=True)]}, False),  # zstd's covers the decoded bytes
        ({"shards": (8, 3), "compressors": [zarr.codecs.Crc32cCodec()]}, False),  # inner chunks', not the shard's
        ({"zarr_format": 2, "compressors": numcodecs.Blosc()}, False),
    ],
)
def test_which_arrays_stored_objects_end_with_a_crc32c(options, ends):
    arr = zarr.create_array(zarr.storage.MemoryStore(), shape=(16, 3), chunks=(4, 3), dtype="f4", **options)
    assert ends_with_crc32c(arr) is ends


def test_bytes_shorter_than_a_checksum_are_damaged():
    with pytest.raises(ValueError, match="fewer than its CRC-32C checksum"):
        without_crc32c(b"abc")


def test_zstds_own_checksum_error_is_said_as_a_mismatch_and_others_are_left_alone():
    frame = bytearray(numcodecs.Zstd(checksum=True).encode(np.arange(1000, dtype="f4")))
    frame[-1] ^= 0x01  # its content checksum
    with pytest.raises(RuntimeError) as err:
        numcodecs.Zstd().decode(bytes(frame))
    said = zstd_checksum_mismatch(err.value)
    assert said is not None and "checksum mismatch" in str(said) and "re-copy the store" in str(said)
    assert zstd_checksum_mismatch(RuntimeError("Zstd decompression error: b'Unknown frame descriptor'")) is None


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"compressors": [zarr.codecs.ZstdCodec(checksum=True)]}, "zstd content checksum"),
        ({"compressors": [zarr.codecs.ZstdCodec()]}, None),
        ({"compressors": [zarr.codecs.BloscCodec(), zarr.codecs.Crc32cCodec()]}, "crc32c"),
        ({"compressors": [zarr.codecs.BloscCodec()]}, None),
        ({"compressors": None}, None),
        ({"compressors": [zarr.codecs.GzipCodec()]}, "gzip CRC-32"),
        ({"shards": (8, 3), "compressors": [zarr.codecs.Crc32cCodec()]}, "crc32c"),  # the inner chunks'
        ({"shards": (8, 3)}, None),  # zstd inner chunks; only the shard's index has a crc32c
        ({"zarr_format": 2, "compressors": numcodecs.Blosc()}, None),
        ({"zarr_format": 2, "compressors": numcodecs.Zlib()}, "zlib Adler-32"),
        ({"zarr_format": 2, "filters": [numcodecs.CRC32()], "compressors": None}, "crc32"),
    ],
)
def test_which_arrays_chunks_carry_a_checksum(options, said):
    arr = zarr.create_array(zarr.storage.MemoryStore(), shape=(16, 3), chunks=(4, 3), dtype="f4", **options)
    assert chunk_checksum(arr) == said
