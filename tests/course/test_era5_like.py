"""The ERA5-like NetCDF generator of lesson 08: one file per year, surface and pressure-level variables, a
static field in its own file, deterministic, any year computable alone."""

from __future__ import annotations

import numpy as np
import pytest

xr = pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")

from zarrtorch.course import era5_like  # noqa: E402
from zarrtorch.course.era5_like import Era5Preset, make_era5_like  # noqa: E402

PRESET = Era5Preset(first_year=2000, years=2, n_lat=6, n_lon=8)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return make_era5_like(PRESET, seed=3, root=tmp_path_factory.mktemp("era5") / "a")


def test_one_file_per_year_and_a_static_file(files):
    assert [p.name for p in files["years"]] == ["era5like_2000.nc", "era5like_2001.nc"]
    assert all(p.exists() for p in files["years"]) and files["static"].exists()
    for year, path in zip((2000, 2001), files["years"], strict=True):
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            t = ds["time"].values
            assert (t[0], t[-1]) == (np.datetime64(f"{year}-01-01T00"), np.datetime64(f"{year}-12-31T18"))
            assert np.all(np.diff(t) == np.timedelta64(6, "h"))
            assert len(t) == (366 if year == 2000 else 365) * 4  # 2000 is a leap year


def test_variables_levels_units_and_grid(files):
    with xr.open_mfdataset(files["years"], engine="h5netcdf") as ds:
        assert ds.sizes["time"] == (366 + 365) * 4
        assert ds["level"].values.tolist() == list(era5_like.LEVELS)
        for name in era5_like.SURFACE:
            assert ds[name].dims == ("time", "latitude", "longitude") and ds[name].dtype == np.float32
        for name in era5_like.UPPER:
            assert ds[name].dims == ("time", "level", "latitude", "longitude") and ds[name].dtype == np.float32
        for name in (*era5_like.SURFACE, *era5_like.UPPER):
            assert ds[name].attrs["units"] == era5_like.UNITS[name]
        lat = ds["latitude"].values
        assert len(lat) == PRESET.n_lat and np.all(np.diff(lat) < 0)  # north to south, as in ERA5
        assert ds["longitude"].size == PRESET.n_lon
        sample = ds.isel(time=slice(0, 40)).load()
    # ERA5's magnitudes: K, Pa, m2 s-2; colder and higher up the levels
    assert 200 < float(sample["t2m"].mean()) < 320 and 9e4 < float(sample["msl"].mean()) < 1.1e5
    t_levels = sample["t"].mean(("time", "latitude", "longitude")).values
    z_levels = sample["z"].mean(("time", "latitude", "longitude")).values
    assert np.all(np.diff(t_levels) < 0) and np.all(np.diff(z_levels) > 0)
    assert PRESET.channels == 2 + 3 * 3 and PRESET.step_bytes == 11 * 6 * 8 * 4


def test_static_field_has_no_time_axis(files):
    with xr.open_dataset(files["static"], engine="h5netcdf") as st:
        oro = st["orography"]
        assert oro.dims == ("latitude", "longitude") and oro.attrs["units"] == "m"
        assert float(oro.min()) >= 0 and float(oro.max()) > 0
        np.testing.assert_array_equal(oro.values, era5_like.orography(PRESET, seed=3))


def test_deterministic_and_each_year_alone(files, tmp_path):
    again = make_era5_like(PRESET, seed=3, root=tmp_path / "b")
    other_seed = make_era5_like(PRESET, seed=4, root=tmp_path / "c")
    for a, b, c in zip(files["years"], again["years"], other_seed["years"], strict=True):
        with (
            xr.open_dataset(a, engine="h5netcdf") as x,
            xr.open_dataset(b, engine="h5netcdf") as y,
            xr.open_dataset(c, engine="h5netcdf") as z,
        ):
            xr.testing.assert_identical(x.load(), y.load())
            assert not np.array_equal(x["t2m"].values, z["t2m"].values)
    # a step's values do not depend on the block it is computed in (the files are written a month at a time)
    with xr.open_dataset(files["years"][1], engine="h5netcdf") as ds:
        steps = era5_like.step_index(ds["time"].values[[0, 200, 201]])
        alone = era5_like.compute_steps(PRESET, 3, steps)
        for name in (*era5_like.SURFACE, *era5_like.UPPER):
            np.testing.assert_array_equal(ds[name].isel(time=[0, 200, 201]).values, alone[name])


def test_written_once_then_reused(files):
    before = [p.stat().st_mtime_ns for p in files["years"]]
    make_era5_like(PRESET, seed=3, root=files["folder"])
    assert [p.stat().st_mtime_ns for p in files["years"]] == before


def test_step_index_refuses_off_grid_times():
    assert era5_like.step_index(np.array(["2000-01-02T06"], dtype="datetime64[ns]")).tolist() == [5]
    with pytest.raises(ValueError, match="6-hourly"):
        era5_like.step_index(np.array(["2000-01-01T03"], dtype="datetime64[ns]"))
