"""The private part of dask zarrtorch relies on (zarrtorch/_compat/dask.py): a dask array's graph tasks hold, in their
arguments or values, the array they read (``prepare_zarr`` refuses to overwrite its source)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from zarrtorch import prepare_zarr
from zarrtorch._compat.dask import graph_tasks, task_parts
from zarrtorch._compat.xarray import wrapped

da = pytest.importorskip("dask.array")


def reaches(obj, target, depth: int = 0, seen=None) -> bool:
    """Whether ``target`` is found from ``obj`` through graphs, tasks' parts, tuples and xarray's wrappers."""
    seen = set() if seen is None else seen
    if obj is target:
        return True
    if obj is None or depth > 12 or id(obj) in seen or isinstance(obj, (str, bytes, int, float, np.ndarray)):
        return False
    seen.add(id(obj))
    tasks = graph_tasks(obj)
    inner = tasks if tasks is not None else list(obj) if isinstance(obj, (list, tuple)) else task_parts(obj)
    if tasks is None and not isinstance(obj, (list, tuple)):
        inner += wrapped(obj)
    return any(reaches(i, target, depth + 1, seen) for i in inner)


def test_a_dask_arrays_graph_holds_the_array_it_reads(tmp_path):
    source = zarr.open_array(str(tmp_path / "a.zarr"), mode="w", shape=(12,), chunks=(4,), dtype="f8")
    source[:] = np.arange(12.0)
    derived = da.from_array(source, chunks=4) * 2
    assert graph_tasks(np.arange(3)) is None
    assert graph_tasks(derived), "update zarrtorch._compat.dask.graph_tasks"
    assert reaches(derived, source), (
        "dask's graph tasks no longer hold what they read in .args or .value: update zarrtorch._compat.dask.task_parts"
    )


def test_a_derived_xarray_variable_leads_to_its_store(tmp_path):
    """What prepare_zarr follows for ``xr.open_zarr(url) * 1``: no ``encoding["source"]`` left, the graph only."""
    xr = pytest.importorskip("xarray")
    prepare_zarr(xr.Dataset({"x": (("time",), np.arange(12.0))}), tmp_path / "s.zarr", progress=False)
    derived = xr.open_zarr(tmp_path / "s.zarr", chunks={})["x"] * 1
    from zarrtorch.prepare import _stored_at

    assert (("file", "local"), f"{(tmp_path / 's.zarr').as_posix()}/x") in _stored_at([derived]), (
        "update zarrtorch._compat.dask / zarrtorch._compat.xarray"
    )
