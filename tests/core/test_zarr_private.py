"""The internal zarr API zarrtorch relies on (all of it in zarrtorch/chunks.py) still exists and behaves as that
module says. A zarr upgrade that changes one fails here, by name, not inside an epoch."""

from __future__ import annotations

import numpy as np
import zarr
from zarr.codecs.sharding import MAX_UINT_64, ShardingCodec, ShardingCodecIndexLocation
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import _get_loop, sync

from zarrtorch._read.chunks import chunk_key


def test_codec_pipeline_decodes_a_chunk_from_its_bytes(tmp_path):
    a = zarr.create_array(
        str(tmp_path / "a.zarr"), shape=(20, 3), chunks=(5, 3), dtype="i4", compressors=[zarr.codecs.BloscCodec()]
    )
    a[:] = np.arange(60, dtype="i4").reshape(20, 3)
    inner = a._async_array
    spec = inner.metadata.get_chunk_spec((1, 0), inner.config, prototype=default_buffer_prototype())
    raw = sync(a.store_path.store.get(chunk_key(a, 1), default_buffer_prototype()))
    (decoded,) = sync(inner.codec_pipeline.decode([(raw, spec)]))
    np.testing.assert_array_equal(decoded.as_numpy_array(), np.arange(15, 30).reshape(5, 3))


def test_v2_arrays_keep_their_order_in_the_metadata(tmp_path):
    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(4, 2), chunks=(2, 2), dtype="f4", zarr_format=2)
    assert a.metadata.zarr_format == 2 and a._async_array.order in ("C", "F")
    assert chunk_key(a, 1) == "1.0"


def test_shard_index_is_read_as_zarrtorch_expects(tmp_path):
    a = zarr.create_array(str(tmp_path / "s.zarr"), shape=(20, 3), chunks=(5, 3), shards=(10, 3), dtype="f4")
    a[:15] = 1.0  # the second shard's second inner chunk (rows 15-19) is never written
    codec = a.metadata.codecs[0]
    assert isinstance(codec, ShardingCodec) and codec.index_location == ShardingCodecIndexLocation.end
    spec = a.metadata.get_chunk_spec((1, 0), a._async_array.config, prototype=default_buffer_prototype())
    per_shard = codec._get_chunks_per_shard(spec)
    assert per_shard == (2, 1)
    raw = sync(a.store_path.store.get(chunk_key(a, 1), default_buffer_prototype()))
    size = codec._shard_index_size(per_shard)
    index = sync(codec._decode_shard_index(raw[len(raw) - size :], per_shard))
    entries = index.offsets_and_lengths.reshape(-1, 2)
    assert entries[0, 0] != MAX_UINT_64 and entries[1, 0] == MAX_UINT_64


def test_zarr_runs_its_event_loop_in_a_thread_of_its_own():
    """fetch_soon schedules requests on zarr's loop (zarr.core.sync._get_loop) without waiting in a thread."""
    import asyncio
    import threading

    loop = _get_loop()
    assert loop is _get_loop() and loop.is_running()

    async def thread_name() -> str:
        return threading.current_thread().name

    where = asyncio.run_coroutine_threadsafe(thread_name(), loop)
    assert where.result(timeout=5) not in ("", threading.current_thread().name)


def test_chunk_keys_built_once_equal_zarrs_encoder(tmp_path):
    """The reader's per-array key function gives zarr's own key for every chunk, whatever the key encoding,
    separator, format or group path; an encoding it cannot read around falls back to zarr's encoder."""
    from zarrtorch._read.chunks import chunk_keys

    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    arrays = [
        group.create_array("a", shape=(300, 2), chunks=(7, 2), dtype="f4"),
        group.require_group("nested").create_array("b", shape=(300,), chunks=(3,), dtype="i2"),
        group.create_array(
            "c", shape=(300, 2, 2), chunks=(5, 1, 2), dtype="f4", chunk_key_encoding={"name": "v2", "separator": "."}
        ),
        group.create_array(
            "d", shape=(300, 4), chunks=(9, 4), dtype="u1", chunk_key_encoding={"name": "default", "separator": "."}
        ),
        zarr.create_array(str(tmp_path / "v2.zarr"), shape=(300, 3), chunks=(4, 3), dtype="f8", zarr_format=2),
    ]
    for arr in arrays:
        keys = chunk_keys(arr)
        assert [keys(c) for c in range(arr.cdata_shape[0])] == [chunk_key(arr, c) for c in range(arr.cdata_shape[0])]
    assert chunk_keys(arrays[2])(12) == "c/12.0.0" and chunk_keys(arrays[1])(99) == "nested/b/c/99"
