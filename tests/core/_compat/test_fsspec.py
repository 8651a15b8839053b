"""The private parts of fsspec zarrtorch relies on (zarrtorch/_compat/fsspec.py): an async file system's ``_exists``
run on zarr's loop, and each file system's ``_strip_protocol``."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from zarrtorch import prepare_zarr
from zarrtorch._compat.fsspec import exists, strip_protocol
from zarrtorch.course.servers import HttpStoreServer

fsspec = pytest.importorskip("fsspec")


def test_exists_asks_a_stores_async_file_system(tmp_path):
    """zarr opens a URL's file system in asynchronous mode, whose blocking ``exists`` refuses to run."""
    prepare_zarr({"x": np.arange(8.0)}, tmp_path / "s.zarr", progress=False)
    with HttpStoreServer(tmp_path) as server:
        fs = zarr.storage.FsspecStore.from_url(f"{server.url}/s.zarr", read_only=True).fs
        assert fs.async_impl and fs.asynchronous
        assert exists(fs, f"{server.url}/s.zarr/zarr.json"), "update zarrtorch._compat.fsspec.exists"
        assert not exists(fs, f"{server.url}/s.zarr/nothing.json"), "update zarrtorch._compat.fsspec.exists"


def test_exists_asks_a_blocking_file_system_directly():
    fs = fsspec.filesystem("memory")
    fs.pipe("/compat-guard/here", b"1")
    assert exists(fs, "/compat-guard/here") and not exists(fs, "/compat-guard/not-here")


def test_strip_protocol_gives_the_path_each_file_system_names():
    update = "update zarrtorch._compat.fsspec.strip_protocol"
    assert strip_protocol(fsspec.filesystem("memory"), "memory://bucket/x.zarr") == "/bucket/x.zarr", update
    http = fsspec.get_filesystem_class("http")
    assert strip_protocol(http, "http://host:8000/x.zarr") == "http://host:8000/x.zarr", update
    s3fs = pytest.importorskip("s3fs")
    assert strip_protocol(s3fs.S3FileSystem, "s3://bucket/x.zarr/") == "bucket/x.zarr", update
