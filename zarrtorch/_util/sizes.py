"""The few arithmetic rules the package relies on, each written once."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative integers, without floating point."""
    return -(-int(a) // int(b))


def row_bytes(arrays: Mapping[str, Any]) -> int:
    """Decoded bytes of one row of every array together (anything with ``shape`` and ``dtype``):
    the unit a chunk length in MiB and the memory per worker are computed from."""
    return sum(int(np.dtype(a.dtype).itemsize * math.prod(a.shape[1:])) for a in arrays.values())


# a local store's chunks of at most this (every array's rows of a chunk together) are decoded in one thread by
# default: the Python work per chunk (its file opened, its rows handed on) then outweighs the decode, and a second
# thread only waits for the GIL (issue 43: one-row chunks of a 10-array group, 1.3-2x the rows/s with one thread).
# That one thread is the one that gathers the batches: a reading thread beside it takes the GIL back at every
# system call of every chunk (open, read, close) while the gathering thread wants it (issue 43: 1.4-1.5x the rows/s
# of that 10-array group with no reading thread, 0 workers; the same with 2)
SMALL_CHUNK_BYTES = 64 * 2**10

# a local store's chunks are read several to a task, up to this many decoded bytes: handing a task to a reading
# thread and its result back costs about what decoding a 32 KiB chunk does, and the wake-ups it takes left the
# reading threads idle while the gathering thread waited for them (benchmarks/README.md, "Small chunks, several to
# a read", and issue 43's 0-worker figures: 128 KiB rows two to a task reached 0.65x of the raw decode, eight 0.82x)
READ_TASK_BYTES = 2**20
MOST_PIECES_PER_READ = 64


def pieces_per_read(chunk_bytes: int) -> int:
    """Consecutive chunks of a local store one reading task decodes: as many as ``READ_TASK_BYTES`` hold, from 1
    (a chunk of 512 KiB or more) to ``MOST_PIECES_PER_READ``."""
    return max(1, min(MOST_PIECES_PER_READ, READ_TASK_BYTES // max(1, int(chunk_bytes))))


def held_chunks(*, buffer_chunks: int, in_flight: int, row_shuffle: bool) -> int:
    """Chunks of decoded data one reading process holds at most: the shuffle buffer (when rows are
    shuffled), one per read in flight (decoded ahead) and the chunk being consumed."""
    return (int(buffer_chunks) if row_shuffle else 0) + int(in_flight) + 1


def native(dtype) -> np.dtype:
    """``dtype`` in this machine's byte order: what a batch holds (``torch.from_numpy`` refuses any other)."""
    dtype = np.dtype(dtype)
    return dtype if dtype.isnative else dtype.newbyteorder("=")
