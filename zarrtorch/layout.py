"""Check that a set of Zarr arrays can be streamed row by row: one first-axis layout shared by all.

The loader distributes whole chunks (whole shards, for a sharded Zarr v3 array), so every array must be
chunked (sharded) along the first axis only, and all arrays must have the same number of rows and the same
chunk length (otherwise chunk ``i`` of one array holds other rows than chunk ``i`` of another, and samples
would be paired with the wrong targets).
``prepare_zarr`` writes stores that pass; the loader runs the same check before reading anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import zarr
from zarr.codecs import ShardingCodec

from zarrtorch._util.sizes import ceil_div

FIX_HINT = "rewrite it with zarrtorch.prepare_zarr(...), which chunks along the first axis only"


class LayoutError(ValueError):
    """The arrays cannot be streamed as they are; the message names the array and the fix."""


@dataclass(frozen=True)
class FirstAxisLayout:
    """What the partitioning needs to know: rows, the length of a read unit, and whether it is a shard."""

    rows: int
    chunk_rows: int
    sharded: bool = False

    @property
    def n_chunks(self) -> int:
        return ceil_div(self.rows, self.chunk_rows)


def _read_unit(name: str, arr: zarr.Array) -> tuple[tuple[int, ...], bool]:
    """The block the loader reads at once: the chunk, or for a sharded array the whole shard, which is then
    also the unit distributed to ranks and workers and shuffled (a shard is one object in the store: reading
    it whole is one request, and splitting it between processes would read it more than once)."""
    shards = getattr(arr, "shards", None)
    if shards is None:
        _refuse_shards_compressed_again(name, arr)
        return tuple(arr.chunks), False
    return tuple(shards), True


def _refuse_shards_compressed_again(name: str, arr: zarr.Array) -> None:
    """A sharding codec followed by other codecs hides each shard's index inside bytes compressed again: a shard
    can then be read only whole, and an inner chunk left out of it could not be told from its fill values."""
    codecs = getattr(arr.metadata, "codecs", ())
    if any(isinstance(c, ShardingCodec) for c in codecs):
        after = " + ".join(type(c).__name__ for c in codecs[1:])
        raise LayoutError(
            f"array {name!r} compresses each shard again as a whole (a sharding codec followed by {after}): "
            "the loader cannot check its shards' inner chunks; " + FIX_HINT + " (with shard_chunks=N for shards)"
        )


def check_missing_chunks_can_be_told(arrays: Mapping[str, zarr.Array], missing_chunks: str) -> None:
    """Refuse nested shards (inner chunks sharded again) under ``missing_chunks="error"``: zarr reads an inner
    chunk left out of an inner shard as fill values, and the loader cannot see inside the inner shards to tell
    it from a chunk that was written, so the default could not keep its promise to raise."""
    if missing_chunks != "error":
        return
    for name, arr in arrays.items():
        codecs = getattr(arr.metadata, "codecs", ())
        if (
            codecs
            and isinstance(codecs[0], ShardingCodec)
            and any(isinstance(c, ShardingCodec) for c in codecs[0].codecs)
        ):
            raise LayoutError(
                f"array {name!r} nests shards in shards (its inner chunks are sharded again): an inner chunk left "
                "out of an inner shard would be read as fill values, which the loader cannot tell from a chunk "
                "that was lost. " + FIX_HINT + " (with shard_chunks=N for one level of shards), or, if its left-out "
                "chunks are fill values by design, pass ReadOptions(missing_chunks='fill')"
            )


def check_first_axis_layout(arrays: Mapping[str, zarr.Array]) -> FirstAxisLayout:
    """Return the shared layout of ``arrays`` or raise :class:`LayoutError` saying what is wrong and how to fix it."""
    if not arrays:
        raise LayoutError("no arrays to load: give at least one array name (or a group that holds arrays)")
    layouts: dict[str, tuple[int, int, bool]] = {}
    for name, arr in arrays.items():
        if not isinstance(arr, zarr.Array):
            raise TypeError(
                f"{name!r} is a {type(arr).__name__}, not a zarr.Array: open it with zarr.open_array(...) "
                "or write it to a store with zarrtorch.prepare_zarr(...)"
            )
        if arr.ndim == 0:
            raise LayoutError(f"array {name!r} is a scalar (shape ()): samples need at least one axis")
        unit, sharded = _read_unit(name, arr)
        for axis in range(1, arr.ndim):
            if unit[axis] != arr.shape[axis]:
                what = "shards" if sharded else "chunks"
                raise LayoutError(
                    f"array {name!r} is chunked along axis {axis} ({what} {unit} for shape {tuple(arr.shape)}): "
                    f"training needs {what} along the first axis only, i.e. ({unit[0]}, "
                    + ", ".join(str(s) for s in arr.shape[1:])
                    + f"); {FIX_HINT}"
                )
        if arr.shape[0] == 0:
            raise LayoutError(f"array {name!r} has zero rows (shape {tuple(arr.shape)}): there is nothing to load")
        layouts[name] = (int(arr.shape[0]), int(unit[0]), sharded)

    first_name, (rows, chunk_rows, sharded) = next(iter(layouts.items()))
    for name, (r, c, s) in layouts.items():
        if r != rows:
            raise LayoutError(
                f"arrays have different first-axis lengths: {first_name!r} has {rows} rows, {name!r} has {r}. "
                "Every array must hold one row per sample; select arrays of the same length."
            )
        if c != chunk_rows:
            raise LayoutError(
                f"arrays have different chunk lengths along the first axis: {first_name!r} uses {chunk_rows} rows "
                f"per chunk, {name!r} uses {c}. Chunk i would hold different samples in each array; "
                f"{FIX_HINT} with one chunk_rows for all arrays."
            )
        if s != sharded:
            raise LayoutError(
                f"{first_name!r} and {name!r} differ in sharding: shard all arrays the same way or none of them"
            )
    return FirstAxisLayout(rows=rows, chunk_rows=chunk_rows, sharded=sharded)


def restrict_rows(layout: FirstAxisLayout, row_range: tuple[int, int]) -> tuple[int, FirstAxisLayout]:
    """Offset and layout of a chunk-aligned row window (a split that keeps whole chunks)."""
    start, stop = (int(v) for v in row_range)
    c = layout.chunk_rows
    if not 0 <= start < stop <= layout.rows:
        raise ValueError(f"row_range {row_range} must satisfy 0 <= start < stop <= {layout.rows} (the rows)")
    if start % c or (stop % c and stop != layout.rows):
        raise ValueError(
            f"row_range {row_range} must start on a chunk boundary (a multiple of {c}) and end on one "
            f"or at the last row ({layout.rows}), so that chunks are not shared between splits"
        )
    return start, FirstAxisLayout(rows=stop - start, chunk_rows=c, sharded=layout.sharded)
