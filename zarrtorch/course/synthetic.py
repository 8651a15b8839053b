"""A deterministic, download-free, geoscience-like dataset for the course.

Four gridded variables on a regular lat/lon grid, every 6 hours from 2000-01-01:

* ``t`` temperature-like (degC): a pole-to-equator gradient; a seasonal cycle of opposite sign in the two
  hemispheres (period 365.25 days); a slow warming trend plus a multi-year oscillation, so the data *drift*
  along the time axis; a diurnal cycle that follows local solar time (a ``cos(2 pi t / 24 h + lon)`` pattern
  that moves westward); travelling waves (zonal wavenumbers 2, 4 and 6 in mid-latitude storm tracks) whose
  eastward phase speed ``c(lat, t)`` changes with the season (fast in the local winter, slow in summer);
  and noise: spatially smooth Gaussian noise plus a little white noise, independent from step to step.
* ``u`` zonal wind (m/s): the advection speed of the waves, ``c(lat, t)`` converted to m/s, plus a
  geostrophic-like anomaly from the meridional gradient of the waves, plus noise. A model can read the
  current wave speed off ``u``.
* ``v`` meridional wind (m/s): geostrophic-like anomaly from the zonal gradient of the waves, a diurnal
  "tide" in quadrature with the diurnal temperature cycle (so the next step's diurnal temperature can be
  read off ``v``), plus noise.
* ``q`` humidity-like (g/kg): a saturation-like function of ``t`` (Clausius-Clapeyron shape), times a
  smooth relative-humidity noise, plus white noise.

The prediction ``target[i]`` is ``t`` at the next step ``i + 1`` (noise included), so
``target[i] == fields[i + 1, 0]`` exactly. The diurnal cycle and the waves move predictably (a small CNN beats
persistence), the noise sets an error floor, and the season-dependent wave speed means a model trained on one
season only does worse on the others.

Every value is a pure function of ``(seed, time index)``: the deterministic part is in closed form (the wave
phase is the time integral of ``c(t)`` written analytically) and the noise of step ``i`` and variable ``k``
comes from ``numpy.random.default_rng([seed, i, k])``. So the lazy (dask) dataset can be computed in any
chunking, any block alone gives the same numbers as the same rows inside a bigger block, and writing it
needs memory for one time block only.
"""

from __future__ import annotations

import functools
import json
import shutil
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

VARIABLES = ("t", "u", "v", "q")
UNITS = {"t": "degC", "u": "m s-1", "v": "m s-1", "q": "g kg-1"}
LONG_NAMES = {
    "t": "temperature-like field",
    "u": "zonal wind-like field",
    "v": "meridional wind-like field",
    "q": "specific-humidity-like field",
}
START = "2000-01-01"
STEP_HOURS = 6
STEPS_PER_DAY = 24 // STEP_HOURS
TARGET_DEFINITION = "target[i] = fields[i + 1, variable='t']: temperature at the next 6-hourly step"


@dataclass(frozen=True)
class Preset:
    """Shape of one generated dataset: ``n_time`` 6-hourly steps on an ``n_lat`` x ``n_lon`` grid.

    ``time_chunk`` is the archive's chunk length along time (124 steps = one month of 6-hourly data).
    """

    n_time: int
    n_lat: int
    n_lon: int
    time_chunk: int = 124

    def __post_init__(self) -> None:
        for name in ("n_time", "n_lat", "n_lon", "time_chunk"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"Preset.{name} must be >= 1, got {getattr(self, name)!r}")

    @property
    def sample_nbytes(self) -> int:
        """Bytes of one sample: the four float32 input fields plus the float32 target."""
        return (len(VARIABLES) + 1) * self.n_lat * self.n_lon * 4

    @property
    def nbytes(self) -> int:
        """Bytes of the whole dataset (fields + target), uncompressed."""
        return self.n_time * self.sample_nbytes


PRESETS: dict[str, Preset] = {
    # one year of 6-hourly steps on a 32 x 64 grid: 1460 * 40 KiB ~ 60 MB
    "tiny": Preset(n_time=1460, n_lat=32, n_lon=64, time_chunk=124),
    # 13 years on the same grid: 18,980 * 40 KiB ~ 0.78 GB
    "small": Preset(n_time=18_980, n_lat=32, n_lon=64, time_chunk=124),
    # ~11.2 years on a 128 x 256 grid: 16,384 * 640 KiB = 10 GiB (10.7 GB)
    "workshop": Preset(n_time=16_384, n_lat=128, n_lon=256, time_chunk=124),
}

# rows per chunk of the training store (``train.zarr``), per size
TRAIN_CHUNK_ROWS: dict[str, int] = {"tiny": 64, "small": 64, "workshop": 32}

# ---------------------------------------------------------------------------------------------------------
# The model's constants (degrees, hours, steps). Magnitudes stay within O(1)-O(30).
# ---------------------------------------------------------------------------------------------------------
T_EQUATOR = 27.0  # degC at the equator
T_POLE_DROP = 45.0  # T_base = T_EQUATOR - T_POLE_DROP * sin(lat)^2
SEASON_AMP = 10.0  # degC at the poles, times sin(lat): opposite sign in the two hemispheres
SEASON_COLDEST_DAY = 20.0  # day of year of the northern-hemisphere minimum (and of the fastest NH waves)
DAYS_PER_YEAR = 365.25
TREND_PER_YEAR = 0.6  # degC per year: the slow drift along time
OSC_AMP, OSC_PERIOD_YEARS = 1.0, 3.7  # an ENSO-like multi-year oscillation
DIURNAL_AMP = 3.0  # degC, times cos(lat)
DIURNAL_PEAK_HOUR = 15.0  # local solar time of the daily maximum
WAVENUMBERS = (2, 4, 6)
WAVE_AMPS = (4.0, 3.0, 2.0)  # degC
WAVE_AMP_MOD = 0.3  # relative amplitude modulation
WAVE_MOD_PERIOD_DAYS = (11.0, 7.0, 5.0)
WAVE_DISPERSION = (0.8, 0.0, -0.5)  # degrees of longitude per step added to each wavenumber's speed
C_MEAN, C_SEASON = 6.0, 4.0  # wave speed in degrees of longitude per 6-h step: 6 +- 4 (winter fast)
STORM_TRACK_LAT, STORM_TRACK_WIDTH = 45.0, 15.0
JET_FLOOR, JET_WIDTH = 0.25, 20.0
HEMISPHERE_BLEND = 10.0  # degrees: tanh(lat / 10) switches the season between hemispheres
DEG_PER_STEP_TO_MS = 2 * np.pi * 6_371_000.0 / 360.0 / (STEP_HOURS * 3600.0)  # ~5.15 m/s per (deg/step) at equator
GEO = 0.3  # wind anomaly per unit temperature gradient (per radian)
DIURNAL_V_AMP = 2.0  # m/s, times cos(lat)
NOISE = {  # (smooth std, white std); q's smooth noise is relative (a relative humidity perturbation)
    "t": (1.0, 0.3),
    "u": (2.0, 0.5),
    "v": (2.0, 0.5),
    "q": (0.08, 0.1),
}
Q_RH = 0.75  # mean relative humidity
NOISE_KNOT_LAT = np.linspace(-80.0, 80.0, 9)  # smooth noise: Gaussian values on a 20 x 22.5 degree grid,
NOISE_KNOT_LON = np.arange(16) * 22.5  # interpolated with Gaussian kernels (same scales for every preset)
_CONST_STREAM = 1000  # rng([seed, 0, 1000]) draws the seed-dependent constants; variables use 0..3


def _as_preset(size: str | Preset | None) -> tuple[str, Preset]:
    if isinstance(size, Preset):
        return "custom", size
    from zarrtorch.course.paths import course_size

    name = course_size(size)
    return name, PRESETS[name]


# ---------------------------------------------------------------------------------------------------------
# The generator: pure functions of (preset, seed, time indices)
# ---------------------------------------------------------------------------------------------------------
class _Model:
    """Grid, seed-dependent constants and precomputed spatial factors for one (preset, seed)."""

    def __init__(self, preset: Preset, seed: int) -> None:
        self.preset, self.seed = preset, int(seed)
        self.lat = np.linspace(-80.0, 80.0, preset.n_lat) if preset.n_lat > 1 else np.zeros(1)
        self.lon = np.arange(preset.n_lon) * (360.0 / preset.n_lon)
        phi, lam = np.deg2rad(self.lat), np.deg2rad(self.lon)
        self.sin_lat, self.cos_lat = np.sin(phi), np.cos(phi)
        self.cos_lon, self.sin_lon = np.cos(lam), np.sin(lam)

        rng = np.random.default_rng([self.seed, 0, _CONST_STREAM])
        self.wave_phase = rng.uniform(0, 2 * np.pi, len(WAVENUMBERS))  # psi_k
        self.wave_mod_phase = rng.uniform(0, 2 * np.pi, len(WAVENUMBERS))  # chi_k
        self.osc_phase = rng.uniform(0, 2 * np.pi)

        self.t_base = T_EQUATOR - T_POLE_DROP * self.sin_lat**2  # (lat,)
        d = np.abs(self.lat) - STORM_TRACK_LAT
        self.env = np.exp(-((d / STORM_TRACK_WIDTH) ** 2))  # storm-track envelope E(lat)
        # dE/dlat in radians: -2 d / w^2 * sign(lat) * E * (180 / pi)
        self.denv = -2.0 * d / STORM_TRACK_WIDTH**2 * np.sign(self.lat) * self.env * (180.0 / np.pi)
        self.jet = JET_FLOOR + (1 - JET_FLOOR) * np.exp(-((d / JET_WIDTH) ** 2))  # J(lat), speed profile
        self.hemi = np.tanh(self.lat / HEMISPHERE_BLEND)  # +1 north, -1 south
        self.wave_cos, self.wave_sin = [], []  # cos/sin(k lon + psi_k), (lon,)
        for k, psi in zip(WAVENUMBERS, self.wave_phase, strict=True):
            self.wave_cos.append(np.cos(k * lam + psi))
            self.wave_sin.append(np.sin(k * lam + psi))
        # smooth noise: value at (lat, lon) = sum_ab A[lat, a] z[a, b] B[lon, b], each row of A and B with unit
        # L2 norm so the noise has unit variance everywhere
        dl = self.lat[:, None] - NOISE_KNOT_LAT[None, :]
        a = np.exp(-0.5 * (dl / 20.0) ** 2)
        self.noise_a = a / np.linalg.norm(a, axis=1, keepdims=True)
        dlon = (self.lon[:, None] - NOISE_KNOT_LON[None, :] + 180.0) % 360.0 - 180.0
        b = np.exp(-0.5 * (dlon / 22.5) ** 2)
        self.noise_bt = (b / np.linalg.norm(b, axis=1, keepdims=True)).T.copy()  # (knots, lon)

    # -- closed-form pieces, all vectorised over the time indices `i` (int64, shape (B,)) --------------------
    def season_angle(self, i: np.ndarray) -> np.ndarray:
        return 2 * np.pi * (i / STEPS_PER_DAY - SEASON_COLDEST_DAY) / DAYS_PER_YEAR

    def wave_speed(self, i: np.ndarray) -> np.ndarray:
        """Eastward phase speed ``c(lat, t)`` of the waves in degrees of longitude per step, (B, lat)."""
        s = np.cos(self.season_angle(i))[:, None]
        return self.jet * (C_MEAN + C_SEASON * self.hemi * s)

    def wave_position(self, i: np.ndarray) -> np.ndarray:
        """Integral of ``c`` from step 0 to step ``i`` (degrees of longitude), in closed form, (B, lat)."""
        w = 2 * np.pi / (DAYS_PER_YEAR * STEPS_PER_DAY)  # season frequency per step
        i0 = SEASON_COLDEST_DAY * STEPS_PER_DAY
        integral = (np.sin(w * (i - i0)) + np.sin(w * i0)) / w  # = int_0^i cos(w (s - i0)) ds
        return self.jet * (C_MEAN * i[:, None] + C_SEASON * self.hemi * integral[:, None])

    def _wave_terms(self, i: np.ndarray):
        """Per wavenumber: amplitude a_k(t) E(lat), cos(k theta_k), sin(k theta_k), each (B, lat) float32."""
        pos = np.deg2rad(self.wave_position(i))
        out = []
        for n, k in enumerate(WAVENUMBERS):
            theta = pos + np.deg2rad(WAVE_DISPERSION[n]) * i[:, None]
            mod = 1 + WAVE_AMP_MOD * np.sin(
                2 * np.pi * i / (WAVE_MOD_PERIOD_DAYS[n] * STEPS_PER_DAY) + self.wave_mod_phase[n]
            )
            amp = WAVE_AMPS[n] * mod[:, None]
            out.append((amp, np.cos(k * theta), np.sin(k * theta)))
        return out

    def _diurnal(self, i: np.ndarray):
        """cos and sin of the local-solar-time phase, (B, 1, lon) float32 each."""
        hour = np.mod(i * STEP_HOURS, 24).astype(np.float64)  # exact
        a = 2 * np.pi * (hour - DIURNAL_PEAK_HOUR) / 24.0
        ca, sa = np.cos(a)[:, None], np.sin(a)[:, None]
        cos_d = ca * self.cos_lon - sa * self.sin_lon  # cos(a + lon)
        sin_d = sa * self.cos_lon + ca * self.sin_lon  # sin(a + lon)
        return cos_d[:, None, :].astype(np.float32), sin_d[:, None, :].astype(np.float32)

    def _noise(self, i: np.ndarray, var: str):
        """Smooth (B, lat, lon) and white (B, lat, lon) standard-normal noise, step by step, float32."""
        vi = VARIABLES.index(var)
        nb, nl, nm = len(i), self.preset.n_lat, self.preset.n_lon
        z = np.empty((nb, len(NOISE_KNOT_LAT), len(NOISE_KNOT_LON)))
        white = np.empty((nb, nl, nm), dtype=np.float32)
        for j, step in enumerate(i.tolist()):
            rng = np.random.default_rng([self.seed, step, vi])
            z[j] = rng.standard_normal(z.shape[1:])
            white[j] = rng.standard_normal((nl, nm), dtype=np.float32)
        smooth = np.empty((nb, nl, nm), dtype=np.float32)
        for j in range(nb):  # one fixed-shape product per step: identical in any chunking
            smooth[j] = self.noise_a @ z[j] @ self.noise_bt
        return smooth, white

    # -- the variables ---------------------------------------------------------------------------------------
    def temperature(self, i: np.ndarray) -> np.ndarray:
        years = i * STEP_HOURS / (DAYS_PER_YEAR * 24.0)
        trend = TREND_PER_YEAR * years + OSC_AMP * np.sin(2 * np.pi * years / OSC_PERIOD_YEARS + self.osc_phase)
        season = -SEASON_AMP * self.sin_lat * np.cos(self.season_angle(i))[:, None]  # (B, lat)
        zonal = (self.t_base + season + trend[:, None]).astype(np.float32)[:, :, None]
        cos_d, _ = self._diurnal(i)
        out = zonal + (DIURNAL_AMP * self.cos_lat).astype(np.float32)[:, None] * cos_d
        for n, (amp, ck, sk) in enumerate(self._wave_terms(i)):
            a = (amp * self.env).astype(np.float32)[:, :, None]
            out += a * (
                ck.astype(np.float32)[:, :, None] * self.wave_cos[n].astype(np.float32)
                + sk.astype(np.float32)[:, :, None] * self.wave_sin[n].astype(np.float32)
            )
        smooth, white = self._noise(i, "t")
        s_amp, w_amp = NOISE["t"]
        out += np.float32(s_amp) * smooth + np.float32(w_amp) * white
        return out

    def zonal_wind(self, i: np.ndarray) -> np.ndarray:
        mean = (DEG_PER_STEP_TO_MS * self.cos_lat * self.wave_speed(i)).astype(np.float32)  # (B, lat)
        out = np.repeat(mean[:, :, None], self.preset.n_lon, axis=2)
        for n, (amp, ck, sk) in enumerate(self._wave_terms(i)):
            # u' = -GEO * dW/dlat
            a = (-GEO * amp * self.denv).astype(np.float32)[:, :, None]
            out += a * (
                ck.astype(np.float32)[:, :, None] * self.wave_cos[n].astype(np.float32)
                + sk.astype(np.float32)[:, :, None] * self.wave_sin[n].astype(np.float32)
            )
        smooth, white = self._noise(i, "u")
        s_amp, w_amp = NOISE["u"]
        out += np.float32(s_amp) * smooth + np.float32(w_amp) * white
        return out

    def meridional_wind(self, i: np.ndarray) -> np.ndarray:
        _, sin_d = self._diurnal(i)
        out = (DIURNAL_V_AMP * self.cos_lat).astype(np.float32)[:, None] * sin_d
        for n, (amp, ck, sk) in enumerate(self._wave_terms(i)):
            # v' = GEO * dW/dlon / cos(lat); dW/dlon = -k a E (sin(k lon + psi) cos(k th) - cos(.) sin(k th))
            k = WAVENUMBERS[n]
            a = (-GEO * k * amp * self.env / self.cos_lat).astype(np.float32)[:, :, None]
            out += a * (
                ck.astype(np.float32)[:, :, None] * self.wave_sin[n].astype(np.float32)
                - sk.astype(np.float32)[:, :, None] * self.wave_cos[n].astype(np.float32)
            )
        smooth, white = self._noise(i, "v")
        s_amp, w_amp = NOISE["v"]
        out += np.float32(s_amp) * smooth + np.float32(w_amp) * white
        return out

    def humidity(self, i: np.ndarray) -> np.ndarray:
        t = self.temperature(i)
        qsat = np.float32(3.8) * np.exp(np.float32(17.27) * t / (t + np.float32(237.3)))
        smooth, white = self._noise(i, "q")
        s_amp, w_amp = NOISE["q"]
        return np.float32(Q_RH) * qsat * (1 + np.float32(s_amp) * smooth) + np.float32(w_amp) * white

    def variable(self, var: str, i: np.ndarray) -> np.ndarray:
        i = np.asarray(i, dtype=np.int64).reshape(-1)
        fn = {"t": self.temperature, "u": self.zonal_wind, "v": self.meridional_wind, "q": self.humidity}[var]
        return np.ascontiguousarray(fn(i), dtype=np.float32)


@functools.lru_cache(maxsize=16)
def _model(preset: Preset, seed: int) -> _Model:
    return _Model(preset, seed)


def compute_rows(preset: Preset, seed: int, var: str, start: int, stop: int) -> np.ndarray:
    """Values of variable ``var`` at time indices ``start..stop-1``: float32 (stop - start, n_lat, n_lon).

    The pure function behind the lazy dataset (any index, also beyond ``n_time``: the target's last row is
    ``t`` at index ``n_time``).
    """
    if var not in VARIABLES:
        raise ValueError(f"unknown variable {var!r}: one of {VARIABLES}")
    return _model(preset, int(seed)).variable(var, np.arange(start, stop, dtype=np.int64))


def _block(idx: np.ndarray, *, preset: Preset, seed: int, var: str) -> np.ndarray:
    """dask block function: ``idx`` is the block's 1-d array of time indices."""
    return _model(preset, seed).variable(var, idx)


def wave_speed(size: str | Preset = "tiny", seed: int = 0, time_index=None) -> np.ndarray:
    """The waves' eastward phase speed (degrees of longitude per step), (time, lat): for lessons and tests."""
    _, preset = _as_preset(size)
    i = np.arange(preset.n_time) if time_index is None else np.atleast_1d(np.asarray(time_index, dtype=np.int64))
    return _model(preset, int(seed)).wave_speed(i)


# ---------------------------------------------------------------------------------------------------------
# The lazy dataset
# ---------------------------------------------------------------------------------------------------------
def synthetic_dataset(size: str | Preset = "tiny", seed: int = 0):
    """The synthetic dataset as a lazy, dask-backed :class:`xarray.Dataset` (building it computes nothing).

    ``fields`` (time, variable, lat, lon) float32, chunked (time_chunk, 1, n_lat, n_lon) like a climate archive;
    ``target`` (time, lat, lon) float32 = ``t`` at the next step, chunked (time_chunk, n_lat, n_lon).
    """
    import dask.array as da
    import pandas as pd
    import xarray as xr

    name, preset = _as_preset(size)
    seed = int(seed)
    model = _model(preset, seed)
    nt, nl, nm, tc = preset.n_time, preset.n_lat, preset.n_lon, preset.time_chunk
    meta = np.empty((0, 0, 0), dtype=np.float32)

    def lazy(var: str, first: int):
        idx = da.arange(first, first + nt, chunks=tc, dtype=np.int64)
        return da.map_blocks(
            _block,
            idx,
            preset=preset,
            seed=seed,
            var=var,
            new_axis=[1, 2],
            chunks=(idx.chunks[0], (nl,), (nm,)),
            dtype=np.float32,
            meta=meta,
            name=f"synthetic-{var}{'-next' if first else ''}-{seed}-{nt}x{nl}x{nm}-{tc}",
        )

    fields = da.stack([lazy(v, 0) for v in VARIABLES], axis=1)  # chunks (tc, 1, nl, nm)
    target = lazy("t", 1)
    time = pd.date_range(START, periods=nt, freq=f"{STEP_HOURS}h")
    ds = xr.Dataset(
        {
            "fields": (("time", "variable", "lat", "lon"), fields),
            "target": (("time", "lat", "lon"), target),
        },
        coords={
            "time": ("time", time.values.astype("datetime64[ns]")),
            "variable": ("variable", np.array(VARIABLES, dtype=object)),  # variable-length strings in Zarr v3
            "lat": ("lat", model.lat.astype(np.float32)),
            "lon": ("lon", model.lon.astype(np.float32)),
        },
        attrs={
            "title": "zarrtorch synthetic geoscience-like dataset",
            "description": (
                "Deterministic synthetic data (no download): temperature-like t with a latitude gradient, "
                "hemispheric seasonal cycle, multi-year trend (drift), diurnal cycle in local solar time, "
                "travelling waves whose phase speed changes with the season, smooth + white noise; winds u, v "
                "consistent with the waves (u carries the wave speed); humidity-like q from t."
            ),
            "source": "zarrtorch.course.synthetic",
            "seed": seed,
            "preset": name,
            "n_time": nt,
            "n_lat": nl,
            "n_lon": nm,
            "time_chunk": tc,
            "time_step_hours": STEP_HOURS,
            "variables": list(VARIABLES),
            "target": TARGET_DEFINITION,
        },
    )
    ds["fields"].attrs = {
        "long_name": "input fields: " + ", ".join(f"{v} ({LONG_NAMES[v]}, {UNITS[v]})" for v in VARIABLES),
        "units_by_variable": json.dumps(UNITS),
    }
    ds["target"].attrs = {"long_name": TARGET_DEFINITION, "units": UNITS["t"]}
    ds["time"].attrs = {"long_name": "time", "standard_name": "time"}
    ds["lat"].attrs = {"units": "degrees_north", "standard_name": "latitude"}
    ds["lon"].attrs = {"units": "degrees_east", "standard_name": "longitude"}
    ds["variable"].attrs = {"long_name": "input variable"}
    return ds


# ---------------------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------------------
def write_archive(ds, path, *, progress: bool = True) -> Path:
    """Write ``ds`` as a Zarr v3 store in its dask chunking, one time block at a time (bounded memory).

    Metadata and coordinates first (``to_zarr(compute=False)``), then each block of ``time_chunk`` steps is
    computed and written whole into the arrays (empty chunks written too), then the metadata are
    consolidated. An existing store at ``path`` is replaced. ``xarray.open_zarr(path)`` reads it back.
    """
    import dask
    import zarr
    from tqdm import tqdm

    path = Path(path)
    if "time" not in ds.dims:
        raise ValueError("write_archive needs a dataset with a `time` dimension")
    time_vars = [n for n, v in ds.data_vars.items() if "time" in v.dims]
    other_vars = [n for n in ds.data_vars if n not in time_vars]
    for n in time_vars:
        if ds[n].dims[0] != "time":
            raise ValueError(f"{n}: time must be the first dimension, got {ds[n].dims}")
    if "time" not in ds.chunksizes:  # NumPy-backed: the archive layout, monthly blocks and one variable a chunk
        chunks = {"time": int(ds.attrs.get("time_chunk", 124))}
        ds = ds.chunk(chunks | ({"variable": 1} if "variable" in ds.dims else {}))
    bounds = np.cumsum((0,) + tuple(ds.chunksizes["time"])).tolist()

    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ds = ds.copy()
    for v in ds.variables.values():  # stale encodings (e.g. from an opened store) could change the chunking
        v.encoding = {}
    # metadata, coordinates (and any NumPy-backed variable); dask-backed variables are written below
    ds.to_zarr(path, mode="w", compute=False, zarr_format=3, consolidated=False)

    with zarr.config.set({"array.write_empty_chunks": True}):
        group = zarr.open_group(str(path), mode="r+", zarr_format=3)
        for n in other_vars:
            group[n][...] = ds[n].values
        arrays = {n: group[n] for n in time_vars}
        bar = tqdm(total=bounds[-1], desc=f"writing {path.name}", unit="step", disable=not progress)
        try:
            for a, b in zip(bounds[:-1], bounds[1:], strict=True):
                block = ds[time_vars].isel(time=slice(a, b))
                values = dask.compute(*(block[n].data for n in time_vars))  # this block only
                for n, vals in zip(time_vars, values, strict=True):
                    arrays[n][a:b] = vals
                bar.update(b - a)
        finally:
            bar.close()
    # consolidated metadata last, so `xarray.open_zarr(path)` opens it without a fallback warning
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        zarr.consolidate_metadata(str(path))
    return path


# ---------------------------------------------------------------------------------------------------------
# The course's entry points
# ---------------------------------------------------------------------------------------------------------
MARKER = ".complete"
# Bump when the generator or the training-store layout changes, so existing data folders are regenerated.
DATA_FORMAT = 2


def _paths(size_name: str, root) -> tuple[Path, Path, Path]:
    """(folder, archive, train): ``root`` if given, else ``zarrtorch.course.paths.data_dir(size)``; the store names
    are those of :mod:`zarrtorch.course.paths` (``archive.zarr``, ``train.zarr``)."""
    from zarrtorch.course import paths

    if root is not None:
        folder = Path(root)
        return folder, folder / paths.archive_path("tiny").name, folder / paths.train_store_path("tiny").name
    return paths.data_dir(size_name), paths.archive_path(size_name), paths.train_store_path(size_name)


def make_data(
    size: str | Preset | None = None,
    *,
    seed: int = 0,
    overwrite: bool = False,
    progress: bool = True,
    root=None,
) -> dict[str, Path]:
    """Generate ``archive.zarr`` (archive layout) and ``train.zarr`` (chunked along time only), and for a named
    size also lesson 08's ERA5-like netCDF files in ``<folder>/era5_like`` (:mod:`zarrtorch.course.era5_like`).

    Every file a lesson reads is written here, before any lesson runs: on a hub the shared data is read-only, and
    a lesson that generated its input on first use would fail there (or, beside other readers, change the folder
    while they read it).

    ``size``: ``tiny`` | ``small`` | ``workshop`` (default ``$ZARRTORCH_SIZE`` or ``small``), or a :class:`Preset`.
    ``root``: the folder to write into (default ``zarrtorch.course.paths.data_dir(size)``). Work is skipped when the
    marker files ``<folder>/.complete`` and ``<folder>/era5_like/.complete`` (each written last) record the same
    size, seed and preset, unless ``overwrite``. Returns ``{"archive": path, "train": path}``, plus
    ``"era5_like": folder`` for a named size.
    """
    import xarray as xr

    name, preset = _as_preset(size)
    seed = int(seed)
    if name == "custom" and root is None:
        raise ValueError("a custom Preset needs an explicit root= folder")
    folder, archive, train = _paths(name, root)
    marker = folder / MARKER
    wanted = {"size": name, "seed": seed, "preset": asdict(preset), "format": DATA_FORMAT}
    result = {"archive": archive, "train": train}
    if name != "custom":
        from zarrtorch.course.era5_like import make_era5_like

        result["era5_like"] = make_era5_like(name, seed=seed, overwrite=overwrite, root=folder / "era5_like")["folder"]
    if not overwrite and marker.exists() and archive.exists() and train.exists():
        try:
            found = json.loads(marker.read_text())
        except (OSError, ValueError):
            found = None
        if found == wanted:
            return result

    folder.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)  # an interrupted run leaves no marker behind
    write_archive(synthetic_dataset(preset if name == "custom" else name, seed=seed), archive, progress=progress)

    from zarrtorch.prepare import prepare_zarr

    prepare_zarr(
        xr.open_zarr(archive),
        train,
        variables=["fields", "target"],
        chunk_rows=TRAIN_CHUNK_ROWS.get(name, 64),
        overwrite=True,
        progress=progress,
    )
    marker.write_text(json.dumps(wanted, indent=2) + "\n")
    return result


def ensure_data(size: str | None = None, seed: int = 0) -> dict[str, Path]:
    """The data for ``size`` (default ``$ZARRTORCH_SIZE`` or ``small``), generated once: what notebooks call."""
    return make_data(size, seed=seed, overwrite=False, progress=False)
