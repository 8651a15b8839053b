"""CF-packed stores (int16 with scale_factor, add_offset, _FillValue, as in ERA5 and CMIP downloads) stream the
values xarray shows, NaN where the fill was: once the loader streamed the packed integers (-1992, -32768)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
import zarr

from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset, loader_memory

ROWS = 48


def packed_store(path, zarr_format: int, unsigned: bool = False):
    rng = np.random.default_rng(0)
    t2m = (250 + 30 * rng.random((ROWS, 3, 4))).astype(np.float32)
    t2m[5, 1, 2] = np.nan
    sp = (1000 + 50 * rng.random((ROWS, 3, 4))).astype(np.float32)
    sp[17] = np.nan
    ds = xr.Dataset({"t2m": (("time", "lat", "lon"), t2m), "sp": (("time", "lat", "lon"), sp)})
    ds["t2m"].encoding = {
        "dtype": "int16",
        "scale_factor": 0.01,
        "add_offset": 265.0,
        "_FillValue": -32768,
        "chunks": (8, 3, 4),
    }
    if unsigned:
        ds["sp"].encoding = {
            "dtype": "uint8",
            "scale_factor": 0.25,
            "add_offset": 1000.0,
            "_FillValue": 255,
            "chunks": (8, 3, 4),
        }
    else:
        ds["sp"].encoding = {
            "dtype": "int16",
            "scale_factor": 0.002,
            "add_offset": 1025.0,
            "_FillValue": -32768,
            "chunks": (8, 3, 4),
        }
    ds.to_zarr(str(path), zarr_format=zarr_format, mode="w", consolidated=True)
    return xr.open_zarr(str(path), consolidated=True)


def stream(path, **kw):
    """Every array's rows, in row order (workers yield their runs of batches in turn)."""
    num_workers = kw.pop("num_workers", 0)
    ds = ZarrIterableDataset(str(path), shuffle=False, return_index=True, **kw)
    extra = {"multiprocessing_context": "fork"} if num_workers else {}
    batches = list(ZarrDataLoader(ds, batch_size=8, num_workers=num_workers, **extra))
    order = np.argsort(np.concatenate([b["index"].numpy() for b in batches]))
    return {n: np.concatenate([b[n].numpy() for b in batches])[order] for n in batches[0] if n != "index"}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("zarr_format", [2, 3])
def test_packed_arrays_stream_what_xarray_shows(tmp_path, zarr_format, num_workers):
    reference = packed_store(tmp_path / "p.zarr", zarr_format)
    got = stream(tmp_path / "p.zarr", num_workers=num_workers)
    for name in ("t2m", "sp"):
        assert got[name].dtype == np.float32
        np.testing.assert_allclose(got[name], reference[name].values.astype(np.float32), rtol=1e-6, equal_nan=True)
    assert np.isnan(got["t2m"][5, 1, 2]) and np.isnan(got["sp"][17]).all()


def test_decode_cf_false_streams_the_stored_integers(tmp_path):
    packed_store(tmp_path / "p.zarr", 3)
    got = stream(tmp_path / "p.zarr", read=ReadOptions(decode_cf=False))
    raw = zarr.open_group(str(tmp_path / "p.zarr"), mode="r")["t2m"][:]
    assert got["t2m"].dtype == np.int16
    np.testing.assert_array_equal(got["t2m"], raw)


def test_unsigned_packing(tmp_path):
    reference = packed_store(tmp_path / "u.zarr", 3, unsigned=True)
    got = stream(tmp_path / "u.zarr")
    np.testing.assert_allclose(got["sp"], reference["sp"].values.astype(np.float32), rtol=1e-6, equal_nan=True)


def test_shuffled_and_stacked_packed_arrays(tmp_path):
    reference = packed_store(tmp_path / "p.zarr", 3)
    ds = ZarrIterableDataset(str(tmp_path / "p.zarr"), return_index=True, stack={"x": ["t2m", "sp"]}, seed=2)
    for batch in ZarrDataLoader(ds, batch_size=8):
        rows = batch["index"].numpy()
        expected = np.stack([reference["t2m"].values[rows], reference["sp"].values[rows]], axis=1)
        np.testing.assert_allclose(batch["x"].numpy(), expected.astype(np.float32), rtol=1e-6, equal_nan=True)


def test_the_memory_budget_counts_decoded_batches(tmp_path):
    packed_store(tmp_path / "p.zarr", 3)
    ds = ZarrIterableDataset(str(tmp_path / "p.zarr"))
    assert ds.batch_row_bytes == 2 * ds.row_bytes  # int16 stored, float32 in a batch
    loader = ZarrDataLoader(ds, batch_size=8, num_workers=2)
    assert loader.ring.nbytes >= loader.ring.shape.slots * 2 * 8 * ds.batch_row_bytes
    assert loader_memory(loader).total > 0


def test_cf_encoded_times_are_refused(tmp_path):
    times = np.arange("2000-01-01", "2000-01-09", dtype="datetime64[D]")
    ds = xr.Dataset({"t": (("time",), times), "x": (("time",), np.arange(8.0))})
    ds.to_zarr(str(tmp_path / "t.zarr"), mode="w", consolidated=True)
    with pytest.raises(ValueError, match=r"array 't' holds CF-encoded times \(units 'days since"):
        ZarrIterableDataset(str(tmp_path / "t.zarr"), variables=["t", "x"])
    assert len(stream(tmp_path / "t.zarr", variables=["x"])["x"]) == 8


@pytest.mark.parametrize("num_workers", [0, 2])
def test_packed_arrays_stream_decoded_windows(tmp_path, num_workers):
    """Windows of CF-packed arrays hold the values xarray shows, NaN where the fill was, in inputs and targets."""
    from zarrtorch.windows import Windows

    shown = packed_store(tmp_path / "p.zarr", 3)
    w = Windows(history=2, lead=1, inputs=("t2m", "sp"), targets=("t2m",))
    ds = ZarrIterableDataset(str(tmp_path / "p.zarr"), return_index=True, windows=w)
    extra = {"multiprocessing_context": "fork"} if num_workers else {}
    starts = []
    for batch in ZarrDataLoader(ds, batch_size=4, num_workers=num_workers, **extra):
        s = batch["index"].numpy()
        for k, start in enumerate(s.tolist()):
            want = {n: shown[n].values[start : start + 3] for n in ("t2m", "sp")}
            np.testing.assert_allclose(batch["t2m"][k].numpy(), want["t2m"][:2], rtol=1e-6)
            np.testing.assert_allclose(batch["sp"][k].numpy(), want["sp"][:2], rtol=1e-6)
            np.testing.assert_allclose(batch["t2m_target"][k].numpy(), want["t2m"][2:], rtol=1e-6)
        assert "sp_target" not in batch
        starts += s.tolist()
    assert sorted(starts) == list(range(ROWS - 2))
