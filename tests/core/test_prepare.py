"""prepare_zarr: values survive the round trip (also through xarray.open_zarr), chunks and codecs are as
asked, bad inputs are refused, and memory stays bounded when the data is much larger than the budget."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr

from zarrtorch import LayoutError, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch._read.checksum import chunk_checksum
from zarrtorch._read.fastpath import read_path_text
from zarrtorch.prepare import rows_for_chunk_mb


def climate(n=103, ny=4, nx=6, dask_chunks=True):
    """A small xarray dataset chunked like an archive: by grid tile, every time step in one block."""
    rng = np.random.default_rng(0)
    temp = rng.normal(size=(n, ny, nx)).astype("f4")
    ds = xr.Dataset(
        {
            "temp": (("time", "lat", "lon"), temp, {"units": "K"}),
            "wind": (("time", "lat", "lon"), (temp * 2).astype("f8"), {"units": "m s-1"}),
        },
        coords={
            "time": np.arange(n, dtype="i8"),
            "lat": np.linspace(40, 50, ny),
            "lon": np.linspace(0, 10, nx),
            "height": (("lat", "lon"), rng.normal(size=(ny, nx))),
        },
        attrs={"title": "test climate", "source": "synthetic"},
    )
    return ds.chunk({"time": -1, "lat": 2, "lon": 3}) if dask_chunks else ds


def test_xarray_round_trip(tmp_path):
    ds = climate()
    assert ds["temp"].chunks[0] == (103,) and len(ds["temp"].chunks[1]) == 2  # chunked along other axes
    g = prepare_zarr(ds, tmp_path / "c.zarr", chunk_rows=10, progress=False)
    for name in ("temp", "wind"):
        assert g[name].chunks == (10, 4, 6)  # first axis only
        np.testing.assert_array_equal(g[name][:], ds[name].values)
    opened = xr.open_zarr(tmp_path / "c.zarr")
    for name in ("temp", "wind"):
        xr.testing.assert_identical(opened[name].load(), ds[name].load())  # values, coords, attrs
    assert opened["temp"].attrs["units"] == "K"
    assert opened.attrs["title"] == "test climate" and opened.attrs["source"] == "synthetic"
    xr.testing.assert_identical(opened["height"].load(), ds["height"].load())
    np.testing.assert_array_equal(opened["lat"].values, ds["lat"].values)
    # and the loader picks the data variables, not the coordinates
    assert sorted(ZarrIterableDataset(tmp_path / "c.zarr").arrays) == ["temp", "wind"]


def test_xarray_variables_subset(tmp_path):
    g = prepare_zarr(climate(dask_chunks=False), tmp_path / "c.zarr", chunk_rows=7, variables=["wind"], progress=False)
    assert g.attrs["zarrtorch"]["variables"] == ["wind"]
    assert list(ZarrIterableDataset(tmp_path / "c.zarr").arrays) == ["wind"]


def test_mapping_round_trip(tmp_path):
    rows = 257
    x_np = np.random.default_rng(1).normal(size=(rows, 3, 5)).astype("f4")
    y_dask = da.arange(rows, chunks=50, dtype="i8") * 3
    z_dask = da.from_array(np.arange(rows * 4, dtype="i2").reshape(rows, 4), chunks=(rows, 1))  # other axis
    g = prepare_zarr({"x": x_np, "y": y_dask, "z": z_dask}, tmp_path / "m.zarr", chunk_rows=40, progress=False)
    np.testing.assert_array_equal(g["x"][:], x_np)
    np.testing.assert_array_equal(g["y"][:], y_dask.compute())
    np.testing.assert_array_equal(g["z"][:], z_dask.compute())
    assert g["x"].chunks == (40, 3, 5) and g["y"].chunks == (40,) and g["z"].chunks == (40, 4)
    assert g["x"].dtype == np.float32 and g["z"].dtype == np.int16
    ds = ZarrIterableDataset(tmp_path / "m.zarr", return_index=True)
    for batch in ZarrDataLoader(ds, batch_size=64):
        idx = batch["index"].numpy()
        np.testing.assert_array_equal(batch["x"].numpy(), x_np[idx])
        np.testing.assert_array_equal(batch["y"].numpy(), 3 * idx)


def test_chunk_mb(tmp_path):
    rows = 5000
    arrays = {"x": np.zeros((rows, 1024), "f4"), "y": np.zeros(rows, "i8")}
    row_bytes = 1024 * 4 + 8
    g = prepare_zarr(arrays, tmp_path / "a.zarr", chunk_mb=1, progress=False, codec="none")
    assert g["x"].chunks[0] == g["y"].chunks[0] == 2**20 // row_bytes == rows_for_chunk_mb(row_bytes, 1)
    g = prepare_zarr(arrays, tmp_path / "b.zarr", chunk_mb=0.25, progress=False, codec="none")
    assert g["x"].chunks[0] == 2**18 // row_bytes
    g = prepare_zarr(arrays, tmp_path / "c.zarr", chunk_rows=10**6, progress=False, codec="none")
    assert g["x"].chunks[0] == rows  # never longer than the array
    with pytest.raises(ValueError, match="chunk_rows or chunk_mb, not both"):
        prepare_zarr(arrays, tmp_path / "d.zarr", chunk_rows=10, chunk_mb=1, progress=False)
    with pytest.raises(ValueError, match="chunk_mb must be a finite number of MiB > 0"):
        prepare_zarr(arrays, tmp_path / "e.zarr", chunk_mb=0, progress=False)
    with pytest.raises(ValueError, match="chunk_rows must be an integer >= 1"):
        prepare_zarr(arrays, tmp_path / "f.zarr", chunk_rows=0, progress=False)


def zstd_with_checksum(c) -> bool:
    return len(c) == 1 and isinstance(c[0], zarr.codecs.ZstdCodec) and c[0].checksum


def blosc_then_crc32c(cname: str):
    def check(c) -> bool:
        blosc = len(c) == 2 and isinstance(c[0], zarr.codecs.BloscCodec) and c[0].cname.value == cname
        return blosc and isinstance(c[1], zarr.codecs.Crc32cCodec)

    return check


@pytest.mark.parametrize(
    "codec,check",
    [
        (None, zstd_with_checksum),  # the default
        ("zstd", zstd_with_checksum),
        ("none", lambda c: len(c) == 1 and isinstance(c[0], zarr.codecs.Crc32cCodec)),
        ("blosc-lz4", blosc_then_crc32c("lz4")),
        ("blosc-zstd", blosc_then_crc32c("zstd")),
    ],
)
def test_codec(tmp_path, codec, check):
    """Each codec prepare_zarr offers writes a checksum with every chunk (a flipped byte inside compressed data
    would otherwise decode to other values), and is read by zarrtorch's direct decoder."""
    data = np.arange(3000, dtype="f4").reshape(1000, 3)
    kwargs = {} if codec is None else {"codec": codec}
    g = prepare_zarr({"x": data}, tmp_path / "a.zarr", chunk_rows=100, progress=False, **kwargs)
    assert check(g["x"].compressors)
    assert chunk_checksum(g["x"]) is not None
    assert read_path_text(g["x"]).startswith("direct ("), read_path_text(g["x"])
    np.testing.assert_array_equal(g["x"][:], data)


def test_codec_unknown(tmp_path):
    with pytest.raises(ValueError, match="unknown codec 'lzma'.*zstd.*blosc-lz4.*none"):
        prepare_zarr({"x": np.zeros((10, 2))}, tmp_path / "a.zarr", codec="lzma", progress=False)


def test_refusals(tmp_path):
    with pytest.raises(LayoutError, match="different first-axis lengths.*'x' has 10.*'y' has 9"):
        prepare_zarr({"x": np.zeros((10, 2)), "y": np.zeros(9)}, tmp_path / "a.zarr", progress=False)
    with pytest.raises(TypeError, match="xarray.Dataset or a mapping"):
        prepare_zarr(np.zeros((10, 2)), tmp_path / "b.zarr", progress=False)
    ds = climate(dask_chunks=False).assign(static=(("lat", "lon"), np.zeros((4, 6))))
    with pytest.raises(LayoutError, match=r"\['static'\].*first dimension.*set_coords"):
        prepare_zarr(ds, tmp_path / "c.zarr", progress=False)
    with pytest.raises(KeyError, match="unknown data variable"):
        prepare_zarr(ds, tmp_path / "d.zarr", variables=["nope"], progress=False)
    prepare_zarr({"x": np.zeros((10, 2))}, tmp_path / "e.zarr", progress=False)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        prepare_zarr({"x": np.zeros((10, 2))}, tmp_path / "e.zarr", progress=False)
    g = prepare_zarr({"x": np.ones((12, 2))}, tmp_path / "e.zarr", overwrite=True, chunk_rows=5, progress=False)
    assert g["x"].shape == (12, 2) and (g["x"][:] == 1).all()


MEMORY_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import dask.array as da, numpy as np, xarray as xr
    import zarrtorch

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    rows, cols = 150_000, 1024  # 586 MiB of float32, generated lazily
    x = da.arange(rows, chunks=5000, dtype="f4")[:, None] + da.zeros((rows, cols), chunks=(5000, 256), dtype="f4")
    ds = xr.Dataset({"x": (("time", "f"), x), "y": (("time",), da.arange(rows, chunks=5000))},
                    coords={"time": np.arange(rows)})
    before = peak_mb()
    g = zarrtorch.prepare_zarr(ds, sys.argv[1], chunk_rows=512, max_memory_mb=64, progress=False)
    ok = bool((g["x"][::9973, ::97] == np.arange(0, rows, 9973, dtype="f4")[:, None]).all())
    print(json.dumps({"before_mb": before, "peak_mb": peak_mb(), "data_mb": x.nbytes / 2**20, "values_ok": ok}))
""")


@pytest.mark.slow
def test_bounded_memory(tmp_path):
    """586 MiB of dask data chunked along both axes, max_memory_mb=64: the process grows by a few budgets,
    never by the data size (the baseline, mostly torch imported by zarrtorch, is measured first)."""
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path / "big.zarr")], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    m = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\nprepare_zarr 586 MiB, budget 64 MiB: RSS {m['before_mb']:.0f} MiB before, peak {m['peak_mb']:.0f} MiB")
    assert m["values_ok"]
    assert m["data_mb"] > 550
    grown = m["peak_mb"] - m["before_mb"]
    assert grown < 5 * 64, f"grew by {grown:.0f} MiB"  # a few budgets, far from the data's 586 MiB


def test_a_coordinate_along_a_dimension_of_its_own_is_written(tmp_path):
    """ERA5's invariant fields come with a time axis of one step (``valid_time``): kept as a coordinate
    (``set_coords``, as prepare_zarr's own error advises) without dropping that axis, it was left out without a word
    (selecting the data variables keeps only the coordinates along their dimensions), and the loader then said
    "unknown array name". Written whole, as xarray shows it (packed int16 here, decoded)."""
    from zarrtorch import Windows

    rng = np.random.default_rng(3)
    orog = (3000 * rng.random((1, 4, 6))).astype(np.float32)
    orog[0, 0, 0] = np.nan
    invariant = xr.Dataset({"orog": (("valid_time", "lat", "lon"), orog)})
    invariant["orog"].encoding = {"dtype": "int16", "scale_factor": 0.1, "add_offset": 1500.0, "_FillValue": -32767}
    invariant.to_zarr(tmp_path / "invariant.zarr", mode="w", consolidated=False)
    shown = xr.open_zarr(tmp_path / "invariant.zarr", consolidated=False)
    ds = xr.merge([climate(dask_chunks=False), shown]).set_coords("orog")
    prepare_zarr(ds, tmp_path / "c.zarr", chunk_rows=10, progress=False)
    written = xr.open_zarr(tmp_path / "c.zarr")["orog"]
    assert written.dims == ("valid_time", "lat", "lon")
    np.testing.assert_array_equal(written.values, shown["orog"].values)
    loader = ZarrDataLoader(ZarrIterableDataset(tmp_path / "c.zarr", windows=Windows(static=("orog",))), batch_size=4)
    np.testing.assert_array_equal(next(iter(loader))["orog"][0].numpy(), shown["orog"].values)


def test_a_dataset_opened_without_cf_decoding_is_refused_naming_the_packed_variable(tmp_path):
    """A NetCDF opened with ``mask_and_scale=False`` (to keep ERA5's int16) holds its packing in each variable's
    attributes: the block writes then failed inside xarray ("Key 'add_offset' already exists in attrs ... remove
    this key from the variable's attributes manually"), advice that would store the packed integers as values."""
    packed = xr.Dataset({"msl": (("time", "cell"), np.arange(40, dtype=np.float64).reshape(20, 2) * 0.5 + 1000)})
    packed["msl"].encoding = {"dtype": "int16", "scale_factor": 0.5, "add_offset": 1000.0, "_FillValue": -32767}
    packed.to_netcdf(tmp_path / "p.nc", engine="h5netcdf")
    raw = xr.open_dataset(tmp_path / "p.nc", engine="h5netcdf", mask_and_scale=False)
    with pytest.raises(ValueError, match=r"variable 'msl' .*\['_FillValue', 'add_offset', 'scale_factor'\].*decoded"):
        prepare_zarr(raw, tmp_path / "out.zarr", chunk_rows=4, progress=False)
    assert not (tmp_path / "out.zarr").exists()
    decoded = xr.open_dataset(tmp_path / "p.nc", engine="h5netcdf")
    prepare_zarr(decoded, tmp_path / "out.zarr", chunk_rows=4, progress=False)
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "out.zarr")["msl"].values, decoded["msl"].values)
