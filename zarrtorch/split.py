"""Split a training store along its first (time) axis, by whole chunks, into a fitting and a validation store.

Validation on the *last* chunks (the most recent times) is the honest split for data that drift in time:
the model is scored on a period it has never seen, as it would be in use. Splitting by whole chunks keeps
every chunk boundary where it was, so both parts stream exactly like the original.

This version writes the two parts as separate stores next to the original (``<name>.fit-r0-N.zarr`` and
``<name>.val-rN-M.zarr``), once, and reuses them afterwards. It costs a second copy of the data on disk;
a row-range option on the dataset would avoid the copy (see the project's notes).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

from zarrtorch.layout import check_first_axis_layout
from zarrtorch.source import open_arrays

MARKER = ".zarrtorch-split.json"


@dataclass(frozen=True)
class SplitPlan:
    """Where the split falls: rows ``[0, split_row)`` fit, ``[split_row, rows)`` validate."""

    rows: int
    chunk_rows: int
    split_row: int

    @property
    def n_chunks(self) -> int:
        return -(-self.rows // self.chunk_rows)

    @property
    def val_chunks(self) -> int:
        return self.n_chunks - self.split_row // self.chunk_rows

    @property
    def fit_rows(self) -> int:
        return self.split_row

    @property
    def val_rows(self) -> int:
        return self.rows - self.split_row


def plan_split(rows: int, chunk_rows: int, val_fraction: float) -> SplitPlan:
    """The last ``round(val_fraction * n_chunks)`` chunks (at least one, and at least one left to fit) validate."""
    if not 0.0 < float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_chunks = -(-int(rows) // int(chunk_rows))
    if n_chunks < 2:
        raise ValueError(f"the store has {n_chunks} chunk(s): a split by whole chunks needs at least 2")
    val_chunks = min(n_chunks - 1, max(1, int(round(val_fraction * n_chunks))))
    return SplitPlan(int(rows), int(chunk_rows), (n_chunks - val_chunks) * int(chunk_rows))


def _layout(store: Path):
    arrays = open_arrays(store)
    return arrays, check_first_axis_layout(arrays)


def _fingerprint(store: Path) -> dict:
    """Identifies the version of the original store the parts were cut from (regenerating it changes this)."""
    meta = store / "zarr.json"
    stat = meta.stat() if meta.exists() else store.stat()
    return {"source": str(store.resolve()), "mtime_ns": stat.st_mtime_ns, "size": stat.st_size}


def split_paths(train_store: str | os.PathLike, plan: SplitPlan, out_dir: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """Paths of the fitting and validation stores for ``plan`` (nothing is written)."""
    store = Path(train_store)
    folder = Path(out_dir) if out_dir is not None else store.parent
    stem = store.name.removesuffix(".zarr")
    fit = folder / f"{stem}.fit-r0-{plan.split_row}.zarr"
    val = folder / f"{stem}.val-r{plan.split_row}-{plan.rows}.zarr"
    return fit, val


class _RowSlice:
    """Rows ``[start, stop)`` of a zarr array, read on demand (for ``prepare_zarr``'s mapping input)."""

    def __init__(self, arr: zarr.Array, start: int, stop: int):
        self.arr, self.start, self.stop = arr, start, stop
        self.shape = (stop - start, *arr.shape[1:])
        self.dtype = arr.dtype

    def __getitem__(self, key: slice) -> np.ndarray:
        a, b, _ = key.indices(self.shape[0])
        return self.arr[self.start + a:self.start + b]


def _is_current(path: Path, wanted: dict) -> bool:
    try:
        return json.loads((path / MARKER).read_text()) == wanted
    except (OSError, ValueError):
        return False


def _write_part(store: Path, arrays: dict, start: int, stop: int, chunk_rows: int, dest: Path, wanted: dict) -> None:
    """Write rows [start, stop) of ``store`` to ``dest`` atomically (temporary folder, then rename)."""
    from zarrtorch.prepare import prepare_zarr

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        part = tmp / "part.zarr"
        group = zarr.open_group(str(store), mode="r")
        dim = (group.attrs.get("zarrtorch") or {}).get("dim")
        source = None
        if dim is not None and dim != "row":  # written from xarray: keep coordinates and attributes
            import xarray as xr

            ds = xr.open_zarr(str(store), consolidated=None)
            if dim in ds.dims:
                source = ds.isel({dim: slice(start, stop)})
                source.attrs = {**ds.attrs, "zarrtorch_split": {"rows": [start, stop], "of": int(ds.sizes[dim])}}
        if source is None:
            source = {n: _RowSlice(a, start, stop) for n, a in arrays.items()}
        prepare_zarr(source, part, chunk_rows=chunk_rows, overwrite=True, progress=False,
                     variables=list(arrays) if not isinstance(source, dict) else None)
        (part / MARKER).write_text(json.dumps(wanted, indent=1) + "\n")
        if dest.exists():  # stale (older source, or an interrupted write without marker)
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.rename(part, dest)
        except OSError:
            if not _is_current(dest, wanted):  # another process won the race with the same content: fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def split_store(train_store: str | os.PathLike, val_fraction: float = 0.2, *,
                out_dir: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """Cut ``train_store`` into a fitting head and a validation tail (whole chunks), written next to it.

    Returns ``(fit_path, val_path)``. The parts are written once and reused while the original store is
    unchanged; call it from one process (``LightningDataModule.prepare_data``) before the others open them.
    ``out_dir`` puts the parts elsewhere (e.g. when the data folder is read-only).
    """
    store = Path(train_store)
    arrays, layout = _layout(store)
    plan = plan_split(layout.rows, layout.chunk_rows, val_fraction)
    fit, val = split_paths(store, plan, out_dir)
    base = {**_fingerprint(store), "chunk_rows": plan.chunk_rows, "arrays": sorted(arrays)}
    for dest, (a, b) in ((fit, (0, plan.split_row)), (val, (plan.split_row, plan.rows))):
        wanted = {**base, "rows": [a, b]}
        if not _is_current(dest, wanted):
            _write_part(store, arrays, a, b, plan.chunk_rows, dest, wanted)
    return fit, val


def planned_split(train_store: str | os.PathLike, val_fraction: float = 0.2, *,
                  out_dir: str | os.PathLike | None = None) -> tuple[SplitPlan, Path, Path]:
    """The split plan and the paths :func:`split_store` writes, without writing anything."""
    store = Path(train_store)
    _, layout = _layout(store)
    plan = plan_split(layout.rows, layout.chunk_rows, val_fraction)
    return (plan, *split_paths(store, plan, out_dir))
