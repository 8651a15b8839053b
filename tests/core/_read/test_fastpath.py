"""The direct decode gives exactly what zarr gives, from a local directory or any other store's ``get``."""

import numpy as np
import pytest
import zarr

from zarrtorch import prepare_zarr
from zarrtorch._read.fastpath import Span, _local_reader, direct_decoder, read_buffer_bytes
from zarrtorch._read.reader import PieceReader


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(0)
    data = {
        "x": rng.random((150, 3, 4)).astype("f4"),
        "n": np.arange(150, dtype="i8"),
        "b": rng.integers(0, 255, (150, 2), dtype="u1"),
    }
    return prepare_zarr(data, tmp_path / "s.zarr", chunk_rows=64, progress=False), data


def test_direct_decode_equals_zarr_including_partial_last_chunk(store):
    group, data = store
    reader = PieceReader(dict(group.arrays()), 64)
    assert all(reader._direct[name] is not None for name in data)
    for start, stop in [(0, 64), (64, 100), (128, 150), (130, 131)]:
        piece = reader.read_piece(start, stop)
        for name, values in data.items():
            np.testing.assert_array_equal(piece[name], values[start:stop])


@pytest.mark.parametrize("codec", ["none", "blosc-lz4"])
def test_prepare_zarrs_other_codecs_are_decoded_directly_too(tmp_path, codec):
    g = prepare_zarr({"x": np.ones((10, 2), "f4")}, tmp_path / "c.zarr", chunk_rows=4, codec=codec, progress=False)
    assert direct_decoder(g["x"]) is not None
    np.testing.assert_array_equal(PieceReader({"x": g["x"]}, 4).read_piece(8, 10)["x"], np.ones((2, 2)))


def test_arrays_in_other_stores_are_read_through_their_get_shards_by_byte_range():
    g = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    plain = g.create_array("p", shape=(8, 2), chunks=(4, 2), dtype="f4", compressors=zarr.codecs.ZstdCodec())
    plain[:] = np.arange(16, dtype="f4").reshape(8, 2)
    sharded = g.create_array("s", shape=(8, 2), chunks=(2, 2), shards=(4, 2), dtype="f4")
    sharded[:] = np.arange(16, dtype="f4").reshape(8, 2)
    decode = direct_decoder(plain)  # a store that is not a local directory: one get per chunk
    np.testing.assert_array_equal(decode("p/c/1/0"), plain[4:8])
    decode = direct_decoder(sharded)  # the shard's index, then its inner chunks by byte range
    np.testing.assert_array_equal(decode("s/c/1/0", rows=Span(0, 4, 4)), sharded[4:8])
    np.testing.assert_array_equal(decode("s/c/0/0", rows=Span(2, 4, 4))[2:4], sharded[2:4])


def test_read_buffer_holds_any_chunk_file_and_is_reused(tmp_path):
    """The per-thread buffer is sized for the largest zstd frame of a chunk (incompressible data, the worst
    case, fits) and one buffer serves chunk files of every size: no reallocation, nothing left to the C
    allocator to keep."""
    rng = np.random.default_rng(1)
    noise = rng.integers(0, 2**32, (300, 50), dtype=np.uint32)  # incompressible
    noise[200:] = 0  # and small files
    group = prepare_zarr({"x": noise}, tmp_path / "n.zarr", chunk_rows=64, progress=False)
    arr = group["x"]
    files = sorted((tmp_path / "n.zarr" / "x").rglob("*"))
    sizes = [f.stat().st_size for f in files if f.is_file() and f.name != "zarr.json"]
    assert len(sizes) == 5 and max(sizes) > 64 * 50 * 4  # a zstd frame of noise is larger than the data
    assert read_buffer_bytes(arr) >= max(sizes)
    read = _local_reader(arr.store_path.store, read_buffer_bytes(arr))
    buffers = set()
    for c in [4, 0, 3, 1]:  # small, big, small, big
        view = read(f"x/{arr.metadata.encode_chunk_key((c, 0))}")
        buffers.add(id(view.obj))
        del view
    assert len(buffers) == 1
    fortran = zarr.create_array(tmp_path / "f.zarr", shape=(8, 4), chunks=(2, 4), dtype="f4", zarr_format=2, order="F")
    assert read_buffer_bytes(fortran) == 0  # read through zarr's codecs: no such buffer
