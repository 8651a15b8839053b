"""The direct zstd decode gives exactly what zarr gives, and steps aside for layouts it does not handle."""

import numpy as np
import pytest
import zarr

from zarrtorch import prepare_zarr
from zarrtorch.fastpath import direct_decoder
from zarrtorch.reader import PieceReader


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
def test_other_codecs_fall_back_to_zarr(tmp_path, codec):
    g = prepare_zarr({"x": np.ones((10, 2), "f4")}, tmp_path / "c.zarr", chunk_rows=4, codec=codec, progress=False)
    assert direct_decoder(g["x"]) is None
    np.testing.assert_array_equal(PieceReader({"x": g["x"]}, 4).read_piece(8, 10)["x"], np.ones((2, 2)))


def test_sharded_arrays_fall_back_and_other_stores_are_read_through_their_get():
    g = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    plain = g.create_array("p", shape=(8, 2), chunks=(4, 2), dtype="f4", compressors=zarr.codecs.ZstdCodec())
    plain[:] = np.arange(16, dtype="f4").reshape(8, 2)
    sharded = g.create_array("s", shape=(8, 2), chunks=(2, 2), shards=(4, 2), dtype="f4")
    assert direct_decoder(sharded) is None
    decode = direct_decoder(plain)  # a store that is not a local directory: one get per chunk
    np.testing.assert_array_equal(decode("p/c/1/0"), plain[4:8])
