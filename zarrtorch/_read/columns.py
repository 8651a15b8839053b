"""CF packing: arrays stored as scaled integers with a fill value, decoded as xarray decodes them.

Reanalysis and climate-model downloads (ERA5, CMIP) often pack a field into int16 with ``scale_factor``,
``add_offset`` and ``_FillValue`` attributes (or ``missing_value``): the value is ``packed * scale_factor +
add_offset``, and the fill marks a missing value. Zarr returns the packed integers; streaming them raw would
train on -32768 where xarray shows NaN. The loader keeps the packed rows in its buffer (half the memory of
floats) and decodes each batch as it is gathered: float32 (float64 for 32-bit and wider packed integers),
NaN where the fill was. Arrays with CF-encoded times (``units: "hours since ..."``) are refused: decode them
with xarray and write them again with :func:`zarrtorch.prepare_zarr`, or leave them out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import zarr


@dataclass(frozen=True)
class Packing:
    """How one array is packed: ``value = packed * scale + offset``, ``fills`` mark missing values."""

    scale: float
    offset: float
    fills: tuple[float, ...]
    wrap: int  # netCDF-3's _Unsigned: 2**bits added to negative integers (they are unsigned ones), else 0
    dtype: np.dtype  # what the rows decode to

    def decode(self, rows: np.ndarray) -> None:
        """Decode ``rows`` in place: a ``dtype`` array holding the packed integers, cast."""
        if self.wrap:
            rows[rows < 0] += self.wrap
        missing = np.isin(rows, self.fills) if self.fills else None
        if self.scale != 1.0:
            rows *= self.scale
        if self.offset != 0.0:
            rows += self.offset
        if missing is not None:
            rows[missing] = np.nan


def _number(value, name: str, where: str) -> float:
    try:
        return float(np.asarray(value).reshape(-1)[0])
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"array {where!r} has a {name} of {value!r}, not a number: fix the attribute") from None


def packing(name: str, arr: zarr.Array) -> Packing | None:
    """The array's CF packing, or ``None`` when it is stored as its values (then it is streamed as it is)."""
    attrs = dict(arr.attrs)
    units = str(attrs.get("units", ""))
    if " since " in units:
        raise ValueError(
            f"array {name!r} holds CF-encoded times (units {units!r}): leave it out (arrays=[...]), or decode it "
            "with xarray and write it again with zarrtorch.prepare_zarr"
        )
    dtype = np.dtype(arr.dtype)
    scale = _number(attrs.get("scale_factor", 1.0), "scale_factor", name)
    offset = _number(attrs.get("add_offset", 0.0), "add_offset", name)
    fills = [attrs[k] for k in ("_FillValue", "missing_value") if k in attrs]
    if arr.metadata.zarr_format == 2 and "_ARRAY_DIMENSIONS" in attrs and arr.fill_value is not None:
        fills.append(arr.fill_value)  # xarray writes a v2 array's _FillValue as its Zarr fill value
    packed = "scale_factor" in attrs or "add_offset" in attrs
    if not packed and (dtype.kind == "f" or not fills):
        return None  # floats with a NaN (or no) fill read as xarray reads them; integers without a fill too
    wrap = 2 ** (8 * dtype.itemsize) if str(attrs.get("_Unsigned", "")).lower() == "true" and dtype.kind == "i" else 0
    wide = dtype.itemsize >= (8 if dtype.kind == "f" else 4)  # float32 cannot hold every such value exactly
    values = [_number(f, "fill value", name) for f in fills]
    values = [v % wrap if wrap else v for v in values if not np.isnan(v)]
    return Packing(scale, offset, tuple(values), wrap, np.dtype(np.float64 if wide else np.float32))


def packings(arrays: dict[str, zarr.Array], decode: bool = True) -> dict[str, Packing]:
    """The packing of every packed array (none with ``decode=False``)."""
    if not decode:
        return {}
    found = {n: packing(n, a) for n, a in arrays.items()}
    return {n: p for n, p in found.items() if p is not None}


# -- several arrays stacked into one channel axis ------------------------------------------------------------
def check_stack(stack: Mapping[str, Sequence[str]] | None, columns: Mapping) -> dict[str, list[str]]:
    """``{output name: [array names]}``, checked against the loaded arrays (``columns``: name -> (row shape,
    dtype) as batches hold them): they must exist, appear in one stack only, and share one row shape and dtype."""
    stack = {str(k): list(v) for k, v in (stack or {}).items()}
    used: list[str] = [n for names in stack.values() for n in names]
    for out, names in stack.items():
        if not names:
            raise ValueError(f"stack {out!r} lists no arrays")
        missing = [n for n in names if n not in columns]
        if missing:
            raise KeyError(f"stack {out!r} names {missing}, which are not loaded: available are {sorted(columns)}")
        kinds = {(tuple(columns[n][0]), np.dtype(columns[n][1])) for n in names}
        if len(kinds) > 1:
            raise ValueError(f"stack {out!r} mixes row shapes/dtypes {sorted(map(str, kinds))}: stack arrays alike")
        if out in columns and out not in names:
            raise ValueError(f"stack name {out!r} is also an array's name: choose another")
    twice = sorted({n for n in used if used.count(n) > 1})
    if twice:
        raise ValueError(f"arrays {twice} appear in more than one stack")
    return stack


def stack_columns(batch: dict[str, np.ndarray], stack: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """The batch with each stack's arrays replaced by one array, the listed order along axis 1."""
    if not stack:
        return batch
    out = {n: a for n, a in batch.items() if not any(n in names for names in stack.values())}
    for name, names in stack.items():
        out[name] = np.stack([batch[n] for n in names], axis=1)
    return out
