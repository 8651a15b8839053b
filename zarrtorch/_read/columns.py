"""CF packing: arrays stored as scaled integers with a fill value, decoded as xarray decodes them.

Reanalysis and climate-model downloads (ERA5, CMIP) often pack a field into int16 with ``scale_factor``,
``add_offset`` and ``_FillValue`` attributes (or ``missing_value``): the value is ``packed * scale_factor +
add_offset``, and the fill marks a missing value. Zarr returns the packed integers; streaming them raw would
train on -32768 where xarray shows NaN. The loader keeps the packed rows in its buffer (half the memory of
floats) and decodes each batch as it is gathered: float32 (float64 for 32-bit and wider packed integers),
NaN where the fill was. A float array's fill that is a number (-9999) is NaN too, as xarray shows it; xarray's
base64 fill values (Zarr v3) are read; booleans are streamed as stored. Arrays with CF-encoded times
(``units: "hours since ..."``), dates, durations and text are refused by name: decode or encode them as numbers
and write them again with :func:`zarrtorch.prepare_zarr`, or leave them out.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import zarr

from zarrtorch._util.arguments import names
from zarrtorch._util.sizes import native


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


NOT_TENSORS = "MmOSUV"  # dtype kinds a tensor cannot hold: dates, durations, objects, bytes, text, void


def check_tensor_dtypes(arrays: Mapping[str, zarr.Array], chosen: bool) -> None:
    """Refuse arrays a tensor cannot hold (text, dates, durations, objects) before the first batch, by name:
    picked from a store by default, a text variable along time once failed inside ``torch.from_numpy``
    at the first batch, naming nothing. ``chosen``: the user named the arrays (``variables=``)."""
    for name, arr in arrays.items():
        dtype = np.dtype(arr.dtype)
        if dtype.kind not in NOT_TENSORS:
            continue
        what = {"M": "dates", "m": "durations"}.get(dtype.kind, "text or objects")
        fix = (
            "convert them to numbers (hours since a date: xarray's ds[name].astype('datetime64[h]').astype('int64')) "
            "and write the store again with zarrtorch.prepare_zarr"
            if dtype.kind in "Mm"
            else "encode it as numbers (category codes) and write the store again with zarrtorch.prepare_zarr"
        )
        numeric = sorted(n for n, a in arrays.items() if np.dtype(a.dtype).kind not in NOT_TENSORS)
        leave_out = f"leave it out ({'variables=' if chosen else 'pass variables='}{numeric})"
        raise TypeError(f"array {name!r} holds {what} ({dtype}), which a tensor cannot hold: {leave_out}, or {fix}")


def _each(value) -> list:
    """The values of an attribute that may be one value or a list of them (a base64 string is one)."""
    if isinstance(value, (str, bytes)):
        return [value]
    return list(np.asarray(value, dtype=object).reshape(-1)) or [value]


def _number(value, name: str, where: str) -> float:
    if isinstance(value, str):  # zarr v3 JSON ("NaN", "Infinity"), or xarray's base64 of a little-endian double
        with contextlib.suppress(ValueError):
            return float(value)
        with contextlib.suppress(ValueError, binascii.Error, struct.error):
            return struct.unpack("<d", base64.b64decode(value, validate=True))[0]
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
            f"array {name!r} holds CF-encoded times (units {units!r}): leave it out (variables=[...]), or decode it "
            "with xarray and write it again with zarrtorch.prepare_zarr"
        )
    encoded = str(attrs.get("dtype", ""))
    if encoded.startswith(("timedelta64", "datetime64")):  # xarray's encoded durations: numbers of `units`
        raise ValueError(
            f"array {name!r} holds CF-encoded durations ({encoded}, units {units!r}): leave it out (variables=[...]), "
            "or convert it to plain numbers (e.g. hours as floats) and write it again with zarrtorch.prepare_zarr"
        )
    dtype = np.dtype(arr.dtype)
    scale = _number(attrs.get("scale_factor", 1.0), "scale_factor", name)
    offset = _number(attrs.get("add_offset", 0.0), "add_offset", name)
    fills = [attrs[k] for k in ("_FillValue", "missing_value") if k in attrs]
    if arr.metadata.zarr_format == 2 and "_ARRAY_DIMENSIONS" in attrs and arr.fill_value is not None:
        fills.append(arr.fill_value)  # xarray writes a v2 array's _FillValue as its Zarr fill value
    packed = "scale_factor" in attrs or "add_offset" in attrs
    if not packed and (dtype.kind == "b" or not fills):
        return None  # as stored: arrays without a fill, and booleans (xarray makes objects of a masked bool)
    wrap = 2 ** (8 * dtype.itemsize) if str(attrs.get("_Unsigned", "")).lower() == "true" and dtype.kind == "i" else 0
    # CF allows a list of missing values: each one is NaN (only the first was, found by a break-test)
    values = [_number(v, "fill value", name) for f in fills for v in _each(f)]
    values = [v % wrap if wrap else v for v in values if not np.isnan(v)]
    if not packed and dtype.kind == "f":  # a float's fill (-9999) read as NaN, as xarray does; NaN fills are NaN
        return Packing(1.0, 0.0, tuple(values), 0, native(dtype)) if values else None
    wide = dtype.itemsize >= (8 if dtype.kind == "f" else 4)  # float32 cannot hold every such value exactly
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
    if stack is not None and not isinstance(stack, Mapping):
        raise ValueError(f"stack must be a dict {{name: [array names]}}, got {stack!r}")
    stack = {str(k): names(v, f"stack[{k!r}]") for k, v in (stack or {}).items()}
    used: list[str] = [n for listed in stack.values() for n in listed]
    for out, listed in stack.items():
        if not listed:
            raise ValueError(f"stack {out!r} lists no arrays")
        missing = [n for n in listed if n not in columns]
        if missing:
            raise KeyError(f"stack {out!r} names {missing}, which are not loaded: available are {sorted(columns)}")
        kinds = {(tuple(columns[n][0]), np.dtype(columns[n][1])) for n in listed}
        if len(kinds) > 1:
            raise ValueError(f"stack {out!r} mixes row shapes/dtypes {sorted(map(str, kinds))}: stack arrays alike")
        if out in columns and out not in listed:
            raise ValueError(f"stack name {out!r} is also an array's name: choose another")
    twice = sorted({n for n in used if used.count(n) > 1})
    if twice:
        raise ValueError(f"arrays {twice} appear in more than one stack")
    return stack


def stack_columns(batch: dict[str, np.ndarray], stack: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """The batch with each stack's arrays replaced by one array, the listed order along axis 1."""
    if not stack:
        return batch
    out = {n: a for n, a in batch.items() if not any(n in listed for listed in stack.values())}
    for name, listed in stack.items():
        out[name] = np.stack([batch[n] for n in listed], axis=1)
    return out
