"""The private part of xarray zarrtorch relies on (zarrtorch/_compat/xarray.py): a lazily loaded variable leads,
through its wrappers' attributes, to the zarr array it reads (``prepare_zarr`` refuses to overwrite its source)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from zarrtorch import prepare_zarr
from zarrtorch._compat.xarray import wrapped

xr = pytest.importorskip("xarray")


def zarr_array_behind(obj, depth: int = 0):
    """The zarr array found by following :func:`wrapped` down from ``obj``, or ``None``."""
    if isinstance(obj, zarr.Array):
        return obj
    if obj is None or depth > 12:
        return None
    for inner in wrapped(obj):
        found = zarr_array_behind(inner, depth + 1)
        if found is not None:
            return found
    return None


def test_a_lazy_variable_leads_to_its_zarr_array(tmp_path):
    prepare_zarr(xr.Dataset({"x": (("time",), np.arange(12.0))}), tmp_path / "s.zarr", progress=False)
    ds = xr.open_zarr(tmp_path / "s.zarr", chunks=None)
    found = zarr_array_behind(ds["x"])
    assert found is not None, (
        "xarray's lazy wrappers no longer lead to the zarr array (variable, _data, array, _array): update "
        "zarrtorch._compat.xarray.LAZY_WRAPPERS"
    )
    assert found.path == "x" and str(tmp_path / "s.zarr") in str(found.store_path.store)
