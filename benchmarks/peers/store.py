"""The peers' store: ``make bench``'s array ``x`` plus ``idx``, each row's own number.

The values of ``x`` come from ``benchmarks/harness.py`` (same generator, float32, 64 KiB samples, zstd level 3,
chunked along the first axis); ``idx`` is what makes the guarantee checks real: every loader hands back the
row numbers it read from the store, not numbers it was told. Runs in the project's environment only.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: harness
import harness  # noqa: E402
import zarr  # noqa: E402

from zarrtorch import prepare_zarr  # noqa: E402

DIMS = {"x": ["row", "channel", "lat", "lon"], "idx": ["row"]}


def name_dimensions(path: Path) -> None:
    """Write ``dimension_names`` into the arrays' metadata (and the group's consolidated copy): xarray, hence
    xbatcher, opens a Zarr v3 array only with them. Metadata only; zarrtorch reads the store as before."""
    group = path / "zarr.json"
    meta = json.loads(group.read_text())
    for name, dims in DIMS.items():
        array = path / name / "zarr.json"
        array.write_text(json.dumps(json.loads(array.read_text()) | {"dimension_names": dims}, indent=2))
        consolidated = (meta.get("consolidated_metadata") or {}).get("metadata", {})
        if name in consolidated:
            consolidated[name]["dimension_names"] = dims
    group.write_text(json.dumps(meta, indent=2))


def ensure_peer_store(data_dir: str | Path, rows: int, chunk_rows: int, seed: int = 0) -> dict:
    """Create ``<data_dir>/peers_<rows>_c<chunk_rows>_s<seed>.zarr`` unless its sidecar says it is complete."""
    path = Path(data_dir).resolve() / f"peers_{rows}_c{chunk_rows}_s{seed}.zarr"
    marker = path.with_suffix(".json")
    want = {"rows": rows, "chunk_rows": chunk_rows, "seed": seed, "generator_version": harness.GENERATOR_VERSION}
    want["dimension_names"] = DIMS
    with contextlib.suppress(Exception):
        info = json.loads(marker.read_text())
        if (
            all(info.get(k) == v for k, v in want.items())
            and zarr.open_group(str(path), mode="r")["x"].shape[0] == rows
        ):
            return {**info, "path": str(path)}
    marker.unlink(missing_ok=True)
    t0 = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    source = {"x": harness._LazyRows(rows, chunk_rows, seed), "idx": np.arange(rows, dtype=np.int64)}
    prepare_zarr(source, path, chunk_rows=chunk_rows, codec="zstd", level=3, overwrite=True, progress=False)
    name_dimensions(path)
    stored = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    info = {**want, "sample_shape": list(harness.SAMPLE_SHAPE), "dtype": "float32", "codec": "zstd", "level": 3}
    info |= {"decoded_bytes": rows * harness.ROW_BYTES, "stored_bytes": stored}
    info["generation_s"] = round(time.perf_counter() - t0, 2)
    marker.write_text(json.dumps(info, indent=1))
    return {**info, "path": str(path)}


LAYOUT_VERSION = 1  # bump when beluga_layouts.py writes other stores: older copies are then rewritten


def ensure_layout_stores(store: dict, data_dir: str | Path) -> dict[str, dict]:
    """The peers' store's ``x`` copied into each of beluga's layouts (``beluga_layouts.py``: ``frame``, ``sharded``,
    ``wb2``), as ``<data_dir>/<store>_<kind>.zarr``, unless a sidecar says that copy is complete; returns
    ``{kind: {"path", "stored_bytes", "generation_s"}}``."""
    import beluga_layouts as layouts

    writers = {"frame": layouts.write_frame, "sharded": layouts.write_sharded, "wb2": layouts.write_wb2}
    source = zarr.open_group(store["path"], mode="r")["x"]
    want = {"source": Path(store["path"]).name, "rows": store["rows"], "layout_version": LAYOUT_VERSION}
    out = {}
    for kind, write in writers.items():
        path = Path(data_dir).resolve() / f"{Path(store['path']).stem}_{kind}.zarr"
        marker = path.with_suffix(".json")
        with contextlib.suppress(Exception):
            info = json.loads(marker.read_text())
            if all(info.get(k) == v for k, v in want.items()) and path.exists():
                out[kind] = {**info, "path": str(path)}
                continue
        marker.unlink(missing_ok=True)
        t0 = time.perf_counter()
        write(source, path)
        stored = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        info = {**want, "kind": kind, "stored_bytes": stored, "generation_s": round(time.perf_counter() - t0, 2)}
        marker.write_text(json.dumps(info, indent=1))
        out[kind] = {**info, "path": str(path)}
    return out
