"""Every CF encoding streams the values xarray shows: a property test with xarray as the oracle.

Hypothesis draws an encoding (``scale_factor``, ``add_offset``, ``_FillValue``, ``missing_value``, ``_Unsigned``;
int8 to int32, uint8, uint16 and float32 arrays; parameters that are float32 or float64 numbers; Zarr v2 or v3)
and packed values that hit the fills. The same encoding is given to a time array and to a static one, and every
way a user meets it is compared with ``xarray.open_zarr`` of the source: the loader's rows and windows (the
static array with every window), ``prepare_zarr`` of the dataset (the static array kept as a coordinate) and of
a mapping of the zarr arrays. Each value must be xarray's rounded to the batch's dtype (``ReadOptions.cf_dtype``,
drawn too), NaN where xarray shows NaN. Once the loader streamed a static array's packed integers, and decoded in
float32 what xarray decodes in float64 (issue 41).
"""

from __future__ import annotations

import base64
import struct
import warnings

import numpy as np
import xarray as xr
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch.windows import Windows

ROWS, CELLS = 12, 3
EVERY_CHUNK = {"write_empty_chunks": True}  # the loader refuses a missing chunk (it would read the fill)
DTYPES = ("int8", "int16", "int32", "uint8", "uint16", "float32")


def _parameter(low: float, high: float):
    """A scale or an offset: a float64 number, or one a float32 holds (xarray's float32 encodings are those)."""
    number = st.floats(low, high, allow_nan=False, allow_infinity=False)
    return st.one_of(number, number.map(lambda v: float(np.float32(v))))


@st.composite
def encodings(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    attrs: dict = {}
    if draw(st.booleans()):
        attrs["scale_factor"] = draw(_parameter(1e-4, 1e3)) * draw(st.sampled_from([1, -1]))
    if draw(st.booleans()):
        attrs["add_offset"] = draw(_parameter(-1e5, 1e5))
    if dtype.kind == "f":
        stored = st.floats(-1e4, 1e4, width=32, allow_nan=False)
    else:
        info = np.iinfo(dtype)
        stored = st.integers(int(info.min), int(info.max))
        if draw(st.booleans()):
            attrs["_Unsigned"] = draw(st.sampled_from(["true", "false"]))
    fill = draw(st.none() | stored)
    missing = draw(st.none() | stored | st.lists(stored, min_size=2, max_size=2))
    unsigned = attrs.get("_Unsigned") == {"i": "true", "u": "false"}.get(dtype.kind)
    if unsigned and fill is not None and dtype.kind == "u" and fill >= 2 ** (8 * dtype.itemsize - 1):
        fill = None  # xarray refuses it: it makes a signed number of the fill (np.int8(200): OverflowError)
    if unsigned and missing is not None and missing != fill:
        # xarray reads only the _FillValue as (un)signed, and then never matches a missing_value of another value
        # (its own writer converts both): zarrtorch reads both as (un)signed
        missing = None
    if fill is not None:
        attrs["_FillValue"] = fill
    if missing is not None:
        attrs["missing_value"] = missing
    fills = [v for v in (fill, *np.ravel(missing if missing is not None else [])) if v is not None]
    values = st.one_of(stored, st.sampled_from(fills)) if fills else stored
    rows = np.array(draw(st.lists(values, min_size=ROWS * CELLS, max_size=ROWS * CELLS)), dtype=dtype)
    static = np.array(draw(st.lists(values, min_size=CELLS, max_size=CELLS)), dtype=dtype)
    zarr_format = draw(st.sampled_from([2, 3]))
    read = ReadOptions(cf_dtype=draw(st.sampled_from(["float32", "float64"])))
    return dtype, attrs, rows.reshape(ROWS, CELLS), static, zarr_format, read


def write_source(path, attrs: dict, rows: np.ndarray, static: np.ndarray, zarr_format: int) -> None:
    """The store as xarray would write it: the fill as a Zarr v2 array's fill value, or a Zarr v3 attribute (a
    float's in base64); dimension names each format's way."""
    group = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    for name, values, dims in (("a", rows, ["time", "cell"]), ("s", static, ["cell"])):
        own = dict(attrs)
        fill = own.pop("_FillValue", None) if zarr_format == 2 else None
        if zarr_format == 3 and values.dtype.kind == "f" and "_FillValue" in own:
            own["_FillValue"] = base64.standard_b64encode(struct.pack("<d", own["_FillValue"])).decode()
        where = {"dimension_names": dims} if zarr_format == 3 else {"fill_value": fill}
        arr = group.create_array(
            name, shape=values.shape, chunks=(4, *values.shape[1:]), dtype=values.dtype, config=EVERY_CHUNK, **where
        )
        arr[...] = values
        arr.attrs.update({**own, **({"_ARRAY_DIMENSIONS": dims} if zarr_format == 2 else {})})
    zarr.consolidate_metadata(str(path))


def rows_of(path, read: ReadOptions) -> np.ndarray:
    """Array ``a``'s rows through the loader, in row order."""
    ds = ZarrIterableDataset(str(path), variables=["a"], shuffle=False, read=read)
    return np.concatenate([b["a"].numpy() for b in ZarrDataLoader(ds, batch_size=5)])


def windows_of(path, read: ReadOptions) -> tuple[np.ndarray, list[np.ndarray]]:
    """Array ``a``'s windows of two steps through the loader (inputs then target, by start row), and the static
    array ``s`` of every batch."""
    w = Windows(history=1, lead=1, inputs=("a",), static=("s",))
    ds = ZarrIterableDataset(str(path), windows=w, shuffle=False, return_index=True, read=read)
    batches = list(ZarrDataLoader(ds, batch_size=4))
    order = np.argsort(np.concatenate([b["index"].numpy() for b in batches]))
    steps = np.concatenate([np.concatenate([b["a"], b["a_target"]], axis=1) for b in batches])[order]
    assert all(ds.out_columns["s"][1] == b["s"].numpy().dtype for b in batches)
    return steps, [s for b in batches for s in b["s"].numpy()]


def same(got: np.ndarray, shown: np.ndarray, what: str) -> None:
    """``got`` holds xarray's values rounded to its dtype (float32 by default), NaN where xarray shows NaN."""
    assert got.dtype.kind == shown.dtype.kind or got.dtype.kind == "f", (what, got.dtype, shown.dtype)
    np.testing.assert_array_equal(got, shown.astype(got.dtype), err_msg=what)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=encodings())
def test_every_cf_encoding_streams_what_xarray_shows(tmp_path_factory, case):
    dtype, attrs, rows, static, zarr_format, read = case
    where = tmp_path_factory.mktemp("cf")
    write_source(where / "src.zarr", attrs, rows, static, zarr_format)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # xarray's SerializationWarning (several fill values), zarr's on v3
        shown = xr.open_zarr(str(where / "src.zarr")).load()
        a, s = shown["a"].values, shown["s"].values
        same(rows_of(where / "src.zarr", read), a, "rows")
        steps, statics = windows_of(where / "src.zarr", read)
        for k in range(2):
            same(steps[:, k], a[k : len(steps) + k], f"window step {k}")
        for got in statics:
            same(got, s, "static array")

        prepare_zarr(shown.set_coords("s"), where / "prepared.zarr", chunk_rows=4, progress=False)
        np.testing.assert_array_equal(xr.open_zarr(str(where / "prepared.zarr"))["s"].values, s)
        steps, statics = windows_of(where / "prepared.zarr", read)
        same(steps[:, 0], a[: len(steps)], "prepared, window inputs")
        for got in statics:
            same(got, s, "prepared, static coordinate")

        group = zarr.open_group(str(where / "src.zarr"), mode="r")
        prepare_zarr({"a": group["a"]}, where / "mapped.zarr", chunk_rows=4, progress=False)
        same(rows_of(where / "mapped.zarr", read), a, "prepare_zarr of a mapping")
