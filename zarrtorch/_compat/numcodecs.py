"""Blosc's C decoder, called from the library numcodecs builds and loads (``numcodecs.blosc``'s extension).

numcodecs' ``blosc.decompress`` asks ``multiprocessing`` which process it runs in and takes Blosc's global lock
on every call, to choose between Blosc's global thread pool and a one-thread context. The loader decodes small
chunks (one row of a WeatherBench2-style variable is a 4 KiB chunk) in its own threads, one thread per chunk,
where that choice is always the one-thread context: those checks cost twice the decode of such a chunk.
``blosc_decompress_ctx`` is c-blosc's public, thread-safe entry point for exactly that decode; numcodecs' extension
exports it, but that it does is numcodecs' build detail, not its API. Where it is not found, numcodecs'
``decompress`` is used (:func:`blosc_decompressor`).

``tests/core/_compat/test_numcodecs.py`` checks the installed numcodecs still exports it and that both decode
alike.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np


def _blosc_ctx_function():
    """c-blosc's ``int blosc_decompress_ctx(const void *src, void *dest, size_t destsize, int nthreads)`` from
    numcodecs' loaded extension, or ``None`` where it does not export it."""
    import numcodecs.blosc

    try:
        function = ctypes.CDLL(numcodecs.blosc.__file__).blosc_decompress_ctx
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def blosc_decompressor() -> Callable[[object, np.ndarray], None]:
    """``decompress(source, dest)``: a Blosc frame (``bytes``, or a writable buffer such as a chunk file's read
    buffer) decoded into ``dest`` (a writable C-contiguous uint8 array), by ``blosc_decompress_ctx`` with one
    thread (ctypes releases the GIL for the call, as numcodecs does); a read-only buffer goes through numcodecs.
    The caller checks the frame's header against both sizes first: Blosc reads as many bytes as the header
    says. A frame that does not decode raises ``RuntimeError``, as numcodecs does."""
    from numcodecs.blosc import decompress as numcodecs_decompress

    function = _blosc_ctx_function()
    if function is None:
        return numcodecs_decompress

    def decompress(source, dest: np.ndarray) -> None:
        try:
            held = source if isinstance(source, bytes) else ctypes.c_char.from_buffer(source)
            target = ctypes.c_char.from_buffer(dest)
        except (TypeError, ValueError):  # a read-only buffer (bytes given whole, sliced), or an empty one
            numcodecs_decompress(source, dest)
            return
        address = held if isinstance(held, bytes) else ctypes.addressof(held)  # ctypes passes bytes' own buffer
        got = function(address, ctypes.addressof(target), dest.nbytes, 1)
        del held, target  # the buffers' exports end here: the read buffer may be replaced
        if got != dest.nbytes:
            raise RuntimeError(f"error during blosc decompression: {got}")

    return decompress


def blosc_decompressor_at() -> Callable[[int, np.ndarray], None] | None:
    """``decompress_at(address, dest)``: the Blosc frame held at ``address`` (memory the caller keeps mapped, its
    header checked against ``dest`` and against the bytes there first) decoded into ``dest`` (a writable
    C-contiguous array) by ``blosc_decompress_ctx`` with one thread, outside the GIL. For a reader whose buffer's
    address is known once: no buffer export of the source per call. ``None`` where numcodecs does not export the
    function; a frame that does not decode raises ``RuntimeError``, as numcodecs does."""
    function = _blosc_ctx_function()
    if function is None:
        return None

    def decompress_at(address: int, dest: np.ndarray) -> None:
        target = ctypes.c_char.from_buffer(dest)
        got = function(address, ctypes.addressof(target), dest.nbytes, 1)
        del target  # the destination's export ends here
        if got != dest.nbytes:
            raise RuntimeError(f"error during blosc decompression: {got}")

    return decompress_at
