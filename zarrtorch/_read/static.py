"""A window's static arrays (no time axis: orography, a land-sea mask), read whole once, checked like chunks.

They were read with ``array[...]``, outside every safeguard of the time arrays: a missing chunk came back as
zeros in every batch, and a request that never answered held the dataset's constructor for minutes whatever
the ``RetryPolicy``. Here each chunk is one checked read (:func:`zarrtorch._read.chunks.read_whole`) and a
failure is a :class:`~zarrtorch._read.reader.ChunkReadError` naming the array, the chunk and the store.
"""

from __future__ import annotations

import numpy as np
import zarr

from zarrtorch._read.chunks import IF_SKIPPED, fill_text, read_whole
from zarrtorch._read.fetch import RetryPolicy
from zarrtorch._read.reader import ChunkReadError
from zarrtorch._read.source import dimension_names, is_local, redact, store_label


def static_array(
    name: str, arr: zarr.Array, *, retry: RetryPolicy, check_missing: bool = True, secrets: tuple[str, ...] = ()
) -> np.ndarray:
    """The whole of static array ``name``, or a :class:`ChunkReadError` saying which chunk failed and why
    (``retry``: a remote store's deadline and retries; ``check_missing``: a chunk with no stored object is an
    error, else the fill value; ``secrets``: never shown in a message)."""

    def where(coords, key) -> str:
        return f"chunk {tuple(coords)} of static array {name!r}, key {key!r} in store {store_label(arr, secrets)}"

    def fail(coords, key, exc) -> ChunkReadError:
        if isinstance(exc, FileNotFoundError):
            return ChunkReadError(
                f"missing {where(coords, key)}: Zarr would read it as the fill value {fill_text(arr.fill_value)}. "
                f"{IF_SKIPPED}."
            )
        return ChunkReadError(f"cannot read {where(coords, key)}: {redact(f'{type(exc).__name__}: {exc}', secrets)}")

    policy = None if is_local(arr) else retry
    try:
        return read_whole(arr, policy=policy, check_missing=check_missing, fail=fail)
    except ValueError as exc:  # refused before any read (a sharded static array)
        raise ValueError(f"static array {name!r}: {exc}") from None


def check_static(name: str, arr: zarr.Array, time_arrays: dict[str, zarr.Array]) -> None:
    """Refuse a "static" array whose dimension names say it runs along the time arrays' first dimension: it changes
    with every row, and read whole it would go into every process and every sample."""
    named = dimension_names(arr)
    rows = {tuple(d)[0]: a.shape[0] for a in time_arrays.values() if (d := dimension_names(a))}
    dim = tuple(named)[0] if named else None
    if dim in rows and arr.shape[0] == rows[dim]:  # one step of a "time" axis of its own is static
        raise ValueError(
            f"static array {name!r} runs along the time arrays' dimension {dim!r} ({arr.shape[0]} rows): it changes "
            "with every row, so it is not static, and each sample would carry all of it. Give it as an input "
            f"(Windows(inputs=...)), or keep one step of it before writing the store (xarray: ds[{name!r}].isel("
            f"{dim}=0)); an invariant field merged with the time fields gets their time axis (xarray's outer join)"
        )
