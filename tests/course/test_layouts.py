"""zarrtorch.course.layouts: every writer round-trips, readers agree, measurements return sane structures.

No timing is asserted: the machine may be shared and loaded.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("h5py")

from zarrtorch.course import layouts  # noqa: E402
from zarrtorch.layout import check_first_axis_layout  # noqa: E402


@pytest.fixture()
def arrays():
    rng = np.random.default_rng(0)
    return {
        "fields": rng.standard_normal((50, 3, 4, 5)).astype(np.float32),
        "target": rng.standard_normal((50, 4, 5)).astype(np.float32),
    }


WRITERS = [
    ("zarr", lambda a, p, c: layouts.write_zarr(a, p / "x.zarr", chunk_rows=c)),
    ("zarr", lambda a, p, c: layouts.write_zarr(a, p / "x.zarr", chunk_rows=c, codec="none")),
    ("npy", lambda a, p, c: layouts.write_npy_stack(a, p / "x.npy-stack", chunk_rows=c)),
    ("hdf5", lambda a, p, c: layouts.write_hdf5(a, p / "x.h5", chunk_rows=c)),
    ("hdf5", lambda a, p, c: layouts.write_hdf5(a, p / "x.h5", chunk_rows=c, compression="gzip", level=1)),
    ("hdf5", lambda a, p, c: layouts.write_hdf5(a, p / "x.h5", chunk_rows=c, compression="lzf")),
]
IDS = ["zarr-zstd", "zarr-none", "npy", "hdf5-none", "hdf5-gzip", "hdf5-lzf"]


@pytest.mark.parametrize("layout,write", WRITERS, ids=IDS)
@pytest.mark.parametrize("chunk_rows", [1, 8, 50, 64])
def test_round_trip(arrays, tmp_path, layout, write, chunk_rows):
    info = write(arrays, tmp_path, chunk_rows)
    assert info["layout"] == layout
    assert info["rows"] == 50
    expected_chunk = min(chunk_rows, 50)
    assert info["chunk_rows"] == expected_chunk
    assert info["n_chunks"] == -(-50 // expected_chunk)
    assert info["bytes"] > 0 and info["files"] >= 1 and info["write_s"] >= 0 and info["ratio"] > 0
    assert layouts.layout_of(info["path"]) == layout
    back = layouts.read_all(info["path"])
    assert sorted(back) == sorted(arrays)
    for name, a in arrays.items():
        np.testing.assert_array_equal(back[name], a)
        assert back[name].dtype == a.dtype
    with layouts.open_layout(info["path"]) as r:
        assert r.rows == 50 and r.chunk_rows == expected_chunk and r.n_chunks == info["n_chunks"]
        assert r.row_bytes == layouts.row_nbytes(arrays)
        for i in (0, 7, 49):
            row = r.read_row(i)
            for name, a in arrays.items():
                np.testing.assert_array_equal(row[name], a[i])
        last = r.read_chunk(r.n_chunks - 1)
        lo, hi = r.chunk_bounds(r.n_chunks - 1)
        assert hi == 50
        for name, a in arrays.items():
            np.testing.assert_array_equal(last[name], a[lo:hi])
        with pytest.raises(IndexError):
            r.read_chunk(r.n_chunks)


def test_zarr_writer_is_first_axis_only(arrays, tmp_path):
    import zarr

    info = layouts.write_zarr(arrays, tmp_path / "s.zarr", chunk_rows=16)
    g = zarr.open_group(str(info["path"]), mode="r")
    lay = check_first_axis_layout({n: g[n] for n in arrays})
    assert (lay.rows, lay.chunk_rows, lay.n_chunks) == (50, 16, 4)
    # one object per chunk and array, plus metadata documents
    chunk_files = [p for p in info["path"].rglob("*") if p.is_file() and p.name != "zarr.json"]
    assert len(chunk_files) == 2 * 4


def test_npy_stack_readable_by_dask(arrays, tmp_path):
    import dask.array as da

    info = layouts.write_npy_stack(arrays, tmp_path / "s", chunk_rows=16)
    x = da.from_npy_stack(str(info["path"] / "fields"))
    assert x.chunks[0] == (16, 16, 16, 2)
    np.testing.assert_array_equal(x.compute(), arrays["fields"])
    assert info["files"] == 2 * (4 + 1)  # 4 .npy files + info, per array


def test_writers_accept_dask_and_overwrite(arrays, tmp_path):
    import dask.array as da

    lazy = {n: da.from_array(a, chunks=(7, *a.shape[1:])) for n, a in arrays.items()}
    for write, name in ((layouts.write_npy_stack, "s"), (layouts.write_hdf5, "s.h5"), (layouts.write_zarr, "s.zarr")):
        write(lazy, tmp_path / name, chunk_rows=10)
        info = write(lazy, tmp_path / name, chunk_rows=25)  # writing again replaces the old data
        back = layouts.read_all(info["path"])
        assert info["n_chunks"] == 2
        np.testing.assert_array_equal(back["target"], arrays["target"])


def test_writers_refuse_bad_input(arrays, tmp_path):
    with pytest.raises(ValueError, match="first-axis"):
        layouts.write_hdf5({"a": np.zeros((3, 2)), "b": np.zeros((4, 2))}, tmp_path / "x.h5", chunk_rows=2)
    with pytest.raises(ValueError, match="chunk_rows"):
        layouts.write_npy_stack(arrays, tmp_path / "x", chunk_rows=0)
    with pytest.raises(ValueError, match="no arrays"):
        layouts.write_zarr({}, tmp_path / "x.zarr", chunk_rows=2)
    (tmp_path / "plain.txt").write_text("hello")
    with pytest.raises(ValueError):
        layouts.layout_of(tmp_path / "plain.txt")


def test_disk_usage(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"x" * 10)
    (tmp_path / "d" / "b").write_bytes(b"x" * 5)
    assert layouts.disk_usage(tmp_path / "d") == {"bytes": 15, "files": 2}
    assert layouts.disk_usage(tmp_path / "d" / "a") == {"bytes": 10, "files": 1}


@pytest.mark.parametrize("order", ["random", "sequential"])
def test_read_throughput_structure(arrays, tmp_path, order):
    info = layouts.write_hdf5(arrays, tmp_path / "x.h5", chunk_rows=8)
    t = layouts.read_throughput(info["path"], order=order, seed=1, repeats=2)
    assert t["layout"] == "hdf5" and t["order"] == order
    assert t["n_chunks"] == 7 and t["chunk_rows"] == 8
    assert t["bytes"] == 50 * layouts.row_nbytes(arrays)  # every row read exactly once
    assert t["seconds"] > 0 and t["mb_per_s"] > 0 and np.isfinite(t["mb_per_s"])
    with pytest.raises(ValueError):
        layouts.read_throughput(info["path"], order="backwards")


def test_sample_latency_structure(arrays, tmp_path):
    info = layouts.write_npy_stack(arrays, tmp_path / "x", chunk_rows=8)
    s = layouts.sample_latency(info["path"], n=20, seed=0)
    assert s["layout"] == "npy" and s["samples"] == 20 and s["chunk_rows"] == 8
    assert 0 < s["median_ms"] and 0 < s["mean_ms"] and s["median_ms"] <= s["p90_ms"] * (1 + 1e-9)
    assert s["samples_per_s"] > 0
    assert layouts.sample_latency(info["path"], rows=[0, 49])["samples"] == 2
    with pytest.raises(ValueError):
        layouts.sample_latency(info["path"], n=0)


def test_loader_read_rates_read_every_row_of_each_length_through_the_loader(arrays, tmp_path):
    """Lesson 01's measurement of the chunk length: one shuffled epoch per length through ZarrDataLoader (it
    checks that every row came, else raises), each store removed after."""
    rates = layouts.loader_read_rates(arrays, tmp_path / "rates", [1, 8, 64], batch_size=16, repeats=2)
    assert [r["chunk_rows"] for r in rates] == [1, 8, 50] and [r["n_chunks"] for r in rates] == [50, 7, 1]
    for r in rates:
        assert set(r) == {"chunk_rows", "chunk_MiB", "n_chunks", "seconds", "MB_per_s", "ms_per_chunk", "cpu_s"}
        assert all(np.isfinite(v) and v > 0 for v in r.values())
        assert r["chunk_MiB"] == r["chunk_rows"] * layouts.row_nbytes(arrays) / 2**20
    assert not any((tmp_path / "rates").glob("*.zarr"))


def test_loader_read_rates_over_http_wait_a_delay_per_round_of_requests_in_flight(arrays, tmp_path):
    """Lesson 01 shows the floor's reason with a wait per read: served with ``delay_ms`` per request and read
    with ``requests_in_flight`` fixed, an epoch of K chunks takes at least ceil(K / n) delays (the server
    sleeps; no timing decides it beyond that lower bound)."""
    delay_ms, n = 20, 2
    rates = layouts.loader_read_rates(
        arrays, tmp_path / "rates", [5, 25], batch_size=16, repeats=1, delay_ms=delay_ms, requests_in_flight=n
    )
    assert [r["n_chunks"] for r in rates] == [10, 2]
    for r in rates:
        assert r["seconds"] >= -(-r["n_chunks"] // n) * delay_ms / 1000
    assert not any((tmp_path / "rates").glob("*.zarr"))


def test_sweep_and_compare_structures(arrays, tmp_path):
    sweep = layouts.chunk_length_sweep(arrays, tmp_path / "sweep", [4, 16, 64], latency_samples=5, repeats=2)
    assert [r["chunk_rows"] for r in sweep] == [4, 16, 50]
    assert [r["n_chunks"] for r in sweep] == [13, 4, 1]
    for r in sweep:
        assert set(r) == {"chunk_rows", "n_chunks", "chunk_mb", "write_s", "random_mb_per_s", "sample_ms"}
        assert all(np.isfinite(v) and v > 0 for v in r.values())
    assert not any((tmp_path / "sweep").glob("*.zarr"))  # stores removed

    table = layouts.compare_layouts(arrays, tmp_path / "cmp", chunk_rows=16, latency_samples=5, repeats=2, keep=True)
    assert [r["layout"] for r in table] == [v[0] for v in layouts.DEFAULT_VARIANTS]
    raw_mb = 50 * layouts.row_nbytes(arrays) / layouts.MB
    for r in table:
        assert r["files"] >= 1 and r["disk_mb"] > 0 and r["write_s"] > 0
        assert r["seq_mb_per_s"] > 0 and r["random_mb_per_s"] > 0 and r["sample_ms"] > 0
        assert r["ratio"] == pytest.approx(raw_mb / r["disk_mb"])
    by = {r["layout"]: r for r in table}
    assert by["hdf5 none"]["files"] == 1 and by["npy stack"]["files"] == 2 * (4 + 1)
    assert by["npy stack"]["disk_mb"] >= raw_mb  # uncompressed, plus headers
    assert len(list((tmp_path / "cmp").iterdir())) == len(table)  # keep=True leaves them


def test_zarr_reader_on_xarray_store(tmp_path):
    """The reader resolves the data variables of a store written by xarray (as the course archive is)."""
    xr = pytest.importorskip("xarray")
    ds = xr.Dataset(
        {
            "fields": (("time", "variable", "y"), np.arange(24 * 2 * 3, dtype=np.float32).reshape(24, 2, 3)),
            "target": (("time", "y"), np.arange(24 * 3, dtype=np.float32).reshape(24, 3)),
        },
        coords={"time": np.arange(24), "y": np.arange(3)},
    ).chunk({"time": 6, "variable": 1})
    ds.to_zarr(tmp_path / "a.zarr", zarr_format=3, consolidated=False)
    with layouts.open_layout(tmp_path / "a.zarr") as r:
        assert sorted(r.names) == ["fields", "target"] and r.chunk_rows == 6 and r.rows == 24
        np.testing.assert_array_equal(r.read_row(5)["target"], ds.target.values[5])
    assert layouts.sample_latency(tmp_path / "a.zarr", n=3)["samples"] == 3


def test_sweep_lengths_cover_the_same_chunk_sizes_for_any_row_size():
    # the course presets: 40 KiB rows (tiny, small) and 640 KiB rows (workshop)
    assert layouts.sweep_lengths(40 * 2**10) == [8, 16, 32, 64, 128, 256]
    assert layouts.sweep_lengths(640 * 2**10) == [1, 2, 4, 8, 16]
    assert layouts.sweep_lengths(40 * 2**10, rows=100) == [8, 16, 32, 64]
    for row in (40 * 2**10, 640 * 2**10, 3_000_000):
        mb = [c * row / layouts.MB for c in layouts.sweep_lengths(row)]
        assert all(m <= 12 for m in mb) and (all(m >= 0.25 for m in mb) or mb == [row / layouts.MB])
    assert layouts.sweep_lengths(20 * 10**6) == [1]  # one row is already larger than max_mb
    with pytest.raises(ValueError):
        layouts.sweep_lengths(0)
