"""The private parts of fsspec zarrtorch relies on: an async file system's ``_exists`` and ``_strip_protocol``.

``tests/core/_compat/test_fsspec.py`` checks them against the installed fsspec (an optional dependency, for stores
given by URL: callers import this module only for one).
"""

from __future__ import annotations

from zarrtorch._compat.zarr import run


def exists(fs, path: str) -> bool:
    """Whether ``path`` exists on the file system ``fs`` (a store's, as zarr opened it).

    Why: zarr opens an fsspec store's file system in asynchronous mode (``asynchronous=True``), whose blocking
    methods refuse to run; its coroutine ``_exists`` is the only way to ask, private by fsspec's naming, and it
    must run on zarr's event loop, which owns the file system's session."""
    return fs.exists(path) if not fs.async_impl else run(fs._exists(path))


def strip_protocol(fs, url: str) -> str:
    """``url`` as the path ``fs`` names it (``s3://bucket/x`` -> ``bucket/x``; an HTTP file system keeps the URL).

    Why: fsspec offers no public function for it; every file system implements its own ``_strip_protocol``
    classmethod, which fsspec itself calls to compare paths."""
    return fs._strip_protocol(url)
