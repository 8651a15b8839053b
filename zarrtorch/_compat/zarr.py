"""Every use of zarr's internal API (``zarr.core``, an array's codec pipeline, the sharding codec's index).

zarr's public API reads a selection (``array[start:stop]``), which waits on a remote request without a deadline,
reads a missing chunk (or a shard's missing inner chunk) as fill values and would need a second request to
tell, and copies every chunk into a new output array. The loader reads each chunk's stored object itself (one
request, with a deadline and retries) and decodes it with the array's own codecs, which needs the parts below;
it runs its requests on zarr's event loop, so that they share zarr's connections. ``zarr.buffer``, ``zarr.abc``
and ``zarr.codecs`` are public and used directly elsewhere.

``tests/core/_compat/test_zarr.py`` checks each function against the installed zarr, so an upgrade that
changes one fails there, by name, not inside an epoch.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import zarr
from zarr.buffer import default_buffer_prototype
from zarr.codecs import ShardingCodec, ShardingCodecIndexLocation
from zarr.codecs.sharding import MAX_UINT_64
from zarr.core.sync import _get_loop, sync

T = TypeVar("T")

# a shard index entry's offset (and length) for an inner chunk the shard holds no bytes of
NO_INNER_CHUNK = MAX_UINT_64


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on zarr's event loop and wait for its result (``timeout`` s at most, ``TimeoutError`` after).

    Why: zarr's stores (fsspec's sessions among them) are bound to zarr's own loop, which runs in a thread of its
    own; ``zarr.core.sync.sync`` is how zarr itself calls them from synchronous code, and no public function
    does the same."""
    return sync(coro, timeout=timeout)


def event_loop() -> asyncio.AbstractEventLoop:
    """zarr's event loop (started if it is not yet), to schedule requests on without a thread waiting for them.

    Why: ``zarr.core.sync._get_loop`` is the only way to reach it; requests made on another loop would open
    sessions of their own, and block in a thread each."""
    return _get_loop()


def chunk_spec(arr: zarr.Array, coords: tuple[int, ...]):
    """zarr's description of the chunk at ``coords`` of ``arr``'s chunk grid, as its codecs decode it: an
    ``ArraySpec`` whose ``shape`` and ``fill_value`` the callers read (the chunk's full shape, edge chunks
    included, and the array's fill value).

    Why: the codec pipeline decodes from this spec, which only zarr's internal metadata builds
    (``metadata.get_chunk_spec``, with the array's config; a Zarr v2 array's memory order lives in its
    metadata, not its config)."""
    inner = _async_array(arr)
    config = replace(inner.config, order=inner.order) if inner.metadata.zarr_format == 2 else inner.config
    return inner.metadata.get_chunk_spec(coords, config, prototype=default_buffer_prototype())


def _async_array(arr: zarr.Array) -> zarr.AsyncArray:
    """The array's asynchronous twin, whose metadata, config and codec pipeline the chunk reads use. Why: public as
    ``Array.async_array`` only in later zarr 3.1 releases (zarrtorch supports 3.1.0): the private ``_async_array``
    before."""
    return arr.async_array if hasattr(type(arr), "async_array") else arr._async_array


def array_on_store(arr: zarr.Array, store) -> zarr.Array:
    """``arr`` (its metadata as opened, its path and config) reading from ``store`` instead of its own: a wrapper
    of it, such as the chunk cache's (:mod:`zarrtorch._read.cache`).

    Why: no public function makes an array over another store without reading its metadata again (a request,
    and for an array of a consolidated group its own document, not the copy it was opened from); zarr builds one
    from ``AsyncArray(metadata, store_path, config)``."""
    from zarr.storage import StorePath

    inner = _async_array(arr)
    return zarr.Array(
        zarr.AsyncArray(metadata=inner.metadata, store_path=StorePath(store, arr.path), config=inner.config)
    )


def chunk_nbytes(spec) -> int:
    """Bytes of the chunk ``spec`` describes, decoded. Why: the spec's dtype is zarr's own data type class, whose
    numpy dtype is reached through ``to_native_dtype``."""
    return math.prod(spec.shape) * spec.dtype.to_native_dtype().itemsize


async def decode_chunk(arr: zarr.Array, raw, spec) -> np.ndarray | None:
    """The stored bytes ``raw`` (a zarr buffer) of one chunk decoded by ``arr``'s codecs, as a numpy array
    (``None`` where the pipeline gives nothing: it treats such a chunk as missing).

    Why: an array's codec pipeline (``AsyncArray.codec_pipeline``) is the only way to decode one chunk's bytes
    with the array's own codecs, filters and v2 compressor; zarr calls it internally."""
    (decoded,) = await _async_array(arr).codec_pipeline.decode([(raw, spec)])
    return None if decoded is None else decoded.as_numpy_array()


def shard_index_size(codec: ShardingCodec, spec) -> int:
    """Bytes of the index of a shard ``spec`` describes (at its start or end, ``codec.index_location``).

    Why: the sharding codec computes it privately (``_shard_index_size`` of ``_get_chunks_per_shard``); the
    index is read and checked before the shard is decoded, which would read a missing inner chunk as fill."""
    return codec._shard_index_size(codec._get_chunks_per_shard(spec))


async def shard_index(codec: ShardingCodec, raw, spec) -> np.ndarray:
    """The index of the shard whose stored bytes are ``raw`` (at least :func:`shard_index_size` long): an array
    of the shard's inner chunk grid, each entry ``(offset, length)`` of the inner chunk's bytes in the shard,
    :data:`NO_INNER_CHUNK` for one the shard holds no bytes of.

    Why: the sharding codec decodes its index privately (``_decode_shard_index``), and exposes no index."""
    per_shard = codec._get_chunks_per_shard(spec)
    size = codec._shard_index_size(per_shard)
    at_start = codec.index_location == ShardingCodecIndexLocation.start
    index = await codec._decode_shard_index(raw[:size] if at_start else raw[len(raw) - size :], per_shard)
    return index.offsets_and_lengths


def decode_shard_index(codec: ShardingCodec, stored: bytes, spec) -> np.ndarray:
    """:func:`shard_index` of a shard's index alone (``stored``: its :func:`shard_index_size` bytes, read by
    byte range), decoded and checked (its checksum) by the codec's own index codecs.

    Why: as :func:`shard_index`; the loader reads only a shard's index and the inner chunks a piece needs."""
    return run(shard_index(codec, default_buffer_prototype().buffer.from_bytes(stored), spec))
