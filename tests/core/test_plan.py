"""Property tests of the pure partition (plan.py), the shuffle-buffer schedule (buffer.py) and
``ZarrIterableDataset.batch_row_ids``, over random sizes, topologies, seeds and epochs.

The oracles are written independently of the code under test: the epoch's stream is rebuilt row by row
from the chunk order, the DataLoader's round-robin is replayed with queues, and the buffer is checked by
counting rows in and out.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
from collections import Counter, deque
from functools import lru_cache

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from zarr.storage import MemoryStore

from zarrtorch import ReadOptions, ZarrIterableDataset, epoch_plan
from zarrtorch.buffer import RowCursor, SlotBuffer, schedule, simulate
from zarrtorch.plan import (
    RunStream,
    batches_consumed_per_worker,
    chunk_order,
    resume_roles,
    round_robin_order,
    row_budget,
    stream_slice,
    worker_batch_ranges,
)

EXAMPLES = 300
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def setups(draw, max_rows=1500):
    """(rows, chunk_rows, world_size, num_workers, batch_size, seed, epoch, drop_last)."""
    rows = draw(st.integers(1, max_rows))
    chunk = draw(st.integers(1, max(1, min(rows, 200))))
    world = draw(st.integers(1, 4))
    workers = draw(st.integers(0, 3))
    batch = draw(st.integers(1, 48))
    seed = draw(st.integers(0, 2**32 - 1))
    epoch = draw(st.integers(0, 6))
    drop_last = draw(st.booleans())
    return rows, chunk, world, workers, batch, seed, epoch, drop_last


def fits(rows, world, batch, drop_last):
    return not drop_last or rows >= world * batch


def expected_stream(rows, chunk, order):
    """The epoch's rows laid end to end, chunk by chunk, in ``order`` (the docstring's definition)."""
    return np.concatenate([np.arange(c * chunk, min(rows, (c + 1) * chunk)) for c in order])


def piece_rows(pieces):
    if len(pieces) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(lo, hi) for lo, hi in pieces])


def dataloader_order(counts):
    """Replay the DataLoader: ask workers in turn, skip a worker once it has run out."""
    queues = [deque(range(c)) for c in counts]
    active = [True] * len(counts)
    out = []
    w = 0
    while any(active):
        if active[w]:
            if queues[w]:
                out.append(w)
                queues[w].popleft()
            else:
                active[w] = False
        w = (w + 1) % len(counts)
    return out


# -- pure plan --------------------------------------------------------------------------------------------


@SETTINGS
@given(setups())
def test_row_budget(setup):
    rows, _, world, _, batch, _, _, drop_last = setup
    if not fits(rows, world, batch, drop_last):
        with pytest.raises(ValueError, match="drop_last"):
            row_budget(rows, world_size=world, batch_size=batch, drop_last=drop_last)
        return
    b = row_budget(rows, world_size=world, batch_size=batch, drop_last=drop_last)
    assert b.batches_per_rank >= 1
    assert 1 <= b.last_batch_size <= batch
    assert b.rows_per_rank == (b.batches_per_rank - 1) * batch + b.last_batch_size
    if drop_last:
        assert b.last_batch_size == batch and b.padding_rows == 0
        assert world * b.rows_per_rank + b.dropped_rows == rows
        assert 0 <= b.dropped_rows < world * batch
    else:
        assert b.dropped_rows == 0
        assert world * b.rows_per_rank == rows + b.padding_rows
        assert 0 <= b.padding_rows < world


@SETTINGS
@given(setups())
def test_epoch_plan_partition(setup):
    rows, chunk, world, workers, batch, seed, epoch, drop_last = setup
    kw = dict(seed=seed, epoch=epoch, batch_size=batch, drop_last=drop_last, world_size=world, num_workers=workers)
    if not fits(rows, world, batch, drop_last):
        for r in range(world):  # every rank refuses, none is left with zero batches
            with pytest.raises(ValueError, match="full batch"):
                epoch_plan(rows, chunk, rank=r, **kw)
        return
    plans = [epoch_plan(rows, chunk, rank=r, **kw) for r in range(world)]
    n_chunks = -(-rows // chunk)
    stream = expected_stream(rows, chunk, chunk_order(n_chunks, seed=seed, epoch=epoch))
    per_rank = plans[0].budget.rows_per_rank
    seen = []
    for r, plan in enumerate(plans):
        assert plan.batches == plans[0].batches >= 1  # every rank the same number of batches
        assert len(plan.workers) == max(1, workers)
        rank_rows = []
        for w in plan.workers:
            p = w.pieces
            assert p.ndim == 2 and p.shape[1] == 2
            if len(p):
                assert (p[:, 0] >= 0).all() and (p[:, 1] <= rows).all() and (p[:, 0] < p[:, 1]).all()
                assert (p[:, 0] // chunk == (p[:, 1] - 1) // chunk).all()  # each piece inside one chunk
            assert w.rows == int(w.batch_sizes.sum())
            rank_rows.append(piece_rows(p))
        rank_rows = np.concatenate(rank_rows)
        # rank r reads the r-th contiguous slice of the stream (wrapping around for evaluation padding)
        positions = np.arange(r * per_rank, (r + 1) * per_rank) % rows
        np.testing.assert_array_equal(rank_rows, stream[positions])
        sizes = np.concatenate([w.batch_sizes for w in plan.workers])
        assert len(sizes) == plan.batches
        assert (sizes[:-1] == batch).all() and sizes[-1] == plan.budget.last_batch_size
        seen.append(rank_rows)
    seen = np.concatenate(seen)
    counts = Counter(seen.tolist())
    if drop_last:
        assert len(counts) == len(seen)  # disjoint across all ranks and workers
        assert rows - len(seen) < world * batch
        assert all(size == batch for plan in plans for w in plan.workers for size in w.batch_sizes)
    else:
        assert set(counts) == set(range(rows))  # every row seen
        assert len(seen) - rows == plans[0].budget.padding_rows < world


GOLDEN = dict(rows=1000, chunk_rows=37, batch_size=16, drop_last=False, seed=2026, buffer_chunks=3)
PROBE = """
import hashlib, json, sys
import numpy as np
from zarrtorch import EpochSpec, Topology
from zarrtorch.resume import batches_of
out = {}
for epoch, rank, world, workers in json.loads(sys.argv[2]):
    spec = EpochSpec(**json.loads(sys.argv[1]))
    rows = np.concatenate(batches_of(spec, spec.plan(epoch, Topology(rank, world, workers))))
    out[f"{epoch}/{rank}/{world}/{workers}"] = hashlib.sha256(rows.astype("<i8").tobytes()).hexdigest()
print(json.dumps(out))
"""
CASES = [(0, 0, 1, 0), (1, 1, 3, 2), (5, 2, 4, 1), (3, 0, 2, 3)]


def digests() -> dict:
    from zarrtorch import EpochSpec, Topology
    from zarrtorch.resume import batches_of

    out = {}
    for epoch, rank, world, workers in CASES:
        spec = EpochSpec(**GOLDEN)
        rows = np.concatenate(batches_of(spec, spec.plan(epoch, Topology(rank, world, workers))))
        out[f"{epoch}/{rank}/{world}/{workers}"] = hashlib.sha256(rows.astype("<i8").tobytes()).hexdigest()
    return out


def test_the_same_plan_in_another_process():
    """Every rank computes its plan by itself: a fresh interpreter (another hash seed, nothing cached) gets the
    very same batches as this one."""
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    run = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(GOLDEN), json.dumps(CASES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(run.stdout) == digests()


def test_the_plan_matches_its_golden_values():
    """The batches of a fixed set-up, pinned: a change of the algorithm or of NumPy's generator that alters them
    fails here, and then PLAN_VERSION must be raised (older checkpoints are refused, not misread)."""
    from zarrtorch import EpochSpec, Topology
    from zarrtorch.plan import PLAN_VERSION
    from zarrtorch.resume import batches_of

    spec = EpochSpec(**GOLDEN)
    batches = batches_of(spec, spec.plan(1, Topology(rank=1, world_size=3, num_workers=2)))
    assert PLAN_VERSION == 4
    assert len(batches) == 21
    assert batches[0].tolist() == [43, 66, 56, 61, 73, 40, 49, 72, 46, 65, 38, 42, 44, 47, 58, 50]
    digest = hashlib.sha256(np.concatenate(batches).astype("<i8").tobytes()).hexdigest()[:16]
    assert digest == "0f4c8780f2f307e0"
    assert spec.fingerprint() == "f97bcd4dc97e34b0"


@SETTINGS
@given(st.integers(10, 400), st.integers(0, 2**32 - 1), st.integers(0, 50))
def test_chunk_order_changes_every_epoch(n_chunks, seed, epoch):
    a = chunk_order(n_chunks, seed=seed, epoch=epoch)
    b = chunk_order(n_chunks, seed=seed, epoch=epoch + 1)
    np.testing.assert_array_equal(np.sort(a), np.arange(n_chunks))
    assert not np.array_equal(a, b)  # P(equal) = 1/10! at worst
    np.testing.assert_array_equal(chunk_order(n_chunks, seed=seed, epoch=epoch, shuffle=False), np.arange(n_chunks))


@SETTINGS
@given(setups(), st.integers(0, 6))
def test_freeze_partition_keeps_rows_changes_order(setup, other_epoch):
    rows, chunk, world, workers, batch, seed, epoch, drop_last = setup
    assume(fits(rows, world, batch, drop_last) and other_epoch != epoch)
    for r in range(world):
        kw = dict(
            seed=seed,
            batch_size=batch,
            drop_last=drop_last,
            world_size=world,
            rank=r,
            num_workers=workers,
            freeze_partition=True,
        )
        a, b = epoch_plan(rows, chunk, epoch=epoch, **kw), epoch_plan(rows, chunk, epoch=other_epoch, **kw)
        for wa, wb in zip(a.workers, b.workers, strict=True):
            np.testing.assert_array_equal(np.sort(piece_rows(wa.pieces)), np.sort(piece_rows(wb.pieces)))
            if len(wa.pieces) >= 10:  # the order of the pieces is drawn again (P(same) <= 1/10!)
                assert not np.array_equal(wa.pieces, wb.pieces)


@SETTINGS
@given(st.integers(0, 300), st.integers(0, 8))
def test_worker_batch_ranges_and_round_robin(n_batches, num_workers):
    ranges = worker_batch_ranges(n_batches, num_workers)
    assert len(ranges) == max(1, num_workers)
    assert ranges[0][0] == 0 and ranges[-1][1] == n_batches
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))  # contiguous runs
    counts = [b - a for a, b in ranges]
    assert max(counts) - min(counts) <= 1
    order = round_robin_order(counts)
    assert order.tolist() == dataloader_order(counts)
    for k in range(n_batches + 1):
        assert batches_consumed_per_worker(counts, k) == np.bincount(order[:k], minlength=len(counts)).tolist()


@SETTINGS
@given(st.integers(1, 200), st.integers(0, 8), st.data())
def test_resume_roles_continue_the_run(n_batches, num_workers, data):
    """Resuming after ``skip`` batches, a fresh DataLoader (round-robin from worker 0, over what each worker
    has left) yields the plan's batches exactly in the order the uninterrupted run would have."""
    counts = [b - a for a, b in worker_batch_ranges(n_batches, num_workers)]
    order = round_robin_order(counts)
    skip = data.draw(st.integers(0, n_batches))
    roles = resume_roles(counts, skip)
    assert sorted(role for role, _ in roles) == list(range(len(counts)))  # every share played once
    left = [counts[role] - skipped for role, skipped in roles]
    resumed = [roles[w][0] for w in dataloader_order(left)]
    assert resumed == order[skip:].tolist()
    for role, skipped in roles:
        assert skipped == int(np.sum(order[:skip] == role))


def stream_pieces(order: np.ndarray, rows: int, chunk_rows: int, start: int, stop: int) -> np.ndarray:
    """Rows at stream positions ``[start, stop)`` of the chunks laid end to end in ``order``."""
    lo = np.asarray(order, dtype=np.int64) * chunk_rows
    runs = np.stack([lo, np.minimum(lo + chunk_rows, rows)], axis=1)
    return stream_slice(RunStream(runs), start, stop)


@SETTINGS
@given(st.integers(1, 500), st.integers(1, 60), st.integers(0, 2**32 - 1), st.data())
def test_stream_pieces_match_the_stream(rows, chunk, seed, data):
    n_chunks = -(-rows // chunk)
    order = chunk_order(n_chunks, seed=seed, epoch=0)
    stream = expected_stream(rows, chunk, order)
    start = data.draw(st.integers(0, 3 * rows))
    stop = data.draw(st.integers(start, start + 3 * rows))
    pieces = stream_pieces(order, rows, chunk, start, stop)
    np.testing.assert_array_equal(piece_rows(pieces), stream[np.arange(start, stop) % rows])
    if len(pieces):
        assert (pieces[:, 0] // chunk == (pieces[:, 1] - 1) // chunk).all()


# -- the shuffle buffer -----------------------------------------------------------------------------------


@st.composite
def buffer_cases(draw):
    # a worker's stream: disjoint row ranges in arbitrary order, split into arbitrary batch sizes
    n_pieces = draw(st.integers(1, 12))
    lengths = draw(st.lists(st.integers(1, 80), min_size=n_pieces, max_size=n_pieces))
    starts = np.cumsum([0] + lengths[:-1]) * 2  # gaps between pieces
    pieces = np.stack([starts, starts + lengths], axis=1).astype(np.int64)
    pieces = pieces[draw(st.permutations(range(n_pieces)))]
    total = sum(lengths)
    sizes = []
    while sum(sizes) < total:
        sizes.append(min(draw(st.integers(1, 40)), total - sum(sizes)))
    capacity = draw(st.integers(1, 300))
    warmup = draw(st.integers(1, 80))
    seed = draw(st.integers(0, 2**32 - 1))
    return pieces, np.array(sizes, dtype=np.int64), capacity, warmup, seed


@SETTINGS
@given(buffer_cases())
def test_buffer_emits_every_row_once_within_capacity(case):
    pieces, sizes, capacity, warmup, seed = case
    stream = piece_rows(pieces)
    bound = max(capacity, int(sizes.max()))
    batches = simulate(pieces, sizes, capacity=capacity, warmup_rows=warmup, rng=np.random.default_rng(seed))
    assert [len(b) for b in batches] == sizes.tolist()
    emitted = np.concatenate(batches)
    np.testing.assert_array_equal(np.sort(emitted), np.sort(stream))  # every row exactly once

    # Count rows in and out of the buffer, step by step: it never holds more than its capacity, the first
    # batch reads at most one warm-up chunk (or one batch), and no row leaves before it was read.
    filled = read = out = 0
    position = {int(r): i for i, r in enumerate(stream)}
    steps = list(schedule(sizes, len(stream), capacity=capacity, warmup_rows=warmup, rng=np.random.default_rng(seed)))
    assert steps[0].append <= max(warmup, int(sizes[0]))
    for step, batch in zip(steps, batches, strict=True):
        filled += step.append
        read += step.append
        assert filled <= bound
        assert max(position[int(r)] for r in batch) < read
        read += step.refill
        out += len(batch)
        filled -= len(batch) - step.refill
        assert filled == read - out <= bound
    assert filled == 0 and read == out == len(stream)


@SETTINGS
@given(buffer_cases())
def test_buffer_without_shuffle_keeps_stream_order(case):
    pieces, sizes, capacity, warmup, _ = case
    batches = simulate(pieces, sizes, capacity=capacity, warmup_rows=warmup, rng=None)
    np.testing.assert_array_equal(np.concatenate(batches), piece_rows(pieces))
    assert [len(b) for b in batches] == sizes.tolist()


@SETTINGS
@given(buffer_cases())
def test_slot_buffer_moves_data_with_ids(case):
    """The data path (SlotBuffer with several columns) pairs every column with its row id."""
    pieces, sizes, capacity, warmup, seed = case
    buf = SlotBuffer(max(capacity, int(sizes.max())), {"index": ((), np.dtype(np.int64)), "x": ((2,), np.dtype("f8"))})
    cursor = RowCursor(pieces)

    def read(n):
        segs = cursor.read(n)
        return [{"index": s["index"], "x": np.stack([s["index"] * 2.0, -s["index"]], axis=1)} for s in segs]

    expected = simulate(pieces, sizes, capacity=capacity, warmup_rows=warmup, rng=np.random.default_rng(seed))
    for step, exp in zip(
        schedule(sizes, int(sizes.sum()), capacity=capacity, warmup_rows=warmup, rng=np.random.default_rng(seed)),
        expected,
        strict=True,
    ):
        batch = buf.apply(step, read)
        assert 0 <= buf.filled <= buf.capacity
        np.testing.assert_array_equal(batch["index"], exp)
        np.testing.assert_array_equal(batch["x"][:, 0], exp * 2.0)
        np.testing.assert_array_equal(batch["x"][:, 1], -exp)


# -- batch_row_ids of a dataset (metadata only: no chunk is ever read) -----------------------------------
METADATA_ONLY = ReadOptions(missing_chunks="fill")  # no chunk is written, and none is read


@lru_cache(maxsize=256)
def metadata_dataset(rows, chunk, seed, buffer_chunks, shuffle=True):
    arr = zarr.create_array(store=MemoryStore(), shape=(rows,), chunks=(chunk,), dtype="i1")
    return ZarrIterableDataset({"x": arr}, seed=seed, buffer_chunks=buffer_chunks, shuffle=shuffle, read=METADATA_ONLY)


@SETTINGS
@given(setups(max_rows=1200), st.integers(1, 4), st.integers(0, 3), st.integers(1, 4))
def test_batch_row_ids(setup, buffer_chunks, other_workers, other_buffer):
    rows, chunk, world, workers, batch, seed, epoch, drop_last = setup
    ds = metadata_dataset(rows, chunk, seed, buffer_chunks)
    kw = dict(epoch=epoch, world_size=world, batch_size=batch, drop_last=drop_last)
    if not fits(rows, world, batch, drop_last):
        for r in range(world):
            with pytest.raises(ValueError, match="full batch"):
                ds.batch_row_ids(rank=r, num_workers=workers, **kw)
        return
    per_rank = [ds.batch_row_ids(rank=r, num_workers=workers, **kw) for r in range(world)]
    n_batches = {len(b) for b in per_rank}
    assert len(n_batches) == 1  # every rank the same number of batches
    other = metadata_dataset(rows, chunk, seed, other_buffer)
    for r, batches in enumerate(per_rank):
        plan = ds.plan(rank=r, num_workers=workers, **kw)
        assert len(batches) == plan.batches
        sizes = [len(b) for b in batches]
        # batch sizes as documented: all full, except possibly the last one when drop_last=False
        assert sizes[:-1] == [batch] * (len(sizes) - 1)
        assert sizes[-1] == (batch if drop_last else plan.budget.last_batch_size)
        # a batch is assembled from the rows of the worker the DataLoader takes it from
        owner = round_robin_order([len(w.batch_sizes) for w in plan.workers])
        own_rows = [set(piece_rows(w.pieces).tolist()) for w in plan.workers]
        for b, w in zip(batches, owner, strict=True):
            assert set(b.tolist()) <= own_rows[w]
            assert len(set(b.tolist())) == len(b)
        # the rows of a rank depend neither on the number of workers nor on the buffer size
        rank_rows = np.sort(np.concatenate(batches))
        np.testing.assert_array_equal(np.sort(piece_rows(np.concatenate([w.pieces for w in plan.workers]))), rank_rows)
        for alt_ds, alt_workers in ((ds, other_workers), (other, workers), (other, other_workers)):
            alt = alt_ds.batch_row_ids(rank=r, num_workers=alt_workers, **kw)
            np.testing.assert_array_equal(np.sort(np.concatenate(alt)), rank_rows)
        # pure: the same call gives the same batches
        again = ds.batch_row_ids(rank=r, num_workers=workers, **kw)
        assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))
    everything = np.concatenate([np.concatenate(b) for b in per_rank])
    if drop_last:
        assert len(np.unique(everything)) == len(everything)
        assert rows - len(everything) < world * batch
    else:
        assert len(np.unique(everything)) == rows
        assert len(everything) - rows < world


@SETTINGS
@given(
    st.integers(10, 60),
    st.integers(1, 40),
    st.integers(1, 4),
    st.integers(0, 2),
    st.integers(0, 2**32 - 1),
    st.integers(0, 5),
)
def test_batch_row_ids_change_with_epoch(n_chunks, chunk, world, workers, seed, epoch):
    rows = n_chunks * chunk - (chunk // 2)  # a partial last chunk
    ds = metadata_dataset(rows, chunk, seed, 2)
    kw = dict(world_size=world, num_workers=workers, batch_size=4, drop_last=False)
    a = [np.concatenate(ds.batch_row_ids(epoch=epoch, rank=r, **kw)) for r in range(world)]
    b = [np.concatenate(ds.batch_row_ids(epoch=epoch + 1, rank=r, **kw)) for r in range(world)]
    assert not np.array_equal(np.concatenate(a), np.concatenate(b))


@SETTINGS
@given(setups(max_rows=600))
def test_batch_row_ids_without_shuffle_in_order(setup):
    rows, chunk, world, workers, batch, seed, epoch, drop_last = setup
    assume(fits(rows, world, batch, drop_last))
    ds = metadata_dataset(rows, chunk, seed, 2, shuffle=False)
    kw = dict(world_size=world, batch_size=batch, drop_last=drop_last, num_workers=0)
    per_rank = ds.plan(epoch=epoch, rank=0, **kw).budget.rows_per_rank
    for r in range(world):
        got = np.concatenate(ds.batch_row_ids(epoch=epoch, rank=r, **kw))
        np.testing.assert_array_equal(got, np.arange(r * per_rank, (r + 1) * per_rank) % rows)


@SETTINGS
@given(setups(max_rows=900), st.data())
def test_row_range_is_a_shifted_store(setup, data):
    """A chunk-aligned row window behaves exactly like a store holding only those rows, shifted."""
    rows, chunk, world, workers, batch, seed, epoch, drop_last = setup
    n_chunks = -(-rows // chunk)
    first = data.draw(st.integers(0, n_chunks - 1))
    last = data.draw(st.integers(first + 1, n_chunks))
    start, stop = first * chunk, min(rows, last * chunk)
    assume(fits(stop - start, world, batch, drop_last))
    arr = zarr.create_array(store=MemoryStore(), shape=(rows,), chunks=(chunk,), dtype="i1")
    window = ZarrIterableDataset({"x": arr}, seed=seed, buffer_chunks=2, row_range=(start, stop), read=METADATA_ONLY)
    alone = metadata_dataset(stop - start, chunk, seed, 2)
    kw = dict(epoch=epoch, world_size=world, batch_size=batch, drop_last=drop_last, num_workers=workers)
    for r in range(world):
        got, ref = window.batch_row_ids(rank=r, **kw), alone.batch_row_ids(rank=r, **kw)
        assert all(np.array_equal(a, b + start) for a, b in zip(got, ref, strict=True))
