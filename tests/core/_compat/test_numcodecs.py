"""The part of numcodecs zarrtorch relies on (zarrtorch/_compat/numcodecs.py): its Blosc extension exports
c-blosc's ``blosc_decompress_ctx``, which decodes as numcodecs' own ``decompress`` does, from bytes and from a
writable buffer, and refuses a damaged frame."""

from __future__ import annotations

import ctypes

import numcodecs
import numpy as np
import pytest
from numcodecs.blosc import decompress as numcodecs_decompress

from zarrtorch._compat.numcodecs import _blosc_ctx_function, blosc_decompressor, blosc_decompressor_at

VALUES = np.random.default_rng(3).random((4, 32, 32)).astype("f4")


@pytest.fixture(params=["lz4", "zstd", "blosclz"])
def frame(request) -> bytes:
    codec = numcodecs.Blosc(cname=request.param, clevel=1, shuffle=numcodecs.Blosc.SHUFFLE)
    return bytes(codec.encode(VALUES))


def test_numcodecs_blosc_extension_exports_blosc_decompress_ctx():
    assert _blosc_ctx_function() is not None, (
        "numcodecs' Blosc extension no longer exports blosc_decompress_ctx: update "
        "zarrtorch/_compat/numcodecs.py (it falls back to numcodecs' decompress, slower on small chunks)"
    )


@pytest.mark.parametrize("given", ["bytes", "writable", "read-only"])
def test_it_decodes_as_numcodecs_does(frame, given):
    source = {
        "bytes": frame,
        "writable": memoryview(bytearray(frame)),
        "read-only": memoryview(frame),
    }[given]
    ours, theirs = np.empty(VALUES.nbytes, np.uint8), np.empty(VALUES.nbytes, np.uint8)
    blosc_decompressor()(source, ours)
    numcodecs_decompress(frame, theirs)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours.view("f4").reshape(VALUES.shape), VALUES)


@pytest.mark.parametrize("cname", ["lz4", "zstd"])  # compressed frames (blosclz stores this data as it is)
def test_a_damaged_frame_is_a_runtime_error(cname):
    codec = numcodecs.Blosc(cname=cname, clevel=1, shuffle=numcodecs.Blosc.SHUFFLE)
    damaged = bytearray(codec.encode(VALUES))
    damaged[16:] = bytes(len(damaged) - 16)  # the header kept, its blocks' offsets and data zeroed
    with pytest.raises(RuntimeError, match="blosc decompression"):
        blosc_decompressor()(bytes(damaged), np.empty(VALUES.nbytes, np.uint8))


def test_it_decodes_a_frame_at_an_address_as_numcodecs_does(frame):
    """The reader of local Blosc chunks hands over its read buffer's address, known once per thread."""
    held = bytearray(frame)
    address = ctypes.addressof(ctypes.c_char.from_buffer(held))
    ours, theirs = np.empty(VALUES.nbytes, np.uint8), np.empty(VALUES.nbytes, np.uint8)
    blosc_decompressor_at()(address, ours)
    numcodecs_decompress(frame, theirs)
    np.testing.assert_array_equal(ours, theirs)


def test_a_damaged_frame_at_an_address_is_a_runtime_error():
    codec = numcodecs.Blosc(cname="lz4", clevel=1, shuffle=numcodecs.Blosc.SHUFFLE)
    damaged = bytearray(codec.encode(VALUES))
    damaged[16:] = bytes(len(damaged) - 16)
    with pytest.raises(RuntimeError, match="blosc decompression"):
        blosc_decompressor_at()(ctypes.addressof(ctypes.c_char.from_buffer(damaged)), np.empty(VALUES.nbytes, np.uint8))
