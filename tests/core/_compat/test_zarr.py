"""The internal zarr API zarrtorch relies on (all of it in zarrtorch/_compat/zarr.py) still exists and behaves as
that module says. A zarr upgrade that changes one fails here, naming the function to update, not inside an epoch."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import zarr
from zarr.buffer import default_buffer_prototype
from zarr.codecs import ShardingCodec, ShardingCodecIndexLocation

from zarrtorch._compat.zarr import (
    NO_INNER_CHUNK,
    array_on_store,
    chunk_nbytes,
    chunk_spec,
    decode_chunk,
    decode_shard_index,
    event_loop,
    run,
    shard_index,
    shard_index_size,
)
from zarrtorch._read.chunks import chunk_key


def stored(arr: zarr.Array, chunk: int):
    return run(arr.store_path.store.get(chunk_key(arr, chunk), default_buffer_prototype()))


def test_a_chunk_decodes_from_its_bytes_through_the_arrays_codecs(tmp_path):
    a = zarr.create_array(
        str(tmp_path / "a.zarr"), shape=(20, 3), chunks=(5, 3), dtype="i4", compressors=[zarr.codecs.BloscCodec()]
    )
    a[:] = np.arange(60, dtype="i4").reshape(20, 3)
    spec = chunk_spec(a, (1, 0))
    assert tuple(spec.shape) == (5, 3) and spec.fill_value == 0, "update zarrtorch._compat.zarr.chunk_spec"
    assert chunk_nbytes(spec) == 5 * 3 * 4, "update zarrtorch._compat.zarr.chunk_nbytes"
    decoded = run(decode_chunk(a, stored(a, 1), spec))
    assert isinstance(decoded, np.ndarray), "update zarrtorch._compat.zarr.decode_chunk"
    np.testing.assert_array_equal(decoded, np.arange(15, 30).reshape(5, 3))


def test_v2_arrays_decode_in_the_order_their_metadata_gives(tmp_path):
    """A Zarr v2 array's memory order lives in its metadata: a chunk written in F order decodes as written."""
    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(4, 2), chunks=(2, 2), dtype="f4", zarr_format=2, order="F")
    a[:] = np.arange(8, dtype="f4").reshape(4, 2)
    assert a.metadata.zarr_format == 2 and a.metadata.order == "F"
    assert chunk_key(a, 1) == "1.0"
    decoded = run(decode_chunk(a, stored(a, 1), chunk_spec(a, (1, 0))))
    np.testing.assert_array_equal(decoded, np.arange(4, 8, dtype="f4").reshape(2, 2))


def test_the_shard_index_says_which_inner_chunks_are_stored(tmp_path):
    a = zarr.create_array(str(tmp_path / "s.zarr"), shape=(20, 3), chunks=(5, 3), shards=(10, 3), dtype="f4")
    a[:15] = 1.0  # the second shard's second inner chunk (rows 15-19) is never written
    codec = a.metadata.codecs[0]
    assert isinstance(codec, ShardingCodec) and codec.index_location == ShardingCodecIndexLocation.end
    spec = chunk_spec(a, (1, 0))
    raw = stored(a, 1)
    assert 0 < shard_index_size(codec, spec) < len(raw), "update zarrtorch._compat.zarr.shard_index_size"
    index = run(shard_index(codec, raw, spec))
    assert index.shape == (2, 1, 2), "update zarrtorch._compat.zarr.shard_index: (inner grid..., 2) expected"
    entries = index.reshape(-1, 2)
    assert entries[0, 0] != NO_INNER_CHUNK and entries[1, 0] == NO_INNER_CHUNK, "update NO_INNER_CHUNK"


def test_a_shard_index_read_alone_decodes_and_its_checksum_is_checked(tmp_path):
    """The direct reader reads a shard's index by byte range and decodes it alone: the same entries as from the
    whole shard, and a ``ValueError`` where its checksum (crc32c, zarr's default index codec) does not match."""
    import pytest

    a = zarr.create_array(str(tmp_path / "s.zarr"), shape=(20, 3), chunks=(5, 3), shards=(10, 3), dtype="f4")
    a[:] = 1.0
    codec, spec = a.metadata.codecs[0], chunk_spec(a, (0, 0))
    raw = stored(a, 0).to_bytes()
    alone = raw[len(raw) - shard_index_size(codec, spec) :]
    expected = run(shard_index(codec, stored(a, 0), spec))
    assert np.array_equal(decode_shard_index(codec, alone, spec), expected), (
        "update zarrtorch._compat.zarr.decode_shard_index"
    )
    with pytest.raises(ValueError):
        decode_shard_index(codec, alone[:-1] + bytes([alone[-1] ^ 1]), spec)


def test_the_shard_index_is_found_at_the_start_too(tmp_path):
    a = zarr.create_array(
        str(tmp_path / "s.zarr"),
        shape=(20, 3),
        chunks=(5, 3),
        shards={"shape": (10, 3), "index_location": "start"},
        dtype="f4",
    )
    a[:] = 1.0
    codec = a.metadata.codecs[0]
    assert codec.index_location == ShardingCodecIndexLocation.start
    index = run(shard_index(codec, stored(a, 0), chunk_spec(a, (0, 0)))).reshape(-1, 2)
    assert (index[:, 0] != NO_INNER_CHUNK).all() and (
        index[:, 0] >= shard_index_size(codec, chunk_spec(a, (0, 0)))
    ).all()


def test_zarr_runs_its_event_loop_in_a_thread_of_its_own():
    """fetch_soon schedules requests on zarr's loop (``event_loop``) without waiting in a thread; ``run`` waits."""
    loop = event_loop()
    assert loop is event_loop() and loop.is_running(), "update zarrtorch._compat.zarr.event_loop"

    async def thread_name() -> str:
        return threading.current_thread().name

    where = asyncio.run_coroutine_threadsafe(thread_name(), loop)
    assert where.result(timeout=5) not in ("", threading.current_thread().name)
    assert run(thread_name()) != threading.current_thread().name, "update zarrtorch._compat.zarr.run"


def test_run_gives_up_after_its_timeout():
    """``within`` bounds a request that ignores its cancellation by ``run``'s own timeout."""
    import pytest

    release = threading.Event()

    async def held() -> None:
        while not release.is_set():
            await asyncio.sleep(0.01)

    with pytest.raises(TimeoutError):
        run(held(), timeout=0.1)
    release.set()  # the coroutine, still on zarr's loop, ends


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


def test_an_array_is_made_over_another_store_from_its_metadata_without_a_read(tmp_path):
    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(20, 3), chunks=(5, 3), dtype="i4")
    a[:] = np.arange(60, dtype="i4").reshape(20, 3)
    reads = []

    class Counting(zarr.storage.WrapperStore):
        async def get(self, key, prototype, byte_range=None):
            reads.append(key)
            return await self._store.get(key, prototype, byte_range)

    b = array_on_store(a, Counting(a.store_path.store))
    assert reads == [] and b.metadata == a.metadata, "update zarrtorch._compat.zarr.array_on_store"
    assert isinstance(b.store_path.store, Counting) and b.path == a.path, "update zarrtorch._compat.zarr.array_on_store"
    np.testing.assert_array_equal(b[5:10], a[5:10])
    assert reads == ["c/1/0"], "update zarrtorch._compat.zarr.array_on_store"
