"""The chunks window batches are gathered from (zarrtorch.held_chunks): slots, gathers of every dtype, errors."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from zarrtorch.held_chunks import HeldChunks


def put(held: HeldChunks, chunk: int, rows: dict[str, np.ndarray]) -> None:
    """Hold ``rows`` as chunk ``chunk`` the way the loader does: a reading function decodes into a free slot
    (here: copies), and the consumer holds the slot it returns."""

    def read_piece(start, stop, into):
        for name, target in into.items():
            target[: len(rows[name])] = rows[name]

    held.hold(chunk, held.reading(read_piece)(0, 0))


def chunk_of(c: int, rows: int, dtype, shape=(2, 3)) -> np.ndarray:
    values = np.arange(rows * int(np.prod(shape))).reshape(rows, *shape) + 100 * c
    return values.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.uint16, np.uint8, np.bool_, np.complex64])
def test_gather_returns_each_row_of_each_chunk(dtype):
    held = HeldChunks({"f": ((2, 3), np.dtype(dtype))}, chunk_rows=4, slots=3)
    chunks = {c: chunk_of(c, 4, dtype) for c in (7, 2, 9)}
    for c, rows in chunks.items():
        put(held, c, {"f": rows})
    store_rows = np.array([[29, 30, 31], [8, 9, 10], [38, 39, 11]], dtype=np.int64)  # windows x steps
    out = np.empty((3, 3, 2, 3), dtype=dtype)
    held.gather("f", held.rows_of(store_rows.reshape(-1)), out)
    expect = np.stack([chunks[r // 4][r % 4] for r in store_rows.reshape(-1)]).reshape(out.shape)
    np.testing.assert_array_equal(out, expect)


def test_a_dropped_slot_is_filled_next_and_the_last_chunk_may_be_short():
    held = HeldChunks({"f": ((), np.dtype(np.int64))}, chunk_rows=5, slots=2)
    put(held, 0, {"f": np.arange(5)})
    put(held, 1, {"f": np.arange(5, 10)})
    held.drop(0)
    put(held, 2, {"f": np.arange(10, 12)})  # the store's last chunk: 2 rows
    assert len(held) == 2
    assert held.rows_of(np.array([10, 11, 5])).tolist() == [0, 1, 5]  # chunk 2 in slot 0
    out = np.empty(3, np.int64)
    held.gather("f", held.rows_of(np.array([11, 10, 9])), out)
    assert out.tolist() == [11, 10, 9]


def test_gather_converts_into_another_dtype_and_into_a_strided_array():
    """CF-packed arrays are gathered into their decoded dtype; a non-contiguous target is written, not a copy."""
    held = HeldChunks({"p": ((3,), np.dtype(np.int16))}, chunk_rows=2, slots=2)
    put(held, 0, {"p": np.array([[1, 2, 3], [4, 5, 6]], np.int16)})
    as_float = np.zeros((1, 2, 3), np.float32)
    held.gather("p", held.rows_of(np.array([1, 0])), as_float)
    assert as_float.tolist() == [[[4, 5, 6], [1, 2, 3]]]
    wide = np.zeros((1, 2, 6), np.int16)
    held.gather("p", held.rows_of(np.array([0, 1])), wide[:, :, ::2])
    assert wide[0, :, ::2].tolist() == [[1, 2, 3], [4, 5, 6]] and not wide[:, :, 1::2].any()


def test_more_chunks_than_slots_or_a_chunk_not_held_is_an_internal_error_not_wrong_rows():
    held = HeldChunks({"f": ((), np.dtype(np.float32))}, chunk_rows=2, slots=1)
    put(held, 3, {"f": np.ones(2, np.float32)})
    with pytest.raises(RuntimeError, match="all 1 slots of the chunks held"):
        put(held, 4, {"f": np.ones(2, np.float32)})
    with pytest.raises(RuntimeError, match="needs chunk 5 of the store, which is not held"):
        held.rows_of(np.array([6, 10]))


GATHER_IN_A_FRESH_PROCESS = """
import os, sys
import numpy as np, torch
from zarrtorch.held_chunks import HeldChunks
torch.set_num_threads(2)  # a training process's intra-op threads (the default: one per core)
held = HeldChunks({"f": ((16, 64), np.dtype(np.float32))}, chunk_rows=32, slots=4)
held.data["f"][...] = np.arange(held.data["f"].size, dtype=np.float32).reshape(held.data["f"].shape)
rows = np.arange(127, -1, -1, dtype=np.int64)
out = np.empty((128, 16, 64), np.float32)
before = len(os.listdir("/proc/self/task"))
held.gather("f", rows, out)
after = len(os.listdir("/proc/self/task"))
assert (out == held.data["f"][rows]).all()
print(before, after)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts the process's threads in /proc")
def test_a_gather_starts_no_intra_op_threads_beside_the_decoding_threads():
    """A window batch is gathered in the loader's process while its threads decode chunks: torch.index_select
    ran the copy on torch's intra-op threads as well (2 on 2 cores), which spun against the decoding threads;
    epochs of windows of 6 from a sharded store with 0 workers fell from ~7,500 to ~1,200 windows/s at 4x the CPU
    time on 2 shared cores (measured while sharded stores became read by default, issue 43). The gather is one
    numpy ``take`` in the calling thread (it releases the GIL), so no thread is started by it."""
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch's intra-op threads are not OpenMP's here")
    done = subprocess.run([sys.executable, "-c", GATHER_IN_A_FRESH_PROCESS], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    before, after = (int(v) for v in done.stdout.split())
    assert after == before, f"the gather started {after - before} thread(s)"
