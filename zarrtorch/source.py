"""Turn what a user hands the loader (a group, a path or URL, a mapping, an xarray-written store) into a
named set of Zarr arrays, with an error that says what to pass instead when it cannot."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import zarr

from zarrtorch.dims import sample_dimension

ACCEPTED = "a zarr.Group, a zarr.Array, a path or URL of a Zarr store, or a mapping name -> zarr.Array"


def _is_url(text: str) -> bool:
    return "://" in text and not text.startswith("file://")


def _open_path(path: str | os.PathLike):
    text = os.fspath(path)
    if not _is_url(text):
        local = Path(text.removeprefix("file://")).expanduser()
        if not local.exists():
            raise FileNotFoundError(
                f"no Zarr store at {local}: check the path, or create the course data with "
                "`python -m zarrtorch make-data` (or zarrtorch.prepare_zarr for your own data)"
            )
        text = str(local)
    try:
        return zarr.open(text, mode="r")
    except Exception as exc:  # zarr raises several types for "not a store"
        raise ValueError(f"{text} is not a readable Zarr store ({type(exc).__name__}: {exc})") from exc


def _data_variables(group: zarr.Group) -> list[str]:
    """The arrays to stream from a group: those listed by ``prepare_zarr``, else (a store written by
    xarray) the data variables along the sample dimension (:func:`zarrtorch.dims.sample_dimension`), else
    every array."""
    meta = group.attrs.get("zarrtorch")
    if isinstance(meta, Mapping) and "variables" in meta:
        return list(meta["variables"])
    arrays = dict(group.arrays())
    dims = {
        n: (a.metadata.dimension_names if hasattr(a.metadata, "dimension_names") else None)
        or a.attrs.get("_ARRAY_DIMENSIONS")
        for n, a in arrays.items()
    }
    if not any(dims.values()):
        return sorted(arrays)
    coords = {c for a in arrays.values() for c in str(a.attrs.get("coordinates", "")).split()}
    dimension_coords = {n for n, d in dims.items() if d and len(d) == 1 and d[0] == n}
    candidates = {n: d for n, d in dims.items() if d and n not in coords | dimension_coords}
    if not candidates:
        return sorted(arrays)
    sample_dim = sample_dimension(candidates, {n: arrays[n].nbytes for n in candidates})
    return sorted(n for n, d in candidates.items() if d[0] == sample_dim)


def open_arrays(source, names: Sequence[str] | None = None) -> dict[str, zarr.Array]:
    """Resolve ``source`` (and optionally a subset ``names``) to ``{name: zarr.Array}``."""
    if isinstance(source, (str, os.PathLike)):
        source = _open_path(source)
    if isinstance(source, zarr.Array):
        arrays = {source.basename or "data": source}
    elif isinstance(source, zarr.Group):
        available = dict(source.arrays())
        if names is None:
            arrays = {n: available[n] for n in _data_variables(source)}
        else:
            arrays = {}
            for n in names:
                if n not in available:
                    raise KeyError(f"unknown array name {n!r}: the group holds {sorted(available)}")
                arrays[n] = available[n]
        names = None
    elif isinstance(source, Mapping):
        arrays = dict(source)
        for n, a in arrays.items():
            if not isinstance(a, zarr.Array):
                raise TypeError(
                    f"{n!r} maps to a {type(a).__name__}, not a zarr.Array: open it with zarr.open_array(...), "
                    "or write NumPy/dask/xarray data with zarrtorch.prepare_zarr(...) first"
                )
    else:
        raise TypeError(
            f"cannot load from a {type(source).__name__}: pass {ACCEPTED}. "
            "To use in-memory NumPy/xarray data, write it with zarrtorch.prepare_zarr(...) first."
        )
    if names is not None:
        missing = [n for n in names if n not in arrays]
        if missing:
            raise KeyError(f"unknown array name(s) {missing}: available are {sorted(arrays)}")
        arrays = {n: arrays[n] for n in names}
    return arrays
