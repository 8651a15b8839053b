"""The private part of xarray zarrtorch relies on: the attributes its lazy wrappers keep their data in.

``tests/core/_compat/test_xarray.py`` checks it against the installed xarray (an optional dependency, for
``prepare_zarr``; nothing here imports it).
"""

from __future__ import annotations

# a DataArray's variable (public), a Variable's data (``_data``), a lazy indexing or copy-on-write wrapper's
# (``array``) and a zarr backend array's (``_array``)
LAZY_WRAPPERS = ("variable", "_data", "array", "_array")


def wrapped(obj) -> list:
    """What an xarray object wraps, one level down (``None`` where it has no such attribute).

    Why: ``prepare_zarr`` refuses to overwrite the store it reads from, which it finds by following a variable
    down to the zarr array behind it; xarray offers no public way from a lazily loaded variable to its source
    array, only ``encoding["source"]``, which a derived dataset no longer has."""
    return [getattr(obj, name, None) for name in LAZY_WRAPPERS]
