"""prepare_zarr under the calls users make that once destroyed data or failed without saying why: rewriting a
store from itself, a write that fails half-way, a file where a store should be, odd numbers, torch tensors,
and a dataset whose dates are not its first dimension."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import xarray as xr
import zarr

from zarrtorch import LayoutError, ZarrDataLoader, ZarrIterableDataset, prepare_zarr

ROWS = 120


@pytest.fixture()
def written(tmp_path):
    path = tmp_path / "s.zarr"
    x = np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3)
    prepare_zarr({"x": x}, path, chunk_rows=10, progress=False)
    return path, x


def test_rechunking_a_store_from_itself_keeps_its_data(written):
    """``prepare_zarr({"x": group["x"]}, same_path, overwrite=True)`` once deleted the store before reading it
    and wrote fill values, returning normally."""
    path, x = written
    group = zarr.open_group(str(path), mode="r")
    out = prepare_zarr({"x": group["x"]}, path, chunk_rows=40, overwrite=True, progress=False)
    assert out["x"].chunks == (40, 3)
    np.testing.assert_array_equal(out["x"][:], x)


def test_rechunking_an_xarray_dataset_opened_from_the_target(tmp_path):
    path = tmp_path / "s.zarr"
    x = np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3)
    prepare_zarr(xr.Dataset({"x": (("time", "c"), x)}), path, chunk_rows=10, progress=False)
    ds = xr.open_zarr(str(path), consolidated=True)  # lazy: dask reads the target while it is written
    out = prepare_zarr(ds, path, chunk_rows=30, overwrite=True, progress=False)
    assert out["x"].chunks == (30, 3)
    np.testing.assert_array_equal(out["x"][:], x)
    assert not list(path.parent.glob(".s.zarr.*")), "temporary stores were left behind"


class FailsHalfway:
    shape, dtype = (ROWS, 3), np.dtype("f4")

    def __getitem__(self, rows):
        if rows.start >= ROWS // 2:
            raise OSError("the source's disk went away")
        return np.zeros((rows.stop - rows.start, 3), "f4")


def test_a_write_that_fails_leaves_the_old_store_as_it_was(written):
    path, x = written
    with pytest.raises(OSError, match="went away"):
        prepare_zarr({"x": FailsHalfway()}, path, chunk_rows=10, overwrite=True, max_memory_mb=0.001, progress=False)
    np.testing.assert_array_equal(zarr.open_group(str(path), mode="r")["x"][:], x)
    assert not list(path.parent.glob(".s.zarr.*"))


def test_a_file_is_never_replaced(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    with pytest.raises(FileExistsError, match="is a file, not a Zarr store"):
        prepare_zarr({"x": np.zeros((4, 2))}, target, overwrite=True, progress=False)
    assert target.read_text() == "mine"


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(chunk_mb=float("inf")), "chunk_mb must be a finite number"),
        (dict(chunk_mb=float("nan")), "chunk_mb must be a finite number"),
        (dict(max_memory_mb=-5), "max_memory_mb must be a finite number"),
        (dict(max_memory_mb=0), "max_memory_mb must be a finite number"),
        (dict(chunk_rows=2.5), "chunk_rows must be an integer"),
    ],
)
def test_odd_numbers_are_refused_with_their_name(tmp_path, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        prepare_zarr({"x": np.zeros((10, 2))}, tmp_path / "a.zarr", progress=False, **kwargs)
    assert not (tmp_path / "a.zarr").exists()


def test_a_torch_tensor_is_written(tmp_path):
    t = torch.arange(ROWS * 2, dtype=torch.float32).reshape(ROWS, 2)
    out = prepare_zarr({"x": t, "y": torch.arange(ROWS)}, tmp_path / "t.zarr", chunk_rows=16, progress=False)
    np.testing.assert_array_equal(out["x"][:], t.numpy())
    assert out["y"].dtype == np.int64
    rows = [b["x"] for b in ZarrDataLoader(ZarrIterableDataset(tmp_path / "t.zarr", shuffle=False), batch_size=40)]
    np.testing.assert_array_equal(torch.cat(rows).numpy(), t.numpy())


def dated_last():
    times = np.arange("2001-01-01", "2001-01-13", dtype="datetime64[D]")
    data = np.arange(4 * 5 * len(times), dtype=np.float32).reshape(4, 5, len(times))
    return xr.Dataset(
        {"t2m": (("lat", "lon", "time"), data)}, coords={"time": times, "lat": np.arange(4), "lon": np.arange(5)}
    )


def test_dates_on_another_dimension_are_not_guessed_away(tmp_path):
    """Variables ``(lat, lon, time)``: ``lat`` was once taken as the sample dimension without a word."""
    ds = dated_last()
    with pytest.raises(LayoutError, match=r"first dimension is 'lat', but 'time' holds dates.*dim='time'"):
        prepare_zarr(ds, tmp_path / "a.zarr", progress=False)
    out = prepare_zarr(ds, tmp_path / "a.zarr", dim="time", chunk_rows=3, progress=False)
    assert out.attrs["zarrtorch"]["dim"] == "time" and out["t2m"].shape == (12, 4, 5)
    np.testing.assert_array_equal(out["t2m"][:], ds["t2m"].transpose("time", ...).values)
    with pytest.raises(LayoutError, match="dim='level'"):
        prepare_zarr(ds, tmp_path / "b.zarr", dim="level", progress=False)
    with pytest.raises(ValueError, match="apply to an xarray.Dataset"):
        prepare_zarr({"x": np.zeros((3, 2))}, tmp_path / "c.zarr", dim="row", progress=False)


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from zarrtorch.course.servers import S3Server

    with S3Server() as server:
        server.create_bucket("prepare-in-place")  # moto keeps buckets across servers in one process: a name of its own
        yield server


@pytest.mark.slow
@pytest.mark.parametrize("opened_with", ["zarr", "xarray", "xarray-derived", "xarray-unchunked"])
def test_rewriting_a_remote_store_from_itself_is_refused(s3, opened_with):
    """``prepare_zarr(xr.open_zarr(url), url, overwrite=True)`` once deleted the store, then wrote NaN from
    it and returned normally; a store on object storage cannot be written beside and moved into place."""
    url, options = f"s3://prepare-in-place/{opened_with}.zarr", s3.storage_options
    x = np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3)
    prepare_zarr(xr.Dataset({"x": (("time", "c"), x)}), url, chunk_rows=10, progress=False, storage_options=options)
    if opened_with == "zarr":
        source = {"x": zarr.open_group(url, mode="r", storage_options=options)["x"]}
    else:
        chunks = None if opened_with == "xarray-unchunked" else {}
        source = xr.open_zarr(url, storage_options=options, chunks=chunks)
        if opened_with == "xarray-derived":  # a derived dataset: no encoding["source"] left to tell
            source = xr.Dataset({"x": source["x"] * 1})
    with pytest.raises(ValueError, match=rf"read from {url}.*another URL") as err:
        prepare_zarr(source, url, chunk_rows=30, overwrite=True, progress=False, storage_options=options)
    assert "move" in str(err.value) or "copy" in str(err.value)
    np.testing.assert_array_equal(zarr.open_group(url, mode="r", storage_options=options)["x"][:], x)
    # another URL in the same bucket is not the target: writing there works
    out = prepare_zarr(source, f"{url}-rechunked", chunk_rows=30, progress=False, storage_options=options)
    np.testing.assert_array_equal(out["x"][:], x)


def test_overwrite_replaces_a_zarr_store_never_another_directory(tmp_path):
    """overwrite=True on a directory of something else (a results folder given by mistake) deleted its files."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "model.pt").write_text("weeks of training")
    with pytest.raises(FileExistsError, match=r"not a Zarr store \(it holds model.pt\)"):
        prepare_zarr({"x": np.zeros(5)}, results, overwrite=True, progress=False)
    assert (results / "model.pt").read_text() == "weeks of training"
    (tmp_path / "empty").mkdir()
    prepare_zarr({"x": np.arange(5.0)}, tmp_path / "empty", overwrite=True, progress=False)  # nothing to lose
    assert zarr.open_group(str(tmp_path / "empty"), mode="r")["x"][:].tolist() == [0, 1, 2, 3, 4]


def test_a_home_path_is_where_the_loader_looks(tmp_path, monkeypatch):
    """ "~/x.zarr" was written to a folder named "~" in the working directory, and the loader (which expands
    it) then found no store."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    prepare_zarr({"x": np.arange(6.0)}, "~/x.zarr", progress=False)
    assert (tmp_path / "home" / "x.zarr").is_dir() and not (tmp_path / "~").exists()
    assert ZarrIterableDataset("~/x.zarr", shuffle=False).rows == 6


def test_a_link_to_a_store_is_rewritten_in_its_target(tmp_path):
    prepare_zarr({"x": np.zeros(4)}, tmp_path / "real.zarr", progress=False)
    (tmp_path / "link.zarr").symlink_to(tmp_path / "real.zarr")
    prepare_zarr({"x": np.ones(4)}, tmp_path / "link.zarr", overwrite=True, progress=False)
    assert (tmp_path / "link.zarr").is_symlink()
    assert zarr.open_group(str(tmp_path / "real.zarr"), mode="r")["x"][:].tolist() == [1, 1, 1, 1]


def test_a_dead_writers_leftovers_are_removed(tmp_path):
    """A writer killed mid-write left ``.NAME.writing-PID`` beside the store for good."""
    prepare_zarr({"x": np.zeros(4)}, tmp_path / "s.zarr", progress=False)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".s.zarr.writing-{int(dead.stdout)}"
    stale.mkdir()
    prepare_zarr({"x": np.ones(4)}, tmp_path / "s.zarr", overwrite=True, progress=False)
    assert not stale.exists()


@pytest.mark.parametrize(
    "source, needle",
    [
        ({1: np.zeros(3), "1": np.ones(3)}, r"both be stored as '1': the keys 1 and '1'"),
        ({"x": np.ma.masked_array(np.zeros(3), mask=[1, 0, 0])}, "masked array: its mask would be lost"),
        ({"t": np.array(["2020-01-01"] * 3, dtype="datetime64[D]")}, "dtype datetime64.* a tensor cannot hold"),
        ({"s": np.array(["a", "b", "c"])}, "dtype <U1.* a tensor cannot hold"),
    ],
)
def test_what_would_be_lost_or_unreadable_is_refused(tmp_path, source, needle):
    with pytest.raises((TypeError, ValueError), match=needle):
        prepare_zarr(source, tmp_path / "s.zarr", progress=False)
    assert not (tmp_path / "s.zarr").exists()


_WRITER = """
import sys
import numpy as np
from zarrtorch import prepare_zarr
print("start", flush=True)
rows = 4_000_000  # 4,000 chunks of one value (a broadcast view: no memory), seconds to write
prepare_zarr({"x": np.broadcast_to(np.float32(1), (rows, 64))}, sys.argv[1], chunk_rows=1000, progress=False)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])  # killed, or a Ctrl-C (KeyboardInterrupt inside zarr's writes)
def test_a_writer_killed_midway_leaves_no_store_that_looks_whole(tmp_path, how):
    """The store was written in place: killed after 20 of 400 chunks, it held metadata saying it was whole,
    and a loader yielded 10,000 rows before it met the first missing chunk. Now it is written beside its place
    and moved there once complete; the next write removes what the dead writer left. A Ctrl-C removes the
    unfinished copy itself, but zarr's writes still in flight may put some of it back: a leftover there or none
    (asserting one failed once under load in CI, when the removal came after the last write). The signal is sent
    once the writer wrote 5 chunks; a writer that finished first (this process starved under CI's load for the 0.8 s
    that 400 chunks took: the whole store in place, as it should be) is started again, so the signal lands mid-write
    whatever the load."""
    import os
    import signal
    import time

    target = tmp_path / "s.zarr"
    for _ in range(3):
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(target)], stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip() == "start"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list(tmp_path.glob(".s.zarr.writing-*/x/c/*"))) < 5:
            time.sleep(0.01)
        assert len(list(tmp_path.glob(".s.zarr.writing-*/x/c/*"))) >= 5, "the writer wrote no chunk within 60 s"
        os.kill(writer.pid, getattr(signal, how))
        if writer.wait(timeout=60) != 0:
            break
        shutil.rmtree(target)  # it finished before the signal landed
    else:
        pytest.fail("the writer finished its 4,000 chunks before the signal landed, three times")
    assert not target.exists()
    leftover = list(tmp_path.glob(".s.zarr.writing-*"))
    assert leftover or how == "SIGINT"  # killed, nothing of it ran after the signal
    said = "its writing did not finish" if leftover else "check the path"
    with pytest.raises(FileNotFoundError, match=f"no Zarr store .*{said}"):
        ZarrIterableDataset(target)
    prepare_zarr({"x": np.arange(10.0)}, target, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]


def test_a_datetime_variable_is_refused_by_name(tmp_path):
    """xarray stored it CF-encoded as int64 and listed it for training; the loader then refused the store and
    told the user to write it again with prepare_zarr, which had written it."""
    time = np.arange(6).astype("datetime64[D]")
    ds = xr.Dataset({"t2m": ("time", np.zeros(6, np.float32)), "valid": ("time", time + 1)}, coords={"time": time})
    with pytest.raises(TypeError, match=r"variable 'valid' has dtype datetime64.*variables=\[\.\.\.\]"):
        prepare_zarr(ds, tmp_path / "s.zarr", progress=False)
    prepare_zarr(ds, tmp_path / "s.zarr", variables=["t2m"], progress=False)  # without it, as the message says
    assert ZarrIterableDataset(tmp_path / "s.zarr").rows == 6
