"""CF packing: arrays stored as scaled integers with a fill value, decoded as xarray decodes them.

Reanalysis and climate-model downloads (ERA5, CMIP) often pack a field into int16 with ``scale_factor``,
``add_offset`` and ``_FillValue`` attributes (or ``missing_value``): the value is ``packed * scale_factor +
add_offset``, and the fill marks a missing value. Zarr returns the packed integers; streaming them raw would
train on -32768 where xarray shows NaN. The loader keeps the packed rows in its buffer (half the memory of
floats), gathers a batch's rows as stored and decodes them into the batch (:class:`BatchDecoder`); a static
array (``Windows(static=...)``) is decoded once, when read.

The rule, one for every array, is xarray's (``xarray.open_zarr``):

* ``_Unsigned`` ``"true"`` reads an integer's bytes as unsigned, ``"false"`` an unsigned one's as signed;
* a value equal to a ``_FillValue`` or ``missing_value`` (one or a list) is NaN. A Zarr v2 store written by
  xarray holds the fill as the array's fill value, which xarray reads in place of the attribute; a Zarr v3
  float fill is xarray's base64 of a double;
* then ``value * scale_factor + add_offset``, computed in float64 as xarray computes it (the attributes read
  from a store are Python floats: xarray decodes every scaled array in float64);
* delivered in ``ReadOptions.cf_dtype``: ``"float32"`` by default (xarray's values rounded to float32, half the
  memory of a batch), or ``"float64"`` (xarray's values exactly). Integers only masked (a fill, no scale or
  offset) are delivered in ``cf_dtype`` too; a float array only masked keeps its dtype, as in xarray (nothing is
  computed), and integers with ``_Unsigned`` alone are the integers xarray reads (uint8 for int8).

A float's fill that is a number (-9999) is NaN too, as xarray shows it; booleans are streamed as stored. Arrays
with CF-encoded times (``units: "hours since ..."``), dates, durations and text are refused by name: decode or
encode them as numbers and write them again with :func:`zarrtorch.prepare_zarr`, or leave them out.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import zarr

from zarrtorch._util.arguments import names
from zarrtorch._util.sizes import native

CF_DTYPES = ("float32", "float64")  # what ReadOptions.cf_dtype may be
CF_ENCODING = ("scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned")  # how values are packed
# and what else says how stored values are read (encoded times and durations, xarray's booleans)
DECODING_ATTRIBUTES = (*CF_ENCODING, "units", "calendar", "dtype")
DECODE_BLOCK_VALUES = 2**17  # values decoded at once in float64 (1 MiB), or one row if larger
DECODE_BYTES_PER_VALUE = 8 + 3  # a float64 value and the three bool masks the decode computes beside it


def decode_block_bytes(row_values: int, rows: int) -> int:
    """Bytes :meth:`Packing.decode` holds at most beside its input and output, decoding ``rows`` rows of
    ``row_values`` values."""
    block = min(int(rows) * int(row_values), max(DECODE_BLOCK_VALUES, int(row_values)))
    return block * DECODE_BYTES_PER_VALUE


@dataclass(frozen=True)
class Packing:
    """How one array's stored values become xarray's: ``wrap`` added to the integers read the other way
    (``_Unsigned``), NaN where they equal one of ``fills``, then ``value * scale + offset``; delivered as ``dtype``."""

    scale: float | None
    offset: float | None
    fills: tuple[float, ...]  # as read (after the wrap)
    wrap: float  # +2**bits: negative integers are unsigned ones; -2**bits: unsigned ones from 2**(bits-1) are negative
    dtype: np.dtype  # what the values are delivered as

    def decode(self, packed: np.ndarray, out: np.ndarray) -> None:
        """``out[...] =`` the values of ``packed`` (as stored, rows along the first axis), computed a block of rows
        at a time (:func:`decode_block_bytes`) in float64, as xarray computes them: float32 arithmetic rounds each
        step, and its values are not xarray's rounded once."""
        if self.dtype.kind in "iu":  # _Unsigned alone: the same bytes, read the other way
            np.copyto(out, packed, casting="unsafe")
            return
        packed, out = np.atleast_1d(packed), np.atleast_1d(out)
        step = max(1, DECODE_BLOCK_VALUES // max(1, math.prod(packed.shape[1:])))
        for start in range(0, len(packed), step):
            out[start : start + step] = self._values(packed[start : start + step])

    def _values(self, block: np.ndarray) -> np.ndarray:
        """The block's values in float64, in xarray's order: read as (un)signed, masked, scaled, offset."""
        x = block.astype(np.float64)
        if self.wrap > 0:
            np.add(x, self.wrap, out=x, where=x < 0)
        elif self.wrap < 0:
            np.add(x, self.wrap, out=x, where=x >= -self.wrap / 2)
        missing = None
        for fill in self.fills:
            hit = x == fill
            missing = hit if missing is None else np.logical_or(missing, hit, out=missing)
        if self.scale is not None:
            x *= self.scale
        if self.offset is not None:
            x += self.offset
        if missing is not None:
            x[missing] = np.nan
        return x

    def decoded(self, packed: np.ndarray) -> np.ndarray:
        """The values of ``packed`` in a new array."""
        out = np.empty(packed.shape, dtype=self.dtype)
        self.decode(packed, out)
        return out


class BatchDecoder:
    """Batches whose CF-packed columns are gathered as stored, into ``scratch(rows)`` (float32 does not hold every
    int32 exactly: the decode starts from the stored values), then decoded into the arrays the batch is delivered
    in: those ``out(rows)`` gave (a ring slot, a pooled batch), else new ones. Give :meth:`out` to the gathering
    and pass each batch it made through :meth:`decoded` before the next is gathered."""

    def __init__(self, packings: dict[str, Packing], out: Callable | None, scratch: Callable):
        self.packings, self._out, self._scratch = packings, out, scratch
        self._dest: dict[str, np.ndarray] | None = None

    def out(self, rows: int) -> dict[str, np.ndarray] | None:
        dest = self._out(rows) if self._out is not None else None
        self._dest = dest
        if dest is None:
            return None
        return {**dest, **self._scratch(rows)}

    def decoded(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        dest, self._dest = self._dest, None
        for name, packing in self.packings.items():
            if dest is None:
                batch[name] = packing.decoded(batch[name])
            else:
                packing.decode(batch[name], dest[name])
                batch[name] = dest[name]
        return batch


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


def cf_attributes(arr: zarr.Array) -> dict:
    """``arr``'s attributes as xarray decodes them: a Zarr v2 array written by xarray has its ``_FillValue`` as
    the array's fill value, which xarray reads in place of the attribute."""
    attrs = dict(arr.attrs)
    if arr.metadata.zarr_format == 2 and "_ARRAY_DIMENSIONS" in attrs and arr.fill_value is not None:
        attrs["_FillValue"] = arr.fill_value
    return attrs


def _wrap(unsigned, dtype: np.dtype) -> float:
    """:attr:`Packing.wrap` for an ``_Unsigned`` attribute (xarray reads only the strings "true" and "false")."""
    bits = 8 * dtype.itemsize
    if unsigned == "true" and dtype.kind == "i":
        return 2.0**bits
    if unsigned == "false" and dtype.kind == "u":
        return -(2.0**bits)
    return 0.0


def _read_as(value: float, wrap: float) -> float:
    """A fill value read as the data is (``_Unsigned``): -1 of an unsigned int8 is 255."""
    if wrap > 0 and value < 0:
        return value + wrap
    if wrap < 0 and value >= -wrap / 2:
        return value + wrap
    return value


def packing(name: str, arr: zarr.Array, cf_dtype: str = "float32") -> Packing | None:
    """The array's CF packing, or ``None`` when it is stored as its values (then it is streamed as it is)."""
    attrs = cf_attributes(arr)
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
    dtype = native(arr.dtype)
    if dtype.kind == "b":
        return None  # as stored (xarray makes objects of a masked bool)
    scale = _number(attrs["scale_factor"], "scale_factor", name) if "scale_factor" in attrs else None
    offset = _number(attrs["add_offset"], "add_offset", name) if "add_offset" in attrs else None
    wrap = _wrap(attrs.get("_Unsigned"), dtype)
    # CF allows a list of missing values: each one is NaN, not only the first
    given = [
        _number(v, "fill value", name) for k in ("_FillValue", "missing_value") if k in attrs for v in _each(attrs[k])
    ]
    fills = tuple(dict.fromkeys(_read_as(v, wrap) for v in given if not math.isnan(v)))
    if scale is None and offset is None:
        if not fills:  # as stored, or the same bytes read as (un)signed integers (_Unsigned alone)
            return (
                Packing(None, None, (), wrap, np.dtype(f"{'u' if wrap > 0 else 'i'}{dtype.itemsize}")) if wrap else None
            )
        if dtype.kind == "f":  # a float's fill (-9999) read as NaN, as xarray does; the values keep their dtype
            return Packing(None, None, fills, 0.0, dtype)
    return Packing(scale, offset, fills, wrap, np.dtype(cf_dtype))


def packings(arrays: dict[str, zarr.Array], decode: bool = True, cf_dtype: str = "float32") -> dict[str, Packing]:
    """The packing of every packed array (none with ``decode=False``), decoded to ``cf_dtype``."""
    if not decode:
        return {}
    found = {n: packing(n, a, cf_dtype) for n, a in arrays.items()}
    return {n: p for n, p in found.items() if p is not None}


def decoding_attributes(arr) -> dict:
    """The attributes that say how ``arr``'s stored values are read (:data:`DECODING_ATTRIBUTES`: CF packing,
    encoded times and durations), as JSON values for a Zarr v3 array holding a copy of those values: what the copy
    needs to be read as ``arr`` is. ``arr``: a zarr array, or anything with ``attrs`` (an xarray variable opened
    with ``mask_and_scale=False``); ``{}`` otherwise."""
    if isinstance(arr, zarr.Array):
        attrs = cf_attributes(arr)
    else:
        attrs = getattr(arr, "attrs", None)
        if not isinstance(attrs, Mapping):
            return {}
    kind = np.dtype(arr.dtype).kind
    out = {}
    for key in DECODING_ATTRIBUTES:
        if key in attrs:
            value = attrs[key]
            value = value.tolist() if isinstance(value, (np.ndarray, np.generic)) else value
            if key == "_FillValue" and kind == "f" and isinstance(value, (int, float)):  # Zarr v3: xarray's base64
                value = base64.standard_b64encode(struct.pack("<d", float(value))).decode()
            out[key] = value
    return out


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
