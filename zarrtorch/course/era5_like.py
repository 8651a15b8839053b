"""ERA5-like NetCDF files for lesson 08 ("Your own data"): one file per year, as reanalysis downloads come.

Each ``era5like_<year>.nc`` holds 6-hourly steps of that calendar year on a regular latitude/longitude grid
(latitude from north to south, as in ERA5), with

* two surface variables, ``t2m`` (2 m temperature, K) and ``msl`` (mean sea-level pressure, Pa), dims
  ``(time, latitude, longitude)``;
* three variables on pressure levels, ``t`` (temperature, K), ``u`` (zonal wind, m s-1) and ``z``
  (geopotential, m2 s-2), dims ``(time, level, latitude, longitude)`` with ``level`` 850, 500 and 250 hPa;

and ``static.nc`` holds the field without a time axis, ``orography`` (m), as ERA5's invariant fields come in a
download of their own. The fields come from the course's synthetic weather (:mod:`zarrtorch.course.synthetic`,
its temperature ``t`` and wind ``u`` at the same grid and time index): 2 m temperature is colder over the
mountains, the levels above are colder again (a lapse rate) with their waves shifted westward with height,
the jet strengthens with height, and geopotential follows from the temperatures (the hypsometric equation).
The magnitudes are ERA5's (K, Pa, m2 s-2): channels whose scales differ by four orders of magnitude, which is
why the lesson normalises them.

Every value is a pure function of (seed, time step since 2000-01-01 00:00): any year's file can be written
alone and gives the same numbers. Files are written whole, through dask one block of about a month at a time
(memory for one block, whatever the size), with xarray's ``h5netcdf`` engine (no netCDF C library needed).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from zarrtorch.course.synthetic import STEP_HOURS, Preset, compute_rows

FIRST_DAY = "2000-01-01"  # the synthetic weather's step 0
SURFACE = ("t2m", "msl")
UPPER = ("t", "u", "z")
LEVELS = (850, 500, 250)  # hPa
UNITS = {"t2m": "K", "msl": "Pa", "t": "K", "u": "m s-1", "z": "m2 s-2", "orography": "m"}
LONG_NAMES = {
    "t2m": "2 metre temperature",
    "msl": "Mean sea level pressure",
    "t": "Temperature",
    "u": "U component of wind",
    "z": "Geopotential",
    "orography": "Height of the surface above sea level",
}
G = 9.80665  # m s-2
R_DRY = 287.05  # J kg-1 K-1
LAPSE_RATE = 6.5e-3  # K per m
SCALE_HEIGHT = 7000.0  # m: a level's height is about SCALE_HEIGHT * ln(1000 hPa / p)
JET_GAIN = 0.5  # the wind grows by this fraction of itself per level upwards
TILT_DEG = 11.25  # degrees of longitude the waves shift westward per level upwards
BLOCK_STEPS = 124  # steps computed at once while writing (a month of 6-hourly steps)
MARKER = ".complete"
FORMAT = 1  # bump when the files change, so that existing folders are rewritten


@dataclass(frozen=True)
class Era5Preset:
    """``years`` calendar years from ``first_year``, 6-hourly, on an ``n_lat`` x ``n_lon`` grid."""

    first_year: int
    years: int
    n_lat: int
    n_lon: int

    @property
    def channels(self) -> int:
        """Surface variables plus each upper variable on each level: the channels of one step."""
        return len(SURFACE) + len(UPPER) * len(LEVELS)

    @property
    def step_bytes(self) -> int:
        """Bytes of one time step of every variable (float32), static field left out."""
        return self.channels * self.n_lat * self.n_lon * 4


PRESETS: dict[str, Era5Preset] = {
    # 3 years x 1461 steps of 11 x 16 x 32 float32 (22 KiB): 99 MB
    "tiny": Era5Preset(first_year=2000, years=3, n_lat=16, n_lon=32),
    # the same years on the course's 32 x 64 grid (88 KiB per step): 395 MB
    "small": Era5Preset(first_year=2000, years=3, n_lat=32, n_lon=64),
    # 64 x 128 (352 KiB per step): 1.6 GB
    "workshop": Era5Preset(first_year=2000, years=3, n_lat=64, n_lon=128),
}


def _preset(size: str | Era5Preset | None) -> tuple[str, Era5Preset]:
    if isinstance(size, Era5Preset):
        return "custom", size
    from zarrtorch.course.paths import course_size

    name = course_size(size)
    return name, PRESETS[name]


def year_times(year: int) -> np.ndarray:
    """The 6-hourly steps of one calendar year, datetime64[ns]."""
    import pandas as pd

    return pd.date_range(f"{year}-01-01", f"{year}-12-31T18:00", freq=f"{STEP_HOURS}h").values.astype("datetime64[ns]")


def step_index(times) -> np.ndarray:
    """Steps since 2000-01-01 00:00 (the synthetic weather's time index) of datetime64 ``times``."""
    hours = (np.asarray(times, dtype="datetime64[h]") - np.datetime64(FIRST_DAY, "h")).astype(np.int64)
    if np.any(hours % STEP_HOURS) or np.any(hours < 0):
        raise ValueError(f"times must be {STEP_HOURS}-hourly steps from {FIRST_DAY}")
    return hours // STEP_HOURS


def grid(preset: Era5Preset) -> tuple[np.ndarray, np.ndarray]:
    """(latitude north to south, longitude east from 0), degrees: the synthetic weather's grid, flipped."""
    lat = np.linspace(-80.0, 80.0, preset.n_lat) if preset.n_lat > 1 else np.zeros(1)
    return lat[::-1].astype(np.float32), (np.arange(preset.n_lon) * (360.0 / preset.n_lon)).astype(np.float32)


def orography(preset: Era5Preset, seed: int = 0) -> np.ndarray:
    """Surface height (m), (latitude, longitude): a few smooth mountain ranges on a sea-level floor."""
    lat, lon = grid(preset)
    rng = np.random.default_rng([int(seed), 8, 0])
    out = np.zeros((len(lat), len(lon)))
    for _ in range(5):
        lat0, lon0 = rng.uniform(-60, 60), rng.uniform(0, 360)
        width_lat, width_lon, height = rng.uniform(8, 20), rng.uniform(15, 50), rng.uniform(800, 3500)
        dlon = (lon[None, :] - lon0 + 180.0) % 360.0 - 180.0
        out += height * np.exp(-(((lat[:, None] - lat0) / width_lat) ** 2) - (dlon / width_lon) ** 2)
    return np.maximum(out - 100.0, 0.0).astype(np.float32)


def level_height(level_hpa) -> np.ndarray:
    """A pressure level's height above the 1000 hPa surface (m), from a constant scale height."""
    return SCALE_HEIGHT * np.log(1000.0 / np.asarray(level_hpa, dtype=np.float64))


def compute_steps(preset: Era5Preset, seed: int, steps: np.ndarray) -> dict[str, np.ndarray]:
    """Every variable at the time ``steps`` (since 2000-01-01): ``t2m``/``msl`` (B, lat, lon), ``t``/``u``/``z``
    (B, level, lat, lon), float32, latitude north to south. The same numbers for a step whatever the block."""
    steps = np.asarray(steps, dtype=np.int64)
    grid_preset = Preset(n_time=1, n_lat=preset.n_lat, n_lon=preset.n_lon)
    t, u = [], []  # the synthetic weather, step by step ranges (compute_rows takes start, stop)
    for a, b in _runs(steps):
        t.append(compute_rows(grid_preset, seed, "t", a, b))
        u.append(compute_rows(grid_preset, seed, "u", a, b))
    t_c = np.concatenate(t)[:, ::-1].astype(np.float64)  # degC, north first
    u_ms = np.concatenate(u)[:, ::-1].astype(np.float64)
    oro = orography(preset, seed).astype(np.float64)
    t2m = t_c + 273.15 - LAPSE_RATE * oro
    msl = 101_325.0 - 120.0 * (t_c - 10.0) + 40.0 * u_ms
    shift = int(round(TILT_DEG / (360.0 / preset.n_lon)))
    heights = level_height(LEVELS)
    t_lev = np.stack(
        [np.roll(t2m + LAPSE_RATE * oro, -k * shift, axis=-1) - LAPSE_RATE * h for k, h in enumerate(heights)], axis=1
    )
    u_lev = np.stack([np.roll(u_ms, -k * shift, axis=-1) * (1 + JET_GAIN * k) for k in range(len(LEVELS))], axis=1)
    t_mean = (t2m[:, None] + LAPSE_RATE * oro + t_lev) / 2  # layer mean from 1000 hPa to the level
    z_lev = R_DRY * t_mean * np.log(1000.0 / np.asarray(LEVELS, dtype=np.float64))[None, :, None, None]
    out = {"t2m": t2m, "msl": msl, "t": t_lev, "u": u_lev, "z": z_lev}
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def _runs(steps: np.ndarray):
    """Consecutive stretches of ``steps`` as (start, stop)."""
    if not len(steps):
        return []
    cut = np.flatnonzero(np.diff(steps) != 1) + 1
    return [(int(r[0]), int(r[-1]) + 1) for r in np.split(steps, cut)]


def year_dataset(year: int, preset: Era5Preset, seed: int = 0):
    """One year's variables as a lazy (dask) :class:`xarray.Dataset`, one block of ``BLOCK_STEPS`` steps computed
    once for all the variables."""
    import dask.array as da
    import xarray as xr

    times = year_times(year)
    steps = step_index(times)
    lat, lon = grid(preset)
    nl, nm, nlev = len(lat), len(lon), len(LEVELS)
    idx = da.from_array(steps, chunks=BLOCK_STEPS)
    width = len(SURFACE) + len(UPPER) * nlev

    def block(i):
        v = compute_steps(preset, seed, i)
        return np.concatenate([v["t2m"][:, None], v["msl"][:, None], v["t"], v["u"], v["z"]], axis=1)

    packed = da.map_blocks(
        block,
        idx,
        new_axis=[1, 2, 3],
        chunks=(idx.chunks[0], (width,), (nl,), (nm,)),
        dtype=np.float32,
        meta=np.empty((0, 0, 0, 0), dtype=np.float32),
        name=f"era5like-{year}-{seed}-{nl}x{nm}",
    )
    data = {"t2m": packed[:, 0], "msl": packed[:, 1]}
    for k, name in enumerate(UPPER):
        data[name] = packed[:, 2 + k * nlev : 2 + (k + 1) * nlev]
    ds = xr.Dataset(
        {n: (("time", "latitude", "longitude"), data[n]) for n in SURFACE}
        | {n: (("time", "level", "latitude", "longitude"), data[n]) for n in UPPER},
        coords={
            "time": ("time", times),
            "level": ("level", np.array(LEVELS, dtype=np.int32)),
            "latitude": ("latitude", lat),
            "longitude": ("longitude", lon),
        },
        attrs={
            "title": f"ERA5-like synthetic reanalysis, {year}",
            "source": "zarrtorch.course.era5_like (deterministic synthetic data, not ERA5)",
            "seed": int(seed),
        },
    )
    for n in (*SURFACE, *UPPER):
        ds[n].attrs = {"units": UNITS[n], "long_name": LONG_NAMES[n]}
    ds["level"].attrs = {"units": "millibars", "long_name": "pressure_level"}
    ds["latitude"].attrs = {"units": "degrees_north", "long_name": "latitude"}
    ds["longitude"].attrs = {"units": "degrees_east", "long_name": "longitude"}
    return ds


def static_dataset(preset: Era5Preset, seed: int = 0):
    import xarray as xr

    lat, lon = grid(preset)
    ds = xr.Dataset(
        {"orography": (("latitude", "longitude"), orography(preset, seed))},
        coords={"latitude": ("latitude", lat), "longitude": ("longitude", lon)},
        attrs={"title": "ERA5-like invariant fields", "source": "zarrtorch.course.era5_like", "seed": int(seed)},
    )
    ds["orography"].attrs = {"units": UNITS["orography"], "long_name": LONG_NAMES["orography"]}
    ds["latitude"].attrs = {"units": "degrees_north", "long_name": "latitude"}
    ds["longitude"].attrs = {"units": "degrees_east", "long_name": "longitude"}
    return ds


def _write(ds, path: Path) -> None:
    import dask

    tmp = path.with_name(path.name + ".part")
    tmp.unlink(missing_ok=True)
    encoding = {n: {"dtype": "float32"} for n in ds.data_vars}
    if "time" in ds.coords:
        encoding["time"] = {"units": "hours since 1900-01-01 00:00:00", "calendar": "gregorian", "dtype": "int32"}
    with dask.config.set(scheduler="threads"):  # not a cluster a notebook may have started
        ds.to_netcdf(tmp, engine="h5netcdf", encoding=encoding)
    tmp.replace(path)


def era5_like_dir(size: str | None = None) -> Path:
    """Where the files of one size live: ``data/<size>/era5_like`` (``zarrtorch.course.paths.data_dir``)."""
    from zarrtorch.course.paths import data_dir

    return data_dir(size) / "era5_like"


def make_era5_like(
    size: str | Era5Preset | None = None, *, seed: int = 0, overwrite: bool = False, root=None
) -> dict[str, object]:
    """Write ``era5like_<year>.nc`` for each year and ``static.nc`` into ``root`` (default
    :func:`era5_like_dir`), unless a marker file there records the same size, seed and preset.

    Returns ``{"folder": Path, "years": [Path, ...], "static": Path}``.
    """
    name, preset = _preset(size)
    if name == "custom" and root is None:
        raise ValueError("a custom Era5Preset needs an explicit root= folder")
    folder = Path(root) if root is not None else era5_like_dir(name)
    years = [preset.first_year + k for k in range(preset.years)]
    result = {
        "folder": folder,
        "years": [folder / f"era5like_{y}.nc" for y in years],
        "static": folder / "static.nc",
    }
    marker = folder / MARKER
    wanted = {"size": name, "seed": int(seed), "preset": asdict(preset), "format": FORMAT}
    paths = [*result["years"], result["static"]]
    if not overwrite and marker.exists() and all(p.exists() for p in paths):
        try:
            if json.loads(marker.read_text()) == wanted:
                return result
        except (OSError, ValueError):
            pass
    folder.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)  # an interrupted run leaves no marker
    for old in folder.glob("era5like_*.nc"):  # another size's years would join open_mfdataset's glob
        old.unlink()
    for y, path in zip(years, result["years"], strict=True):
        _write(year_dataset(y, preset, seed), path)
    _write(static_dataset(preset, seed), result["static"])
    marker.write_text(json.dumps(wanted, indent=2) + "\n")
    return result


def ensure_era5_like(size: str | None = None, seed: int = 0) -> dict[str, object]:
    """The files for ``size`` (default ``$ZARRTORCH_SIZE`` or ``small``), written once: what lesson 08 calls."""
    return make_era5_like(size, seed=seed)
