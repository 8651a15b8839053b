"""Tests of the synthetic dataset generator (zarrtorch.course.synthetic): small custom presets, fast."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr
import zarr

from zarrtorch.course import synthetic
from zarrtorch.course.synthetic import (
    PRESETS,
    TRAIN_CHUNK_ROWS,
    VARIABLES,
    Preset,
    compute_rows,
    make_data,
    synthetic_dataset,
    write_archive,
)

# 40 steps (10 days) on an 8 x 16 grid, chunks of 12 steps (the last one short)
SMALL = Preset(n_time=40, n_lat=8, n_lon=16, time_chunk=12)
# one year on a coarse grid, for the drift tests
YEAR = Preset(n_time=1460, n_lat=16, n_lon=32, time_chunk=124)


@pytest.fixture(scope="module")
def small_values():
    ds = synthetic_dataset(SMALL, seed=3)
    return ds.fields.values, ds.target.values


@pytest.fixture(scope="module")
def year():
    return synthetic_dataset(YEAR, seed=0).compute()


def test_lazy_construction_computes_nothing(monkeypatch):
    calls = []
    real = synthetic._block

    def counting(idx, **kw):
        calls.append((int(idx[0]) if len(idx) else None, kw["var"]))
        return real(idx, **kw)

    monkeypatch.setattr(synthetic, "_block", counting)
    ds = synthetic_dataset(SMALL, seed=1)
    assert calls == []
    assert ds.fields.chunks is not None and ds.target.chunks is not None  # dask-backed
    sub = ds.fields.isel(time=slice(0, 5), variable=1)
    assert calls == []
    _ = sub.values  # computing one block touches only that block
    assert calls == [(0, "u")]


def test_structure_coordinates_and_chunks():
    ds = synthetic_dataset(SMALL, seed=0)
    assert ds.fields.dims == ("time", "variable", "lat", "lon")
    assert ds.target.dims == ("time", "lat", "lon")
    assert ds.fields.dtype == np.float32 and ds.target.dtype == np.float32
    assert ds.fields.shape == (40, 4, 8, 16)
    assert ds.fields.data.chunks == ((12, 12, 12, 4), (1, 1, 1, 1), (8,), (16,))
    assert ds.target.data.chunks == ((12, 12, 12, 4), (8,), (16,))
    assert list(ds.variable.values) == list(VARIABLES) == ["t", "u", "v", "q"]
    assert ds.time.values[0] == np.datetime64("2000-01-01T00:00")
    assert np.all(np.diff(ds.time.values) == np.timedelta64(6, "h"))
    assert ds.lat.values[0] == -80 and ds.lat.values[-1] == 80
    assert ds.lon.values[0] == 0 and ds.lon.values[-1] < 360
    np.testing.assert_allclose(np.diff(ds.lon.values), 360 / 16)
    assert ds.attrs["seed"] == 0 and "target" in ds.attrs and ds.attrs["preset"] == "custom"
    assert synthetic_dataset("tiny").attrs["preset"] == "tiny"


def test_determinism(small_values):
    fields, target = small_values
    again = synthetic_dataset(SMALL, seed=3)
    np.testing.assert_array_equal(again.fields.values, fields)
    np.testing.assert_array_equal(again.target.values, target)
    other = synthetic_dataset(SMALL, seed=4).fields.values
    for k in range(4):
        assert not np.allclose(other[:, k], fields[:, k]), VARIABLES[k]
    assert np.isfinite(fields).all() and np.isfinite(target).all()


def test_chunk_independence(small_values):
    fields, target = small_values
    ds = synthetic_dataset(SMALL, seed=3)
    # rows 5..29 in chunks of 7: block boundaries differ from the 12-step chunks
    sub = ds.isel(time=slice(5, 30)).chunk(time=7)
    np.testing.assert_array_equal(sub.fields.values, fields[5:30])
    np.testing.assert_array_equal(sub.target.values, target[5:30])
    # single rows straight from the pure function
    for i in (0, 11, 12, 39):
        for k, var in enumerate(VARIABLES):
            np.testing.assert_array_equal(compute_rows(SMALL, 3, var, i, i + 1)[0], fields[i, k])
    # a different chunk length of the preset itself gives the same numbers
    rechunked = synthetic_dataset(Preset(40, 8, 16, time_chunk=5), seed=3)
    np.testing.assert_array_equal(rechunked.fields.values, fields)


def test_target_is_next_temperature(small_values):
    fields, target = small_values
    np.testing.assert_array_equal(target[:-1], fields[1:, 0])
    np.testing.assert_array_equal(target[-1], compute_rows(SMALL, 3, "t", 40, 41)[0])
    # and it is not persistence
    assert np.sqrt(np.mean((target - fields[:, 0]) ** 2)) > 1.0


def test_magnitudes(year):
    f = year.fields.values
    for k, var in enumerate(VARIABLES):
        assert np.abs(f[:, k]).max() < 60, var
        assert f[:, k].std() > 1, var
    assert f[:, 3].min() > -1  # humidity stays (nearly) positive
    # q is correlated with t
    assert np.corrcoef(f[:, 0].ravel(), f[:, 3].ravel())[0, 1] > 0.8


def test_drift_seasons(year):
    t = year.fields.sel(variable="t")
    u = year.fields.sel(variable="u")
    month = year.time.dt.month
    north = year.lat > 30
    jan = month == 1
    jul = month == 7
    # seasonal means differ strongly, in opposite directions in the two hemispheres
    tn_jan = float(t.isel(time=jan.values).where(north).mean())
    tn_jul = float(t.isel(time=jul.values).where(north).mean())
    ts_jan = float(t.isel(time=jan.values).where(year.lat < -30).mean())
    ts_jul = float(t.isel(time=jul.values).where(year.lat < -30).mean())
    assert tn_jul - tn_jan > 8
    assert ts_jan - ts_jul > 8
    # the northern westerlies (and the wave speed) are much stronger in winter
    un_jan = float(u.isel(time=jan.values).where(north).mean())
    un_jul = float(u.isel(time=jul.values).where(north).mean())
    assert un_jan > 1.8 * un_jul > 0
    speed = synthetic.wave_speed(YEAR)  # degrees of longitude per step, (time, lat)
    row = int(np.argmin(np.abs(year.lat.values - 45)))
    assert speed[jan.values, row].mean() > 3 * speed[jul.values, row].mean()


def test_waves_move_at_the_seasonal_speed(year):
    """The wave pattern (t minus its zonal mean) shifts east by about c(t) per step: winter fast, summer slow."""
    t = year.fields.sel(variable="t").values
    lat = year.lat.values
    band = (lat > 35) & (lat < 55)
    anom = t[:, band] - t[:, band].mean(axis=2, keepdims=True)
    nlon = anom.shape[-1]
    dlon = 360 / nlon

    def best_shift(i):  # cells east by which step i's pattern best matches step i + 1
        errs = [np.mean((np.roll(anom[i], s, axis=-1) - anom[i + 1]) ** 2) for s in range(-3, 6)]
        return range(-3, 6)[int(np.argmin(errs))]

    month = year.time.dt.month.values
    winter = [best_shift(i) for i in np.flatnonzero(month == 1)[:100:4]]
    summer = [best_shift(i) for i in np.flatnonzero(month == 7)[:100:4]]
    assert np.mean(winter) * dlon > 5  # ~8-9 degrees per step
    assert np.mean(summer) * dlon < 3  # ~1.5-2.5 degrees per step


def test_trend_over_years():
    # 8 years, sampled every 31 days at 00 UTC: the global mean warms by ~0.6 degC a year
    p = Preset(n_time=8 * 1461, n_lat=8, n_lon=16, time_chunk=4 * 31)
    ds = synthetic_dataset(p, seed=0).fields.sel(variable="t").isel(time=slice(0, None, 4 * 365))
    first, last = float(ds.isel(time=0).mean()), float(ds.isel(time=-1).mean())
    assert last - first > 2.5


def test_presets_sizes_from_metadata():
    tiny = synthetic_dataset("tiny")
    small = synthetic_dataset("small")
    workshop = synthetic_dataset("workshop")
    assert tiny.nbytes <= 100e6
    assert 0.5e9 <= small.nbytes <= 1e9
    for name, ds in (("tiny", tiny), ("small", small), ("workshop", workshop)):
        assert ds.fields.nbytes + ds.target.nbytes == PRESETS[name].nbytes
    assert workshop.nbytes >= 10e9
    assert tiny.sizes["time"] == 1460 and (tiny.sizes["lat"], tiny.sizes["lon"]) == (32, 64)
    assert (small.sizes["lat"], small.sizes["lon"]) == (32, 64)
    assert (workshop.sizes["lat"], workshop.sizes["lon"]) == (128, 256)
    assert PRESETS["tiny"].sample_nbytes == 40 * 1024
    for name, p in PRESETS.items():
        assert p.time_chunk == 124, name
    assert TRAIN_CHUNK_ROWS == {"tiny": 64, "small": 64, "workshop": 32}


def test_write_archive_round_trip(tmp_path, small_values):
    fields, target = small_values
    ds = synthetic_dataset(SMALL, seed=3)
    path = write_archive(ds, tmp_path / "archive.zarr", progress=False)
    group = zarr.open_group(str(path), mode="r")
    assert group.metadata.zarr_format == 3
    assert group["fields"].chunks == (12, 1, 8, 16)
    assert group["target"].chunks == (12, 8, 16)
    back = xr.open_zarr(path)
    xr.testing.assert_identical(back.compute(), ds.compute())
    np.testing.assert_array_equal(back.fields.values, fields)
    np.testing.assert_array_equal(back.target.values, target)
    assert back.attrs["seed"] == 3
    # writing again replaces the store
    write_archive(synthetic_dataset(SMALL, seed=5), path, progress=False)
    assert xr.open_zarr(path).attrs["seed"] == 5


def test_write_archive_bounded_blocks(tmp_path, monkeypatch):
    """Each block computed during the write covers at most one time chunk."""
    sizes = []
    real = synthetic._block

    def recording(idx, **kw):
        sizes.append(len(idx))
        return real(idx, **kw)

    monkeypatch.setattr(synthetic, "_block", recording)
    write_archive(synthetic_dataset(SMALL, seed=0), tmp_path / "a.zarr", progress=False)
    assert max(sizes) == 12
    assert sum(sizes) == 5 * 40  # every row of the 4 fields and the target, once


def test_make_data_twice_skips(tmp_path, monkeypatch):
    pytest.importorskip("zarrtorch.prepare")
    root = tmp_path / "data"
    paths = make_data(SMALL, seed=2, root=root, progress=False)
    assert set(paths) == {"archive", "train"}
    assert paths["archive"] == root / "archive.zarr" and paths["train"] == root / "train.zarr"
    assert paths["archive"].exists() and paths["train"].exists()
    marker = json.loads((root / ".complete").read_text())
    assert marker["seed"] == 2 and marker["preset"]["n_time"] == 40
    np.testing.assert_array_equal(
        xr.open_zarr(paths["archive"]).fields.values, synthetic_dataset(SMALL, seed=2).fields.values
    )

    def fail(*a, **k):
        raise AssertionError("regenerated although the marker says the data are there")

    monkeypatch.setattr(synthetic, "write_archive", fail)
    assert make_data(SMALL, seed=2, root=root, progress=False) == paths
    # another seed regenerates
    with pytest.raises(AssertionError, match="regenerated"):
        make_data(SMALL, seed=7, root=root, progress=False)


def test_custom_preset_needs_root():
    with pytest.raises(ValueError):
        make_data(SMALL, progress=False)
    with pytest.raises(ValueError):
        synthetic_dataset("huge")


def test_write_archive_numpy_backed_input(tmp_path):
    ds = synthetic_dataset(SMALL, seed=1).compute()  # no dask: chunked by attrs["time_chunk"] and variable
    path = write_archive(ds, tmp_path / "np.zarr", progress=False)
    assert zarr.open_group(str(path), mode="r")["fields"].chunks == (12, 1, 8, 16)
    xr.testing.assert_identical(xr.open_zarr(path).compute(), ds)


def test_make_data_writes_every_file_a_lesson_reads_so_lessons_only_read_the_data(tmp_path, monkeypatch):
    """Lesson 08 once generated its ERA5-like files on first use, inside the shared data folder: read-only on a
    hub, and changed under the readers of data/tiny while CI's hub rehearsal compared it before and after. The
    named sizes' make-data writes those files too; what the lessons then call writes nothing."""
    from zarrtorch.course import era5_like

    monkeypatch.setenv("ZARRTORCH_DATA_DIR", str(tmp_path))
    paths = make_data("tiny", progress=False)
    assert paths["era5_like"] == tmp_path / "tiny" / "era5_like" == era5_like.era5_like_dir("tiny")
    assert (paths["era5_like"] / era5_like.MARKER).exists()

    def files():
        return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")}

    before = files()
    assert len([p for p in before if p.suffix == ".nc"]) == era5_like.PRESETS["tiny"].years + 1
    synthetic.ensure_data("tiny")
    era5_like.ensure_era5_like("tiny")
    assert files() == before
