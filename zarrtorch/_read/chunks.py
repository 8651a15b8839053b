"""Read one whole chunk of any Zarr array through zarr's own codecs, with the loader's deadline and checks.

Arrays in the common layouts are decoded by :mod:`zarrtorch._read.fastpath`. Every other one (filters, F order,
other codecs: :func:`zarrtorch._read.fastpath.read_path` says which) goes through here rather than
``array[start:stop]``, which waits on a remote
request without a deadline, reads a missing chunk (or a shard's missing inner chunk) as fill values, and
would need a second request to tell. Here each chunk is one request (with a deadline and retries for a
remote store, :mod:`zarrtorch._read.fetch`), decoded by the array's codec pipeline and checked to be the whole
chunk; a shard's index is checked first: every inner chunk inside the array present, and within the shard.

zarr's internal API it needs (the codec pipeline, chunk specs, the shard index) is reached through
:mod:`zarrtorch._compat.zarr`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable

import numcodecs
import numpy as np
import zarr
from zarr.abc.store import RangeByteRequest
from zarr.buffer import default_buffer_prototype
from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, ShardingCodec

from zarrtorch._compat.zarr import (
    NO_INNER_CHUNK,
    chunk_nbytes,
    chunk_spec,
    decode_chunk,
    run,
    shard_index,
    shard_index_size,
)
from zarrtorch._read.fetch import RetryPolicy, get_buffer, with_retries, within
from zarrtorch._util.sizes import ceil_div

# what to do about a chunk with no stored object, in every message that names one (zarrtorch._read.listing)
IF_SKIPPED = (
    "If this store was written with write_empty_chunks=False (zarr's default), which stores no chunk equal to the "
    "fill value everywhere, pass ReadOptions(missing_chunks='fill'); else the store is incomplete: rewrite it "
    "(zarrtorch.prepare_zarr writes every chunk)"
)


def fill_text(fill_value) -> str:
    """An array's fill value as a message shows it (what zarr reads a missing chunk as; 0 where none is set)."""
    return repr(np.asarray(0 if fill_value is None else fill_value).item())


def chunk_key(arr: zarr.Array, chunk: int) -> str:
    """The store key of chunk (or shard) ``chunk`` along the first axis of a first-axis-chunked array."""
    return key_at(arr, (chunk,) + (0,) * (arr.ndim - 1))


def chunk_keys(arr: zarr.Array) -> Callable[[int], str]:
    """:func:`chunk_key` of ``arr`` as a function of the chunk alone, built once: the key's text around the
    first coordinate, kept, with the chunk's number put between (zarr's encoder, called per chunk, was a
    tenth of the time the reading threads held the GIL with one-step chunks). Zarr's own encoder where a
    key is not made that way."""
    mark = 987654321
    around = chunk_key(arr, mark).split(str(mark))
    if len(around) != 2:
        return functools.partial(chunk_key, arr)
    before, after = around

    def keys(chunk: int) -> str:
        return f"{before}{chunk}{after}"

    if any(keys(c) != chunk_key(arr, c) for c in (0, 1, 10, 123)):
        return functools.partial(chunk_key, arr)
    return keys


def key_at(arr: zarr.Array, coords: tuple[int, ...]) -> str:
    """The store key of the chunk (or shard) at ``coords`` of the array's chunk grid."""
    return f"{arr.store_path.path}/{arr.metadata.encode_chunk_key(coords)}".lstrip("/")


def read_chunk(arr: zarr.Array, chunk: int, *, policy: RetryPolicy | None, check_missing: bool = True) -> np.ndarray:
    """Chunk ``chunk`` of ``arr`` decoded whole (rows ``chunk * chunk_rows`` on). ``policy=None``: one
    attempt without a deadline (a local store). ``FileNotFoundError`` for a missing chunk; ``ValueError``
    for bytes that do not decode to exactly the chunk, or a shard whose index is damaged or (with
    ``check_missing``) lacks an inner chunk."""
    return run(_read_chunk(arr, chunk, policy, check_missing))


async def _read_chunk(arr: zarr.Array, chunk: int, policy: RetryPolicy | None, check_missing: bool) -> np.ndarray:
    return await _read_chunk_at(arr, (chunk,) + (0,) * (arr.ndim - 1), policy, check_missing)


async def _read_chunk_at(
    arr: zarr.Array, coords: tuple[int, ...], policy: RetryPolicy | None, check_missing: bool
) -> np.ndarray:
    spec = chunk_spec(arr, coords)
    raw = await get_buffer(arr.store_path.store, key_at(arr, coords), policy)
    codecs = getattr(arr.metadata, "codecs", ())
    _check_framing(arr.metadata, spec, raw)
    if codecs and isinstance(codecs[0], ShardingCodec):  # first-axis-chunked arrays only (read_whole refuses others)
        rows = min(spec.shape[0], arr.shape[0] - coords[0] * spec.shape[0])
        await _check_shard(codecs[0], raw, spec, rows, check_missing)
    decoded = await decode_chunk(arr, raw, spec)
    if decoded is None or tuple(decoded.shape) != tuple(spec.shape):
        got = "nothing" if decoded is None else f"shape {tuple(decoded.shape)}"
        raise ValueError(f"its {len(raw)} stored bytes decode to {got}, not the chunk's shape {tuple(spec.shape)}")
    return decoded


def read_whole(
    arr: zarr.Array, *, policy: RetryPolicy | None, check_missing: bool = True, fail: Callable | None = None
) -> np.ndarray:
    """The whole of a small array (a static field: orography, a land-sea mask), every chunk read and checked as
    the loader's chunks are, instead of ``arr[...]``: that reads a missing chunk as fill values and waits on a
    remote request without a deadline. ``fail(coords, key, exc)`` turns a chunk's error into the caller's
    (``FileNotFoundError`` for a missing one, with ``check_missing``; otherwise the fill value, as zarr reads
    it). Sharded arrays are refused with ``ValueError``: their index is checked along the first axis only."""
    if getattr(arr, "shards", None) is not None:
        raise ValueError("it is sharded: a static array is read whole once, so write it without shards")
    grid = tuple(ceil_div(n, c) for n, c in zip(arr.shape, arr.chunks, strict=True))
    out = np.empty(arr.shape, dtype=arr.dtype)
    fill = arr.fill_value if arr.fill_value is not None else 0

    async def one(coords):
        where = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(coords, arr.chunks, arr.shape, strict=True))
        try:
            whole = await _read_chunk_at(arr, coords, policy, check_missing)
        except FileNotFoundError as exc:
            if check_missing:
                raise (fail(coords, key_at(arr, coords), exc) if fail else exc) from None
            out[where] = fill
            return
        except Exception as exc:  # noqa: BLE001 (any failure of one chunk is the caller's error, naming the chunk)
            raise (fail(coords, key_at(arr, coords), exc) if fail else exc) from None
        out[where] = whole[tuple(slice(0, s.stop - s.start) for s in where)]

    async def every():
        await asyncio.gather(*(one(c) for c in itertools.product(*(range(g) for g in grid))))

    run(every())
    return out


def _check_framing(metadata, spec, raw) -> None:
    """Refuse a chunk with bytes after its compressed stream, which Blosc (and gzip, for zero bytes) would
    ignore: the file was lengthened or overwritten in part, and holds something other than what was written.
    Blosc's header states its frame's length; gzip's last four bytes state the decoded length."""
    if metadata.zarr_format == 2:
        outer = metadata.compressor
        only = not metadata.filters
        blosc, gzip = isinstance(outer, numcodecs.Blosc), isinstance(outer, numcodecs.GZip)
    else:
        codecs = tuple(metadata.codecs)
        blosc = bool(codecs) and isinstance(codecs[-1], BloscCodec)
        gzip = bool(codecs) and isinstance(codecs[-1], GzipCodec)
        only = len(codecs) == 2 and isinstance(codecs[0], BytesCodec)
    if blosc and len(raw) >= 16:  # shorter: too short for a header, which Blosc itself refuses
        framed = int.from_bytes(raw[12:16].to_bytes(), "little")
        if framed != len(raw):
            raise ValueError(f"its Blosc frame says {framed} bytes, the stored chunk has {len(raw)}: it is damaged")
    if gzip and only and len(raw) >= 18:
        stated = int.from_bytes(raw[len(raw) - 4 :].to_bytes(), "little")
        nbytes = chunk_nbytes(spec)
        if stated != nbytes % 2**32:
            raise ValueError(
                f"its gzip stream ends saying {stated} bytes where the chunk holds {nbytes}: it is damaged"
            )


def missing_inner_message(absent: list[tuple[int, ...]], fill_value) -> str:
    """What is wrong with a shard that lacks the inner chunks at ``absent`` (their coordinates in the shard)."""
    return (
        f"the shard has no bytes for its inner chunk(s) {absent[:8]}{' ...' if len(absent) > 8 else ''} (their "
        f"coordinates in the shard): zarr would read them as the fill value {fill_text(fill_value)}. {IF_SKIPPED}"
    )


async def _check_shard(codec: ShardingCodec, raw, spec, rows: int, check_missing: bool) -> None:
    """Refuse a shard whose index cannot be read, points outside the shard, or (``check_missing``) lacks an
    inner chunk holding some of its ``rows`` rows: zarr would read such an inner chunk as the fill value."""
    size = shard_index_size(codec, spec)
    if len(raw) < size:
        raise ValueError(f"the shard holds {len(raw)} bytes, fewer than its index alone ({size})")
    grid = (await shard_index(codec, raw, spec))[: ceil_div(rows, codec.chunk_shape[0])]
    entries = grid.reshape(-1, 2)
    present = entries[:, 0] != NO_INNER_CHUNK
    if check_missing and not present.all():
        absent = [tuple(c) for c in np.argwhere(grid[..., 0] == NO_INNER_CHUNK).tolist()]  # inner chunks' coordinates
        raise ValueError(missing_inner_message(absent, spec.fill_value))
    ends = entries[present, 0].astype(np.uint64) + entries[present, 1].astype(np.uint64)
    if len(ends) and int(ends.max()) > len(raw):
        raise ValueError(f"the shard's index points past its {len(raw)} bytes: it is cut short or damaged")


FINGERPRINT_BYTES = 1 << 16  # of a chunk (or a whole shard, hundreds of MiB) hashed to tell two stores apart


def first_bytes(arr: zarr.Array, size: int, policy: RetryPolicy | None) -> bytes | None:
    """The first ``size`` bytes of ``arr``'s first stored object (a range request), ``None`` where it is missing."""
    store, key = arr.store_path.store, chunk_key(arr, 0)

    async def head():
        return await store.get(key, default_buffer_prototype(), byte_range=RangeByteRequest(0, size))

    try:
        got = run(head()) if policy is None else with_retries(lambda: within(head(), policy.timeout_s), policy)
    except FileNotFoundError:
        return None
    return None if got is None else got.to_bytes()
