"""A chunk equal to the fill value everywhere has no stored object in a store written with zarr's default
``write_empty_chunks=False``: zarr reads it as the fill value, and nothing in the store says whether it was
skipped on purpose or lost. Such a store built a dataset, then stopped hours into an epoch with "missing
chunk". Now ``prepare_zarr`` marks its stores as holding every chunk; for any other store the dataset lists
each array's keys once at construction and names the missing chunks, the fill value and
``ReadOptions(missing_chunks='fill')`` there, and ``audit`` lists them before a job."""

from __future__ import annotations

import json
import re
import shutil
import warnings

import numpy as np
import pytest
import xarray as xr
import zarr

import zarrtorch.cli
from zarrtorch import ChunkReadError, ReadOptions, ZarrDataLoader, ZarrIterableDataset, audit, prepare_zarr
from zarrtorch._read import listing
from zarrtorch.course.servers import HttpStoreServer, S3Server

ROWS, CHUNK, EMPTY = 60, 10, 2  # chunk EMPTY is all zeros
X = np.arange(1, ROWS * 3 + 1, dtype=np.float32).reshape(ROWS, 3)
X[EMPTY * CHUNK : (EMPTY + 1) * CHUNK] = 0

# how zarr names chunk EMPTY of array x in each key encoding (checked by test_the_encodings_are_the_ones_named)
ENCODINGS = {
    "v3": (3, {}, f"x/c/{EMPTY}/0"),
    "v3 with v2 keys": (3, {"chunk_key_encoding": {"name": "v2", "separator": "."}}, f"x/{EMPTY}.0"),
    "v2": (2, {}, f"x/{EMPTY}.0"),
    "v2 with / separator": (2, {"chunk_key_encoding": {"name": "v2", "separator": "/"}}, f"x/{EMPTY}/0"),
}


def zarr_default(path, zarr_format=3, consolidated=False, data=X, **options) -> None:
    """``data`` written as zarr writes it by default (``write_empty_chunks=False``): no object for chunk EMPTY."""
    group = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    group.create_array("x", shape=data.shape, dtype=data.dtype, chunks=options.pop("chunks", (CHUNK, 3)), **options)
    group["x"][:] = data
    if consolidated:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zarr.consolidate_metadata(str(path))


def read_rows(source, **options) -> np.ndarray:
    ds = ZarrIterableDataset(source, variables=["x"], shuffle=False, read=ReadOptions(**options))
    return np.concatenate([b["x"].numpy() for b in ZarrDataLoader(ds, batch_size=CHUNK)])


def stored(path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_the_encodings_are_the_ones_named(tmp_path, name):
    zarr_format, options, key = ENCODINGS[name]
    zarr_default(tmp_path / "s.zarr", zarr_format, **options)
    keys = stored(tmp_path / "s.zarr")
    assert key not in keys and key.replace(f"{EMPTY}", "1", 1) in keys, keys


# -- prepare_zarr: every chunk written, and said so ------------------------------------------------------------


@pytest.mark.parametrize("shards", [None, 2])
def test_prepare_zarr_writes_an_all_zero_chunk_and_says_every_chunk_is_written(tmp_path, shards):
    path = tmp_path / "p.zarr"
    group = prepare_zarr({"x": X}, path, chunk_rows=CHUNK // (shards or 1), shard_chunks=shards, progress=False)
    assert f"x/c/{EMPTY}/0" in stored(path)
    assert group.attrs["zarrtorch"]["every_chunk_written"] is True
    # a shard's inner chunks of zeros are in it too: the read checks its index for absent inner chunks
    np.testing.assert_array_equal(read_rows(path), X)


def test_prepare_zarr_from_xarray_writes_an_all_zero_chunk(tmp_path):
    path = tmp_path / "p.zarr"
    ds = xr.Dataset({"x": (("time", "c"), X)}, coords={"time": np.arange(ROWS)})
    prepare_zarr(ds.chunk({"time": 7}), path, chunk_rows=CHUNK, progress=False)
    assert f"x/c/{EMPTY}/0" in stored(path)
    assert zarr.open_group(str(path), mode="r").attrs["zarrtorch"]["every_chunk_written"] is True


def test_a_store_marked_complete_is_not_listed_and_a_lost_chunk_names_the_option_at_read(tmp_path, monkeypatch):
    """A prepare_zarr store holds every chunk: no listing at construction; one removed since is found at read,
    and the message names the fill value, the option, and rewriting the store."""
    path = tmp_path / "p.zarr"
    prepare_zarr({"x": X + 1}, path, chunk_rows=CHUNK, progress=False)
    (path / "x" / "c" / "4" / "0").unlink()
    monkeypatch.setattr(listing, "stored_keys", lambda *a, **k: pytest.fail("a complete store was listed"))
    ds = ZarrIterableDataset(path, shuffle=False)
    with pytest.raises(ChunkReadError) as err:
        list(ZarrDataLoader(ds, batch_size=CHUNK))
    message = str(err.value)
    assert "missing chunk 4 (rows 40:50) of array 'x'" in message
    assert "fill value 0.0" in message and "missing_chunks='fill'" in message
    assert "else the store is incomplete: rewrite it" in message


# -- any other store: listed once per array at construction ------------------------------------------------


@pytest.mark.parametrize("name", list(ENCODINGS))
@pytest.mark.parametrize("consolidated", [False, True], ids=["plain", "consolidated"])
def test_a_store_without_empty_chunks_is_refused_at_construction_naming_the_option(tmp_path, name, consolidated):
    zarr_format, options, key = ENCODINGS[name]
    path = tmp_path / "s.zarr"
    zarr_default(path, zarr_format, consolidated, **options)
    with pytest.raises(ChunkReadError) as err:
        ZarrIterableDataset(path, variables=["x"])
    message = str(err.value)
    assert f"missing chunk {EMPTY} of array 'x'" in message and repr(key) in message, message
    assert "1 of its 6 chunks" in message and "fill value 0.0" in message
    assert "ReadOptions(missing_chunks='fill')" in message and "write_empty_chunks=False" in message
    # "fill" reads what zarr reads
    expected = zarr.open_group(str(path), mode="r")["x"][:]
    np.testing.assert_array_equal(read_rows(path, missing_chunks="fill"), expected)
    np.testing.assert_array_equal(expected, X)


def test_a_missing_shard_is_refused_at_construction(tmp_path):
    path = tmp_path / "s.zarr"
    zarr_default(path, chunks=(CHUNK // 2, 3), shards=(CHUNK, 3))
    assert f"x/c/{EMPTY}/0" not in stored(path)
    with pytest.raises(ChunkReadError, match=rf"missing chunk {EMPTY} of array 'x'.*'x/c/{EMPTY}/0'"):
        ZarrIterableDataset(path)
    np.testing.assert_array_equal(read_rows(path, missing_chunks="fill"), X)


def test_the_message_gives_the_first_few_and_the_count(tmp_path):
    odd_chunks_zero = np.repeat(np.arange(200) // CHUNK % 2 == 0, 3).reshape(200, 3).astype(np.float32)
    zarr_default(tmp_path / "s.zarr", data=odd_chunks_zero)
    with pytest.raises(ChunkReadError) as err:
        ZarrIterableDataset(tmp_path / "s.zarr")
    message = str(err.value)
    assert "missing chunk 1 of array 'x'" in message and "10 of its 20 chunks" in message
    assert re.search(r"\[1, 3, 5, 7, 9, \.\.\.\]", message), message


def test_only_the_rows_read_are_checked(tmp_path):
    """A missing chunk outside row_range is never read: no reason to refuse the dataset."""
    path = tmp_path / "s.zarr"
    zarr_default(path)
    ds = ZarrIterableDataset(path, row_range=(30, 60), shuffle=False)
    rows = np.concatenate([b["x"].numpy() for b in ZarrDataLoader(ds, batch_size=CHUNK)])
    np.testing.assert_array_equal(rows, X[30:])
    with pytest.raises(ChunkReadError, match=rf"missing chunk {EMPTY} of array 'x'"):
        ZarrIterableDataset(path, row_range=(10, 60))


def test_chunks_behind_symbolic_links_are_listed(tmp_path):
    """A store assembled from links (an array's chunks kept on another file system) holds every chunk."""
    path = tmp_path / "s.zarr"
    zarr_default(path, data=X + 1)
    (path / "x" / "c" / "3").rename(tmp_path / "elsewhere")
    (path / "x" / "c" / "3").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    np.testing.assert_array_equal(read_rows(path), X + 1)


def test_one_listing_per_array_and_no_request_per_chunk(tmp_path):
    """The check lists each array's keys once and asks for no chunk: counted on a store that counts."""

    class Counting(zarr.storage.WrapperStore):
        calls: list = []

        async def list_prefix(self, prefix):
            Counting.calls.append(("list", prefix))
            async for key in self._store.list_prefix(prefix):
                yield key

        async def get(self, key, prototype, byte_range=None):
            Counting.calls.append(("get", key))
            return await self._store.get(key, prototype, byte_range)

        async def exists(self, key):
            Counting.calls.append(("exists", key))
            return await self._store.exists(key)

    path = tmp_path / "s.zarr"
    group = zarr.open_group(str(path), mode="w")
    for name in ("x", "y"):
        group.create_array(name, shape=X.shape, dtype=X.dtype, chunks=(CHUNK, 3))[:] = X
    store = Counting(zarr.storage.LocalStore(str(path), read_only=True))
    opened = zarr.open_group(store, mode="r")
    Counting.calls.clear()
    with pytest.raises(ChunkReadError, match=rf"missing chunk {EMPTY} of array 'x'.*array 'y' too"):
        ZarrIterableDataset(opened, variables=["x", "y"])
    lists = [c for c in Counting.calls if c[0] == "list"]
    chunk_requests = [c for c in Counting.calls if c[0] != "list" and "/c/" in c[1]]
    assert sorted(lists) == [("list", "x/"), ("list", "y/")] and not chunk_requests, Counting.calls


def test_over_http_the_first_missing_chunk_names_the_option_at_read(tmp_path):
    """A store read over HTTP cannot list its keys: the first missing chunk's error names what to do."""
    zarr_default(tmp_path / "s.zarr")
    with HttpStoreServer(tmp_path) as server:
        url = f"{server.url}/s.zarr"
        ds = ZarrIterableDataset(url, variables=["x"], shuffle=False)  # not listed: built
        with pytest.raises(ChunkReadError) as err:
            list(ZarrDataLoader(ds, batch_size=CHUNK))
        message = str(err.value)
        assert f"missing chunk {EMPTY} (rows 20:30) of array 'x'" in message
        assert "fill value 0.0" in message and "ReadOptions(missing_chunks='fill')" in message
        assert "write_empty_chunks=False (zarr's default)" in message
        np.testing.assert_array_equal(read_rows(url, missing_chunks="fill"), X)


def test_an_s3_store_is_listed_at_construction(tmp_path):
    zarr_default(tmp_path / "s.zarr")
    with S3Server() as s3:
        s3.create_bucket("course")
        s3.upload(tmp_path / "s.zarr", "s3://course/s.zarr")
        options = ReadOptions(storage_options=s3.storage_options)
        with pytest.raises(ChunkReadError, match=rf"missing chunk {EMPTY} of array 'x'.*'x/c/{EMPTY}/0'"):
            ZarrIterableDataset("s3://course/s.zarr", variables=["x"], read=options)


def test_missing_chunks_must_be_error_or_fill():
    with pytest.raises(ValueError, match=r"missing_chunks must be 'error' or 'fill', got 'skip'"):
        ReadOptions(missing_chunks="skip")


# -- audit: the missing chunks before a job -------------------------------------------------------------


def test_audit_lists_the_missing_chunks(tmp_path, capsys):
    path = tmp_path / "s.zarr"
    zarr_default(path)
    report = audit(path, world_size=2, batch_size=5)
    assert report.missing_chunks == {"x": [EMPTY]} and not report.ok
    assert f"missing chunks       1 of array 'x': [{EMPTY}]" in report.summary()
    assert "missing_chunks='fill'" in report.summary()
    filled = audit(path, world_size=2, batch_size=5, read=ReadOptions(missing_chunks="fill"))
    assert filled.missing_chunks == {"x": [EMPTY]} and filled.ok
    complete = tmp_path / "p.zarr"
    prepare_zarr({"x": X}, complete, chunk_rows=CHUNK, progress=False)
    assert audit(complete, world_size=2, batch_size=5).missing_chunks == {}
    shutil.rmtree(complete / "x" / "c" / "3")  # lost since: audit lists a store marked complete too
    assert audit(complete, world_size=2, batch_size=5).missing_chunks == {"x": [3]}

    assert zarrtorch.cli.main(["audit", str(path), "--world-size", "2", "--batch-size", "5", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["missing_chunks"] == {"x": [EMPTY]}
    argv = ["audit", str(path), "--world-size", "2", "--batch-size", "5", "--missing-chunks", "fill"]
    assert zarrtorch.cli.main(argv) == 0
    assert "read as the fill value" in capsys.readouterr().out
