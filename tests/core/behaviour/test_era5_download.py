"""A user's ERA5 download, end to end: yearly NetCDF files packed in int16 (each file with its own float64
scale_factor and add_offset, ``_FillValue`` and ``missing_value``, as the CDS writes them), missing cells and a
missing step, invariant fields ``z`` and ``lsm`` packed in a file of their own with a one-step time axis. Prepared
with ``prepare_zarr`` (the invariants kept as coordinates) or written by xarray as Zarr v2 (Blosc, zarr's
defaults: an all-missing chunk stored as no object), then streamed as windows (a mask of the missing step, a
stride, the invariants as static arrays) over a training and a validation period, interrupted and resumed on
another number of ranks: every value equal to what xarray shows, every window start once."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
import zarr

from zarrtorch import ReadOptions, Windows, ZarrDataLoader, ZarrIterableDataset, prepare_zarr

YEARS = {2000: 44, 2001: 40}  # 6-hourly steps in each file (short "years")
MISSING = range(56, 60)  # steps of msl missing everywhere: a whole chunk of 4 rows in the v2 store
PERIODS = {"train": (0, 60), "val": (60, 84)}


def packed(values: np.ndarray) -> dict:
    """int16 packing of ``values`` as the CDS computes it per file: float64 scale and offset mapping the file's range
    onto -32766..32767 (-32767 is the fill)."""
    lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
    scale = (hi - lo) / (2**16 - 3) or 1.0
    return {"dtype": "int16", "scale_factor": scale, "add_offset": lo + 32766 * scale, "_FillValue": np.int16(-32767)}


@pytest.fixture(scope="module")
def download(tmp_path_factory):
    """The yearly files, the invariants' file, and the merged dataset as xarray shows it (decoded)."""
    root = tmp_path_factory.mktemp("era5")
    rng = np.random.default_rng(41)
    start = np.datetime64("2000-01-01T00", "h")
    files, row = [], 0
    for year, steps in YEARS.items():
        t2m = 250 + 40 * rng.random((steps, 3, 4))
        msl = 101_000 + 2000 * rng.random((steps, 3, 4))
        t2m[5, 1, 2] = np.nan
        msl[[r - row for r in MISSING if row <= r < row + steps]] = np.nan
        times = start + 6 * np.arange(row, row + steps).astype("timedelta64[h]")
        ds = xr.Dataset({"t2m": (("time", "lat", "lon"), t2m), "msl": (("time", "lat", "lon"), msl)}, {"time": times})
        encoding = {n: {**packed(ds[n].values), "missing_value": np.int16(-32767)} for n in ds.data_vars}
        ds.to_netcdf(root / f"era5_{year}.nc", engine="h5netcdf", encoding=encoding)
        files.append(root / f"era5_{year}.nc")
        row += steps
    z = 9.80665 * 3000 * rng.random((1, 3, 4))
    z[0, 0, 0] = np.nan
    lsm = np.clip(z / 9.80665 / 1500, 0, 1)
    invariant = xr.Dataset({"z": (("time", "lat", "lon"), z), "lsm": (("time", "lat", "lon"), lsm)}, {"time": [start]})
    invariant.to_netcdf(
        root / "invariant.nc", engine="h5netcdf", encoding={n: packed(invariant[n].values) for n in ("z", "lsm")}
    )
    invariants = xr.open_dataset(root / "invariant.nc", engine="h5netcdf").isel(time=0, drop=True)
    merged = xr.merge([xr.open_mfdataset(files, engine="h5netcdf"), invariants]).load()
    return root, files, merged


def windows_of(merged) -> Windows:
    valid = ~np.isnan(merged["msl"].values).any(axis=(1, 2))
    assert np.flatnonzero(~valid).tolist() == list(MISSING)
    return Windows.from_mask(
        valid, history=2, lead=1, stride=2, inputs=("t2m", "msl"), targets=("t2m",), static=("z", "lsm")
    )


def expected_starts(w: Windows, valid_rows: np.ndarray, period) -> list[int]:
    lo, hi = period
    return [s for s in range(lo, hi - w.span + 1) if valid_rows[s : s + w.span].all()]


def check_batches(batches, merged, w: Windows, period) -> None:
    """Every window start of the period once (padding aside), and every value of every window as xarray shows it."""
    valid = ~np.isnan(merged["msl"].values).any(axis=(1, 2))
    starts = np.concatenate([b["index"].numpy() for b in batches])
    assert sorted(set(starts.tolist())) == expected_starts(w, valid, period)
    shown = {n: merged[n].values for n in ("t2m", "msl", "z", "lsm")}
    for batch in batches:
        for i, s in enumerate(batch["index"].numpy()):
            steps = s + w.offsets
            for name in ("t2m", "msl"):
                got = batch[name][i].numpy()
                np.testing.assert_array_equal(got, shown[name][steps[:2]].astype(got.dtype), err_msg=name)
            got = batch["t2m_target"][i].numpy()
            np.testing.assert_array_equal(got, shown["t2m"][steps[2:]].astype(got.dtype))
            for name in ("z", "lsm"):
                got = batch[name][i].numpy()
                np.testing.assert_array_equal(got, shown[name].astype(got.dtype), err_msg=name)


def interrupted_and_resumed(store, w: Windows, period, read: ReadOptions, saved_on=2, resumed_on=3, taken=2):
    """Each of ``saved_on`` ranks takes ``taken`` batches and saves its state; ``resumed_on`` ranks finish the epoch."""

    def loader(rank, world):
        ds = ZarrIterableDataset(store, windows=w, row_range=period, seed=7, return_index=True, read=read)
        return ZarrDataLoader(ds, batch_size=4, rank=rank, world_size=world)

    batches, states = [], []
    for rank in range(saved_on):
        first = loader(rank, saved_on)
        first.set_epoch(1)
        iterator = iter(first)
        batches += [next(iterator) for _ in range(taken)]
        states.append(first.state_dict())
    for rank in range(resumed_on):
        rest = loader(rank, resumed_on)
        rest.load_state_dict(states[rank % saved_on])
        rest.set_epoch(1)
        batches += list(rest)
    return batches


def test_a_prepared_download_streams_what_xarray_shows(download, tmp_path):
    """The merged dataset as xarray decodes it (float64: the files' scale factors are float64), invariants as
    coordinates."""
    root, _, merged = download
    prepare_zarr(merged.set_coords(["z", "lsm"]), tmp_path / "era5.zarr", chunk_rows=4, progress=False)
    w = windows_of(merged)
    for period in PERIODS.values():
        check_batches(interrupted_and_resumed(tmp_path / "era5.zarr", w, period, ReadOptions()), merged, w, period)


@pytest.mark.parametrize("cf_dtype", ["float32", "float64"])
def test_a_download_written_by_xarray_as_zarr_v2_streams_what_xarray_shows(download, tmp_path, cf_dtype):
    """int16 kept (each file's packing: appended years are packed with the first one's, as xarray does), the
    invariants as data variables without a time axis, the missing step's chunk stored as no object."""
    _, files, _ = download
    store = tmp_path / "era5_v2.zarr"
    invariants = xr.open_dataset(files[0].parent / "invariant.nc", engine="h5netcdf").isel(time=0, drop=True)
    for k, path in enumerate(files):
        year = xr.open_dataset(path, engine="h5netcdf")
        if k == 0:
            year = xr.merge([year, invariants])
            kept = ("dtype", "scale_factor", "add_offset", "_FillValue")  # the files' packing, as to_netcdf wrote it
            encoding = {n: {k: year[n].encoding[k] for k in kept} for n in ("t2m", "msl", "z", "lsm")}
            encoding["t2m"]["chunks"] = encoding["msl"]["chunks"] = (4, 3, 4)
            year.to_zarr(store, zarr_format=2, mode="w", encoding=encoding, consolidated=True)
        else:
            year.to_zarr(store, zarr_format=2, append_dim="time", consolidated=True)
    assert {str(zarr.open_array(store / n).dtype) for n in ("t2m", "msl", "z", "lsm")} == {"int16"}
    assert not (store / "msl" / f"{MISSING[0] // 4}.0.0").exists()  # all fill values: no object (zarr's default)
    shown = xr.open_zarr(store).load()
    w = windows_of(shown)
    for period in PERIODS.values():  # the missing chunk lies in no window: nothing to fill
        check_batches(interrupted_and_resumed(store, w, period, ReadOptions(cf_dtype=cf_dtype)), shown, w, period)
    read = ReadOptions(missing_chunks="fill", cf_dtype=cf_dtype)
    rows = ZarrIterableDataset(store, variables=["msl"], shuffle=False, read=read)
    got = np.concatenate([b["msl"].numpy() for b in ZarrDataLoader(rows, batch_size=8)])
    assert got.dtype == np.dtype(cf_dtype)
    np.testing.assert_array_equal(got, shown["msl"].values.astype(cf_dtype))
