"""Which chunks a store holds, from one listing of each array's keys, to name missing chunks at construction.

zarr stores no object for a chunk equal to the fill value everywhere unless it writes with
``write_empty_chunks=True`` (its default is False), and records nowhere whether it skipped any: a missing
chunk may hold fill values on purpose or be lost, and only the user can say which
(``ReadOptions(missing_chunks=...)``). Stores written by :func:`zarrtorch.prepare_zarr` say they hold every
chunk (``every_chunk_written`` in the group's ``zarrtorch`` attributes) and are not listed. Any other store
is listed once per array where it can list (a directory walk, a prefix listing of object storage: never a
request per chunk); a store read over HTTP has no listing, and its missing chunks are found as they are read.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

import numpy as np
import zarr

from zarrtorch._compat.zarr import run
from zarrtorch._read.chunks import IF_SKIPPED, chunk_keys, fill_text
from zarrtorch._read.fetch import RetryPolicy
from zarrtorch._read.reader import ChunkReadError
from zarrtorch._read.source import store_label

EVERY_CHUNK_WRITTEN = "every_chunk_written"  # in a group's "zarrtorch" attributes: its variables hold every chunk
SHOWN = 5  # missing chunks a message lists


def written_whole(source, arrays: Mapping[str, zarr.Array]) -> frozenset[str]:
    """The names of ``arrays`` that ``source`` (a group written by ``prepare_zarr``) says hold every chunk: those it
    lists as its variables, not an array added to the group since."""
    meta = source.attrs.get("zarrtorch") if isinstance(source, zarr.Group) else None
    if not isinstance(meta, Mapping) or meta.get(EVERY_CHUNK_WRITTEN) is not True:
        return frozenset()
    paths = {f"{source.path}/{name}".strip("/") for name in meta.get("variables", ())}
    return frozenset(name for name, arr in arrays.items() if arr.path in paths)


def can_list(arr: zarr.Array) -> bool:
    """Whether the array's store lists its keys: not over HTTP, where a "listing" is a page per directory."""
    store = arr.store_path.store
    if not getattr(store, "supports_listing", False):
        return False
    protocols = getattr(getattr(store, "fs", None), "protocol", ()) or ()
    protocols = (protocols,) if isinstance(protocols, str) else protocols
    return not any(str(p).startswith("http") for p in protocols)


def stored_keys(arr: zarr.Array, policy: RetryPolicy) -> set[str] | None:
    """Every key stored under the array, from one listing (``None`` where the store cannot list, or its listing is
    refused, fails on the file system or stalls: its missing chunks are then found as they are read, every read
    checked). A remote listing's pages each get the policy's deadline. Any other error is the store's to say."""
    if not can_list(arr):
        return None
    store = arr.store_path.store
    prefix = f"{arr.path}/" if arr.path else ""
    try:
        if isinstance(store, zarr.storage.LocalStore):
            return _walked(os.fspath(store.root), prefix)
        return run(_listed(store, prefix, policy.timeout_s))
    except (OSError, NotImplementedError):  # refused, unreadable, stalled (TimeoutError), or no listing after all
        return None


def _walked(root: str, prefix: str) -> set[str]:
    """The files under ``root/prefix`` as store keys (one directory walk: no stat of each file), through links to
    folders too (zarr reads a chunk behind one). A folder that cannot be read fails the listing: its chunks are not
    missing."""
    keys: set[str] = set()
    top = os.path.join(root, prefix)
    if not os.path.isdir(top):  # no chunk written yet
        return keys
    for folder, _, files in os.walk(top, followlinks=True, onerror=_unreadable):
        inside = os.path.relpath(folder, root).replace(os.sep, "/")
        keys.update(f"{inside}/{name}" if inside != "." else name for name in files)
    return keys


def _unreadable(error: OSError) -> None:
    raise error


async def _listed(store, prefix: str, timeout_s: float) -> set[str]:
    keys: set[str] = set()
    async with asyncio.timeout(timeout_s) as deadline:
        async for key in store.list_prefix(prefix):
            keys.add(key)
            if len(keys) % 256 == 0:  # a page of keys arrived: the next one gets a deadline of its own
                deadline.reschedule(asyncio.get_running_loop().time() + timeout_s)
    return keys


def unit_rows(arr: zarr.Array) -> int:
    """Rows of one stored object of a first-axis-chunked array: a chunk, or a shard."""
    return int((arr.shards or arr.chunks)[0])


def chunks_of(spans, unit: int) -> np.ndarray:
    """The first-axis chunks of ``unit`` rows holding rows of ``spans`` (``[start, stop)`` store rows), sorted."""
    found = [np.arange(a // unit, (b - 1) // unit + 1) for a, b in spans if b > a]
    return np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)


def missing_chunks(arr: zarr.Array, spans, policy: RetryPolicy) -> tuple[list[int], int] | None:
    """(the chunks, or shards, of ``spans``'s rows with no stored object, how many chunks those rows span), from one
    listing; ``None`` where the store cannot be listed."""
    wanted = chunks_of(spans, unit_rows(arr))
    if 0 in arr.shape[1:]:  # rows of no element: zarr stores no chunk, and none is read
        return [], len(wanted)
    keys = stored_keys(arr, policy)
    if keys is None:
        return None
    key_of = chunk_keys(arr)
    return [int(c) for c in wanted.tolist() if key_of(c) not in keys], len(wanted)


def shown(chunks: list[int]) -> str:
    """The first :data:`SHOWN` chunks, as a list that says when there are more."""
    return "[" + ", ".join(map(str, chunks[:SHOWN])) + (", ...]" if len(chunks) > SHOWN else "]")


def check_listed(arrays: Mapping[str, zarr.Array], spans, *, skip, policy: RetryPolicy, secrets=()) -> None:
    """Refuse arrays (but those of ``skip``) with chunks missing in ``spans``'s rows, found by one listing each:
    a :class:`ChunkReadError` naming the first, how many, the fill value and ``ReadOptions(missing_chunks='fill')``."""
    found = {}
    for name, arr in arrays.items():
        listed = missing_chunks(arr, spans, policy) if name not in skip else None
        if listed is not None and listed[0]:
            found[name] = listed
    if found:
        raise ChunkReadError(missing_message(arrays, found, secrets))


def missing_message(arrays: Mapping[str, zarr.Array], found: dict[str, tuple[list[int], int]], secrets=()) -> str:
    """What :func:`check_listed` says: the first array's first missing chunk, then each array's count."""
    (name, (missing, total)), *others = found.items()
    arr = arrays[name]
    first = missing[0]
    text = (
        f"missing chunk {first} of array {name!r} (key {chunk_keys(arr)(first)!r}) in store "
        f"{store_label(arr, secrets)}: no object is stored for {len(missing)} of its {total} chunks in the rows read "
        f"{shown(missing)}, which Zarr would read as the fill value {fill_text(arr.fill_value)}"
    )
    for other, (gone, of) in others:
        text += (
            f"; array {other!r} too: {len(gone)} of its {of} chunks {shown(gone)} (fill value "
            f"{fill_text(arrays[other].fill_value)})"
        )
    return f"{text}. {IF_SKIPPED}."
