"""check_first_axis_layout: accepts arrays sharing one first-axis chunking, refuses everything else with a
message naming the array and the fix."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from zarr.storage import MemoryStore

from zarrtorch import FirstAxisLayout, LayoutError, check_first_axis_layout


def arr(shape, chunks, shards=None, dtype="f4"):
    return zarr.create_array(store=MemoryStore(), shape=shape, chunks=chunks, shards=shards, dtype=dtype)


def test_accepts_a_shared_first_axis_layout():
    layout = check_first_axis_layout({"x": arr((95, 3, 4), (10, 3, 4)), "y": arr((95,), (10,))})
    assert layout == FirstAxisLayout(rows=95, chunk_rows=10, sharded=False)
    assert layout.n_chunks == 10
    assert check_first_axis_layout({"x": arr((7, 2), (20, 2))}).chunk_rows == 20  # chunk longer than the array


def test_other_axis_chunking():
    with pytest.raises(LayoutError) as err:
        check_first_axis_layout({"y": arr((100,), (10,)), "x": arr((100, 8, 4), (10, 8, 2))})
    msg = str(err.value)
    assert "array 'x'" in msg and "axis 2" in msg and "(10, 8, 4)" in msg and "prepare_zarr" in msg


def test_different_lengths():
    with pytest.raises(LayoutError, match="different first-axis lengths: 'x' has 100 rows, 'y' has 99"):
        check_first_axis_layout({"x": arr((100, 2), (10, 2)), "y": arr((99,), (10,))})


def test_different_chunk_lengths_with_equal_chunk_counts():
    x, y = arr((100, 2), (10, 2)), arr((100,), (11,))
    assert x.nchunks == y.nchunks == 10
    with pytest.raises(LayoutError, match="'x' uses 10 rows per chunk, 'y' uses 11") as err:
        check_first_axis_layout({"x": x, "y": y})
    assert "chunk_rows" in str(err.value)


def test_zero_rows():
    with pytest.raises(LayoutError, match=r"array 'x' has zero rows \(shape \(0, 3\)\)"):
        check_first_axis_layout({"x": arr((0, 3), (10, 3))})


def test_a_sharded_array_is_read_by_whole_shards_with_no_setting():
    """The shard is the unit (issue 43: refused unless a setting asked for it); the refusals that keep rows
    paired stay, each naming the fix."""
    sharded = {"x": arr((100, 4), (5, 4), shards=(20, 4)), "y": arr((100,), (5,), shards=(20,))}
    assert check_first_axis_layout(sharded) == FirstAxisLayout(rows=100, chunk_rows=20, sharded=True)
    with pytest.raises(LayoutError, match="axis 1.*shards.*prepare_zarr"):  # shards along another axis
        check_first_axis_layout({"x": arr((100, 4), (5, 2), shards=(20, 2))})
    with pytest.raises(LayoutError, match="differ in sharding: shard all arrays the same way or none"):
        check_first_axis_layout({"x": sharded["x"], "y": arr((100,), (20,))})
    with pytest.raises(LayoutError, match="'x' uses 20 rows per chunk, 'y' uses 40"):  # shards of other lengths
        check_first_axis_layout({"x": sharded["x"], "y": arr((100,), (5,), shards=(40,))})


def test_shards_compressed_again_whole_are_refused_naming_the_fix(tmp_path):
    """A sharding codec followed by another codec (zarr's ``shards`` is then None): its shard index lies inside
    the compressed bytes, so the loader could not tell an absent inner chunk from fill values. It made the read
    path raise a TypeError (``read_path_text``) before sharded stores were read by default (issue 43)."""
    from zarrtorch._read.fastpath import read_path_text

    codecs = {"serializer": zarr.codecs.ShardingCodec(chunk_shape=(4, 3)), "compressors": zarr.codecs.ZstdCodec()}
    packed = zarr.create_array(str(tmp_path / "a.zarr"), shape=(16, 3), chunks=(8, 3), dtype="i4", **codecs)
    assert packed.shards is None
    assert read_path_text(packed) == (
        "zarr's path: a sharding codec followed by Zstd (a shard compressed again whole) not read directly"
    )
    with pytest.raises(LayoutError) as err:
        check_first_axis_layout({"x": packed})
    msg = str(err.value)
    assert "array 'x' compresses each shard again as a whole" in msg and "prepare_zarr" in msg


def test_not_arrays():
    with pytest.raises(LayoutError, match="no arrays"):
        check_first_axis_layout({})
    with pytest.raises(TypeError, match="'x' is a ndarray, not a zarr.Array.*prepare_zarr"):
        check_first_axis_layout({"x": np.zeros((10, 2))})
