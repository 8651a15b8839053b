"""The peers' store's values in the layouts zarr-beluga reads, written with zarr-python alone (numpy + zarr, so
the project's environment and beluga's both import it).

zarr-beluga (``import beluga``) reads three kinds of store, and names its arrays' dimensions itself: a single
array ``data`` of ``(time, channel, latitude, longitude)`` (what its ``write_synth_zarr`` writes: ``frame``
layout, Blosc lz4 + byte shuffle, one time step per chunk; or sharded), and a zarr v2 group of one array per
variable, ``(time, [level,] latitude, longitude)``, with coordinates and consolidated metadata (the
WeatherBench2 layout). Each writer copies the rows of an array ``x`` of ``(rows, channel, lat, lon)`` into one of
them, whole chunks at a time, so every loader reads the same values whatever the layout:

- :func:`write_frame`: Zarr v3 ``data``, chunks of one row, Blosc lz4 level 1 + shuffle (beluga's frame layout);
- :func:`write_sharded`: Zarr v3 ``data``, shards of ``shard_rows`` rows, inner chunks of one row, zstd;
- :func:`write_wb2`: Zarr v2 group, the channels split into variables (two with levels, the rest surface
  fields), chunks of one row, Blosc lz4 + shuffle, ``time``/``level``/``latitude``/``longitude`` coordinates
  and ``.zmetadata``;
- :func:`write_view`: no data, only metadata: a group whose array ``x`` names its dimensions as beluga needs
  them, its chunk folder a link to the store's own (beluga then reads the store's chunk files as they are).

``CHANNELS_WB2`` says how the channels become variables.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import zarr

# the WeatherBench2-style group: (variable, levels or None) in channel order; 16 channels in all
CHANNELS_WB2 = [("temperature", 4), ("geopotential", 4)] + [
    (name, None)
    for name in (
        "2m_temperature",
        "10m_u_component_of_wind",
        "10m_v_component_of_wind",
        "mean_sea_level_pressure",
        "surface_pressure",
        "total_precipitation",
        "total_cloud_cover",
        "sea_surface_temperature",
    )
]
DATA = "data"  # the array beluga's single-array ("zarr") source reads
DIMS = ["time", "channel", "latitude", "longitude"]


def _blosc_lz4():
    from zarr.codecs import BloscCodec

    return BloscCodec(cname="lz4", clevel=1, shuffle="shuffle", typesize=4)


def _copy_rows(source: zarr.Array, target: zarr.Array, step: int) -> None:
    """``target[a:b] = source[a:b]``, ``step`` rows at a time (the source's chunks: each decoded once)."""
    for start in range(0, source.shape[0], step):
        target[start : start + step] = source[start : start + step]


def _consolidate(path: str | Path) -> None:
    """Consolidated metadata (beluga's group reader wants it; zarr-python warns that v3 does not define it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(path))


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_frame(source: zarr.Array, path: str | Path) -> Path:
    """Beluga's frame layout: ``path/data``, one row per chunk, Blosc lz4 level 1 + byte shuffle."""
    group = zarr.open_group(str(_fresh(Path(path))), mode="w", zarr_format=3)
    data = group.create_array(
        DATA,
        shape=source.shape,
        chunks=(1, *source.shape[1:]),
        dtype=source.dtype,
        compressors=[_blosc_lz4()],
        dimension_names=DIMS,
        fill_value=0.0,
    )
    _copy_rows(source, data, source.chunks[0])
    _consolidate(path)
    return Path(path)


def write_sharded(source: zarr.Array, path: str | Path, shard_rows: int = 32) -> Path:
    """``path/data`` in Zarr v3 shards of ``shard_rows`` rows, inner chunks of one row, zstd level 3."""
    from zarr.codecs import ZstdCodec

    group = zarr.open_group(str(_fresh(Path(path))), mode="w", zarr_format=3)
    data = group.create_array(
        DATA,
        shape=source.shape,
        shards=(shard_rows, *source.shape[1:]),
        chunks=(1, *source.shape[1:]),
        dtype=source.dtype,
        compressors=[ZstdCodec(level=3)],
        dimension_names=DIMS,
        fill_value=0.0,
    )
    step = max(shard_rows, source.chunks[0] // shard_rows * shard_rows)  # whole shards per write
    _copy_rows(source, data, step)
    _consolidate(path)
    return Path(path)


def wb2_variables() -> list[str]:
    return [name for name, _ in CHANNELS_WB2]


def write_wb2(source: zarr.Array, path: str | Path) -> Path:
    """A WeatherBench2-style Zarr v2 group: one array per variable of :data:`CHANNELS_WB2`, one row per chunk,
    Blosc lz4 + shuffle, with ``time`` (hours since 2020-01-01, 6-hourly), ``level``, ``latitude`` (descending,
    as ERA5 stores it) and ``longitude``, and consolidated metadata."""
    import numcodecs

    rows, channels, lat, lon = source.shape
    if channels != sum(n or 1 for _, n in CHANNELS_WB2):
        raise ValueError(f"write_wb2 splits 16 channels into variables; the source has {channels}")
    group = zarr.open_group(str(_fresh(Path(path))), mode="w", zarr_format=2)
    blosc = numcodecs.Blosc(cname="lz4", clevel=1, shuffle=numcodecs.Blosc.SHUFFLE)

    def coordinate(name: str, values: np.ndarray, attrs: dict) -> None:
        array = group.create_array(name, shape=values.shape, chunks=values.shape, dtype=values.dtype)
        array[:] = values
        array.attrs.update({"_ARRAY_DIMENSIONS": [name], **attrs})

    coordinate(
        "time",
        np.arange(rows, dtype=np.int64) * 6,
        {"units": "hours since 2020-01-01", "calendar": "proleptic_gregorian"},
    )
    coordinate("level", np.array([1000, 850, 500, 250], dtype=np.int64)[: max(n or 1 for _, n in CHANNELS_WB2)], {})
    coordinate("latitude", np.linspace(90, -90, lat).astype(np.float64), {"units": "degrees_north"})
    coordinate("longitude", np.linspace(0, 360, lon, endpoint=False).astype(np.float64), {"units": "degrees_east"})
    arrays, first = {}, 0
    for name, levels in CHANNELS_WB2:
        shape = (rows, levels, lat, lon) if levels else (rows, lat, lon)
        array = group.create_array(
            name, shape=shape, chunks=(1, *shape[1:]), dtype=source.dtype, compressor=blosc, fill_value=np.nan
        )
        array.attrs["_ARRAY_DIMENSIONS"] = (
            ["time", "level", "latitude", "longitude"]
            if levels
            else [
                "time",
                "latitude",
                "longitude",
            ]
        )
        arrays[name] = (array, first, levels)
        first += levels or 1
    step = source.chunks[0]
    for start in range(0, rows, step):
        block = source[start : start + step]
        for array, c, levels in arrays.values():
            array[start : start + step] = block[:, c : c + levels] if levels else block[:, c]
    _consolidate(path)
    return Path(path)


def write_view(store: str | Path, array: str, path: str | Path) -> Path:
    """A metadata-only view of ``store/array`` with the dimension names beluga's group reader needs
    (``time, level, lat, lon``): ``path/array/zarr.json`` (the array's metadata, renamed dimensions) and
    ``path/array/c``, a link to the store's chunk folder. Nothing is copied; beluga reads the store's chunks."""
    store, path = Path(store).resolve(), _fresh(Path(path))
    meta = json.loads((store / array / "zarr.json").read_text())
    meta["dimension_names"] = ["time", "level", "lat", "lon"]
    (path / array).mkdir(parents=True)
    (path / array / "zarr.json").write_text(json.dumps(meta, indent=1))
    os.symlink(store / array / "c", path / array / "c")
    group = {"zarr_format": 3, "node_type": "group", "attributes": {}}
    group["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": {array: meta}}
    (path / "zarr.json").write_text(json.dumps(group, indent=1))
    return path
