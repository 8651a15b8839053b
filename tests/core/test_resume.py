"""Elastic resume (zarrtorch.resume): an epoch saved on W ranks x K workers continues on W' x K'.

Properties over random set-ups, on row ids alone: every new rank yields the same number of batches; no row
already consumed is read again; drop_last=False reads every row of the epoch (fewer than W' repeated as
padding), drop_last=True reads none twice and leaves out fewer than W' x batch. Then the same through
ZarrDataLoader on real data, with workers, twice in a row, and into the next epoch.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from zarrtorch import ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch.plan import EpochSpec, RunStream, Segment, Topology, chunk_order, epoch_plan
from zarrtorch.resume import batches_of, expand, remaining_stream, resumed_plan

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rank_batches(spec, epoch, history, world, workers):
    return [batches_of(spec, resumed_plan(spec, epoch, history, Topology(r, world, workers))) for r in range(world)]


@st.composite
def resumes(draw):
    rows = draw(st.integers(1, 700))
    chunk = draw(st.integers(1, 64))
    batch = draw(st.integers(1, 24))
    drop_last = draw(st.booleans())
    world = draw(st.integers(1, 4))
    if drop_last and rows < world * batch:
        world = 1
        rows = max(rows, batch)
    spec = EpochSpec(
        rows,
        chunk,
        batch,
        drop_last,
        seed=draw(st.integers(0, 5)),
        shuffle=draw(st.booleans()),
        buffer_chunks=draw(st.integers(0, 4)),
        redeal_every=draw(st.sampled_from([0, 0, 1, 2, 3])),  # shares kept K epochs (test_placement.py)
    )
    epoch = draw(st.integers(0, 3))
    topologies = [(world, draw(st.integers(0, 3)))]
    topologies += [(draw(st.integers(1, 5)), draw(st.integers(0, 3))) for _ in range(draw(st.integers(1, 2)))]
    fractions = [draw(st.floats(0, 1)) for _ in topologies[:-1]]
    return spec, epoch, topologies, fractions


@SETTINGS
@given(resumes())
def test_elastic_resume_exactly_once_and_equal_batches(case):
    spec, epoch, topologies, fractions = case
    history, consumed, padded = (), [], []
    for (world, workers), fraction in zip(topologies[:-1], fractions, strict=True):
        per_rank = rank_batches(spec, epoch, history, world, workers)
        counts = {len(b) for b in per_rank}
        assert len(counts) == 1  # equal batches on every rank, in every segment
        seen = int(fraction * counts.pop())
        for r, rank in enumerate(per_rank):  # a rank's padding copies (flagged) are not its rows: not consumed
            pad = resumed_plan(spec, epoch, history, Topology(r, world, workers)).padding
            for b in rank[:seen]:
                consumed.append(b[~np.isin(b, pad)])
                padded.append(b[np.isin(b, pad)])
        history += (Segment(world, workers, seen),)
    world, workers = topologies[-1]
    rest = rank_batches(spec, epoch, history, world, workers)
    assert len({len(b) for b in rest}) == 1
    old = np.concatenate(consumed) if consumed else np.zeros(0, np.int64)
    new = np.concatenate([b for rank in rest for b in rank]) if any(rest) else np.zeros(0, np.int64)
    assert not np.isin(new, old).any(), "a consumed row was read again"
    assert len(new) - len(np.unique(new)) < world, "more padding than the new world size"
    pads = np.concatenate(padded) if padded else np.zeros(0, np.int64)
    assert len(np.setdiff1d(pads, np.concatenate([old, new]))) == 0, "a row yielded only as padding"
    if spec.drop_last:
        assert len(old) == len(np.unique(old)) and len(new) == len(np.unique(new))
        assert spec.rows - len(old) - len(new) < world * spec.batch_size  # rows left out of the rest
        assert all(len(b) == spec.batch_size for rank in rest for b in rank)
    else:
        assert set(old.tolist()) | set(new.tolist()) == set(range(spec.rows))


def test_resume_without_history_is_the_plain_plan():
    spec = EpochSpec(300, 16, batch_size=8, drop_last=True, seed=2, buffer_chunks=2)
    a = rank_batches(spec, 1, (), 2, 1)
    ds_rows = [batches_of(spec, spec.plan(1, Topology(r, 2, 1))) for r in range(2)]
    assert all(np.array_equal(x, y) for ra, rb in zip(a, ds_rows, strict=True) for x, y in zip(ra, rb, strict=True))


def test_a_state_from_other_data_is_refused():
    spec = EpochSpec(100, 10, batch_size=10, drop_last=True)
    with pytest.raises(ValueError, match="does not belong to this data"):
        resumed_plan(spec, 0, (Segment(2, 0, 6),), Topology(0, 1, 0))  # 5 batches per rank at most


# -- through the loader, on data ------------------------------------------------------------------------

ROWS, CHUNK = 437, 20


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("resume") / "data.zarr"
    x = np.arange(ROWS, dtype=np.float32)[:, None].repeat(3, axis=1)
    prepare_zarr({"x": x, "y": 10 * np.arange(ROWS, dtype=np.int64)}, path, chunk_rows=CHUNK, progress=False)
    return path


def run_ranks(store, world, workers, *, state=None, stop_after=None, epoch=1, drop_last=False):
    """Every rank of a simulated topology (``rank=``/``world_size=``): the rows of its batches, its loader."""
    out = []
    for rank in range(world):
        ds = ZarrIterableDataset(store, seed=5, buffer_chunks=3, return_index=True)
        loader = ZarrDataLoader(
            ds, batch_size=16, drop_last=drop_last, num_workers=workers, rank=rank, world_size=world
        )
        loader.set_epoch(epoch)
        if state is not None:
            loader.load_state_dict(state)
        batches = []
        loader.length_at_start = len(loader)
        for batch in loader:
            np.testing.assert_array_equal(batch["x"][:, 0].numpy(), batch["index"].numpy())
            np.testing.assert_array_equal(batch["y"].numpy(), 10 * batch["index"].numpy())
            batches.append(batch["index"].numpy())
            if stop_after is not None and len(batches) == stop_after:
                break
        out.append((batches, loader))
    return out


@pytest.mark.parametrize("drop_last", [False, True])
def test_loader_resumes_2x2_on_3x1_then_1x2(store, drop_last):
    first = run_ranks(store, 2, 2, stop_after=5, drop_last=drop_last)
    state = first[0][1].state_dict()
    assert state["batches_seen"] == 5 and state["world_size"] == 2 and state["history"] == []
    second = run_ranks(store, 3, 1, state=state, stop_after=3, drop_last=drop_last)
    state2 = second[0][1].state_dict()
    assert state2["history"] == [[2, 2, 5]] and state2["batches_seen"] == 8 and state2["world_size"] == 3
    third = run_ranks(store, 1, 2, state=state2, drop_last=drop_last)
    lengths = {loader.length_at_start for _, loader in second}
    assert len(lengths) == 1  # len(loader) in the resumed epoch: batches before + the rest, equal on every rank
    assert len(third[0][0]) == third[0][1].length_at_start - 8
    rows = [b for part in (first, second, third) for batches, _ in part for b in batches]
    allrows = np.concatenate(rows)
    if drop_last:
        assert len(allrows) == len(np.unique(allrows)) and ROWS - len(allrows) < 2 * 16 + 3 * 16 + 16
    else:
        assert set(allrows.tolist()) == set(range(ROWS))
        assert len(allrows) - ROWS < 2 + 3 + 1  # padding of each topology
    # the next epoch is an ordinary epoch of the new topology
    loader = third[0][1]
    loader.set_epoch(2)
    fresh = ZarrDataLoader(
        ZarrIterableDataset(store, seed=5, buffer_chunks=3, return_index=True),
        batch_size=16,
        drop_last=drop_last,
        num_workers=2,
        rank=0,
        world_size=1,
    )
    fresh.set_epoch(2)
    a = [b["index"].numpy() for b in loader]
    b = [b["index"].numpy() for b in fresh]
    assert len(a) == len(b) and all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))


def test_same_topology_resume_is_exact(store):
    """On the saved topology the rest of the epoch is exactly the uninterrupted run's."""
    whole = run_ranks(store, 2, 2)
    first = run_ranks(store, 2, 2, stop_after=3)
    rest = run_ranks(store, 2, 2, state=first[0][1].state_dict())
    for r in range(2):
        got = first[r][0] + rest[r][0]
        assert len(got) == len(whole[r][0]) and all(np.array_equal(u, v) for u, v in zip(got, whole[r][0], strict=True))


def test_cache_refuses_another_topology(store):
    ds = ZarrIterableDataset(store, seed=5, keep_in_memory=True)
    saved = ZarrDataLoader(ds, batch_size=16, rank=0, world_size=2)
    next(iter(saved))
    other = ZarrDataLoader(ZarrIterableDataset(store, seed=5, keep_in_memory=True), batch_size=16, rank=0, world_size=3)
    with pytest.raises(ValueError, match="keep_in_memory=True freezes the partition"):
        other.load_state_dict(saved.state_dict())


def test_cache_resumes_mid_epoch_from_memory(store):
    """With every piece cached, a resumed epoch replays the buffer on row ids and continues from the cache:
    the same batches as the uninterrupted epoch, rows still paired with their index."""
    ds = ZarrIterableDataset(store, seed=5, buffer_chunks=3, return_index=True, keep_in_memory=True)
    loader = ZarrDataLoader(ds, batch_size=16, rank=1, world_size=2)
    list(loader)  # epoch 0 fills the cache
    loader.set_epoch(1)
    whole = [b["index"].numpy() for b in loader]
    loader.set_epoch(1)
    first = []
    for batch in loader:
        first.append(batch["index"].numpy())
        if len(first) == 4:
            break
    state = loader.state_dict()
    loader.load_state_dict(state)
    rest = []
    for batch in loader:
        np.testing.assert_array_equal(batch["x"][:, 0].numpy(), batch["index"].numpy())
        np.testing.assert_array_equal(batch["y"].numpy(), 10 * batch["index"].numpy())
        rest.append(batch["index"].numpy())
    assert len(first + rest) == len(whole)
    assert all(np.array_equal(u, v) for u, v in zip(first + rest, whole, strict=True))


def mask_remainder(spec, epoch, history):
    """The rows of an epoch after ``history``, the slow way: every saved rank's batches replayed over the whole
    stream, a mark per row consumed (its own rank's copy; a padding copy, flagged, does not count), the stream
    without the marked rows."""
    order = chunk_order(-(-spec.rows // spec.chunk_rows), seed=spec.seed, epoch=epoch, shuffle=spec.shuffle)
    stream = np.concatenate([np.arange(c * spec.chunk_rows, min((c + 1) * spec.chunk_rows, spec.rows)) for c in order])
    if spec.redeal_every:  # the shares placed on the first segment's ranks (tests/core/behaviour/test_placement.py)
        placed = spec.stream(epoch, history[0].world_size)
        stream = expand(placed.pieces(0, placed.length))
    for index, past in enumerate(history):
        consumed = np.zeros(spec.rows, dtype=bool)
        rows = RunStream(np.stack([stream, stream + 1], axis=1))
        for rank in range(past.world_size):
            plan = spec.plan(epoch, Topology(rank, past.world_size, past.num_workers), stream=rows, segment=index)
            for batch in batches_of(spec, plan)[: past.batches]:
                consumed[batch[~np.isin(batch, plan.padding)]] = True
        stream = stream[~consumed[stream]]
    return stream


@SETTINGS
@given(resumes())
@example(  # a padded row yielded by the last rank while rank 0 still held it in its buffer (it stays to be read)
    (EpochSpec(7, 2, 1, False, seed=0, shuffle=True, buffer_chunks=1), 0, [(2, 0), (3, 1)], [0.75])
)
def test_the_remainder_equals_the_rows_no_rank_consumed(case):
    """What a resumed rank computes from its own share equals the whole-epoch account: every saved rank's
    batches replayed, a mark per row."""
    spec, epoch, topologies, fractions = case
    history = ()
    for (world, workers), fraction in zip(topologies[:-1], fractions, strict=True):
        batches = resumed_plan(spec, epoch, history, Topology(0, world, workers)).batches
        history += (Segment(world, workers, int(fraction * batches)),)
        stream = remaining_stream(spec, epoch, history)
        expected = mask_remainder(spec, epoch, history)
        assert stream.length == len(expected)
        np.testing.assert_array_equal(expand(stream.pieces(0, stream.length)), expected)
        cut = stream.length // 3  # any stretch, not only the whole
        np.testing.assert_array_equal(
            expand(stream.pieces(cut, stream.length - cut // 2)), expected[cut : stream.length - cut // 2]
        )


def test_a_rank_plans_and_resumes_in_what_it_reads():
    """One rank of 1,024 x 16 workers over 10^9 rows in 10^7 chunks, and a state from 64 x 4 ranks resumed
    on rank 5 of 48 x 2 over 10^8 rows: each rank's pieces (every worker's) within 64 MiB of Python
    allocations (the whole-epoch plan and resume held 458 and 216 MiB more)."""
    import tracemalloc

    tracemalloc.start()
    try:
        plan = epoch_plan(
            10**9, 100, seed=0, epoch=3, batch_size=64, drop_last=True, world_size=1024, rank=517, num_workers=16
        )
        assert sum(w.rows for w in plan.workers) == sum(
            len(w.pieces) and int(np.diff(w.pieces).sum()) for w in plan.workers
        )
        assert tracemalloc.get_traced_memory()[1] < 64 * 2**20
        tracemalloc.reset_peak()
        spec = EpochSpec(rows=10**8, chunk_rows=100, batch_size=64, drop_last=True, seed=1, buffer_chunks=8)
        half = 10**8 // (64 * 64) // 2
        plan = resumed_plan(spec, 2, (Segment(64, 4, half),), Topology(5, 48, 2))
        rows = sum(int(np.diff(w.pieces).sum()) for w in plan.workers)
        assert rows == plan.batches * 64
        assert tracemalloc.get_traced_memory()[1] < 64 * 2**20
    finally:
        tracemalloc.stop()


@settings(max_examples=150, deadline=None)
@given(
    chunks=st.integers(2, 12),
    chunk_rows=st.sampled_from([16, 100, 128]),
    saved_workers=st.integers(0, 3),
    buffer_chunks=st.integers(0, 8),
    batches=st.integers(1, 6),
    new_workers=st.integers(0, 3),
)
@example(chunks=8, chunk_rows=128, saved_workers=1, buffer_chunks=8, batches=4, new_workers=0)  # found by bench-peers
def test_a_resumed_piece_lies_in_one_chunk(chunks, chunk_rows, saved_workers, buffer_chunks, batches, new_workers):
    """The leftovers of two chunks that follow each other in the stream can be consecutive row ids across
    their boundary; a piece is read from one chunk, so the resumed plan cuts them there (it once made one
    piece of rows 249-256 of 128-row chunks, and the resumed loader failed to broadcast the rows it got)."""
    rows = chunks * chunk_rows
    spec = EpochSpec(
        rows=rows, chunk_rows=chunk_rows, batch_size=16, drop_last=True, seed=0, buffer_chunks=buffer_chunks
    )
    per_rank = spec.plan(0, Topology(0, 1, saved_workers)).workers
    if batches > sum(len(w.batch_sizes) for w in per_rank):
        return
    plan = resumed_plan(spec, 0, (Segment(1, saved_workers, batches),), Topology(0, 1, new_workers))
    for worker in plan.workers:
        crossing = [(a, b) for a, b in worker.pieces.tolist() if a // chunk_rows != (b - 1) // chunk_rows]
        assert not crossing, crossing


@pytest.mark.parametrize("saved_workers", [1, 2])
def test_resuming_with_no_workers_reads_every_row_once(tmp_path, saved_workers):
    """The case bench-peers ran into: 8 chunks of 128 rows, a full 8-chunk buffer, stopped after 4 batches
    with workers, continued in the main process: every row once, each with its own values."""
    path = tmp_path / "s.zarr"
    prepare_zarr({"x": np.arange(1024, dtype=np.float32)[:, None]}, path, chunk_rows=128, progress=False)

    def loader(workers):
        return ZarrDataLoader(
            ZarrIterableDataset(path, seed=0, return_index=True), batch_size=64, num_workers=workers, drop_last=True
        )

    first = loader(saved_workers)
    first.set_epoch(0)
    it = iter(first)
    before = [next(it) for _ in range(4)]
    state = first.state_dict()
    del it, first
    rest = loader(0)
    rest.load_state_dict(state)
    rest.set_epoch(0)
    batches = before + list(rest)
    index = np.concatenate([b["index"].numpy() for b in batches])
    assert np.array_equal(np.sort(index), np.arange(1024))
    assert all(np.array_equal(b["x"][:, 0].numpy(), b["index"].numpy()) for b in batches)


def test_a_piece_across_a_chunk_boundary_is_refused_not_misread(tmp_path):
    """The reader's guard behind the property above: a piece that is not inside one chunk is an error naming the
    rows, never a short or shifted read."""
    from zarrtorch._read.reader import PieceReader

    path = tmp_path / "s.zarr"
    prepare_zarr({"x": np.arange(256, dtype=np.float32)[:, None]}, path, chunk_rows=128, progress=False)
    ds = ZarrIterableDataset(path)
    reader = PieceReader(ds.arrays, 128, threads=1)
    assert np.array_equal(reader.read_piece(100, 128)["x"][:, 0], np.arange(100, 128))
    with pytest.raises(RuntimeError, match=r"\[120, 136\) as one piece, which is not inside one chunk"):
        reader.read_piece(120, 136)


@pytest.mark.parametrize("windows", [False, True])
def test_a_sample_yielded_only_as_padding_before_a_resume_is_yielded_unflagged_after(tmp_path, windows):
    """A padding copy (flagged with return_padding, left out of a metric) yielded before the state was saved,
    while its own rank had not yet reached the sample: the resumed plan took the sample as consumed, and it was
    never yielded unflagged, one of 23 gone from an evaluation resumed on 4 -> 3 ranks (found by a break-test
    helper). Every sample is now yielded unflagged exactly once over the two segments."""
    from zarrtorch.windows import Windows

    rows = 23
    prepare_zarr({"t": np.arange(rows, dtype=np.int64)}, tmp_path / "s.zarr", chunk_rows=4, progress=False)
    w = Windows(history=1, lead=1) if windows else None
    samples = list(range(rows - 1)) if windows else list(range(rows))

    def loader(world, rank, seed):
        ds = ZarrIterableDataset(
            tmp_path / "s.zarr", windows=w, return_index=True, return_padding=True, seed=seed, buffer_chunks=1
        )
        return ZarrDataLoader(ds, batch_size=2, rank=rank, world_size=world)

    for seed in range(3):
        for before, after in ((4, 3), (5, 2), (4, 1)):
            for take in range(len(loader(before, 0, seed))):
                kept = []
                loaders = [loader(before, r, seed) for r in range(before)]
                for it in map(iter, loaders):
                    for _ in range(take):
                        b = next(it)
                        kept += b["index"][~b["padding"]].tolist()
                state = loaders[0].state_dict()
                for r in range(after):
                    resumed = loader(after, r, seed)
                    resumed.load_state_dict(state)
                    for b in resumed:
                        kept += b["index"][~b["padding"]].tolist()
                assert sorted(kept) == samples, (seed, before, after, take)


def _saved_state(path) -> dict:
    loader = ZarrDataLoader(ZarrIterableDataset(path, seed=5, buffer_chunks=3), batch_size=16)
    it = iter(loader)
    next(it), next(it)
    return loader.state_dict()


def _write(path, x, names=("x", "y")):
    prepare_zarr({names[0]: x, names[1]: 10 * np.arange(ROWS, dtype=np.int64)}, path, chunk_rows=CHUNK, progress=False)
    return path


def test_a_state_is_refused_on_another_store_of_the_same_shape(tmp_path):
    """A state saved on one store loaded without a word on a store of the same shape with other values, and on
    one whose array had another name: the checkpoint held no trace of the data."""
    x = np.arange(ROWS, dtype=np.float32)[:, None].repeat(3, axis=1)
    state = _saved_state(_write(tmp_path / "a.zarr", x))
    other_values = ZarrDataLoader(
        ZarrIterableDataset(_write(tmp_path / "b.zarr", x + 1), seed=5, buffer_chunks=3), batch_size=16
    )
    with pytest.raises(ValueError, match=r"data: the first chunk of 'x' holds other values .*allow_other_data=True"):
        other_values.load_state_dict(state)
    renamed = ZarrDataLoader(
        ZarrIterableDataset(_write(tmp_path / "c.zarr", x, ("z", "y")), seed=5, buffer_chunks=3), batch_size=16
    )
    with pytest.raises(ValueError, match=r"arrays: saved \['x', 'y'\], now \['y', 'z'\]"):
        renamed.load_state_dict(state)
    copy = ZarrDataLoader(ZarrIterableDataset(_write(tmp_path / "d.zarr", x), seed=5, buffer_chunks=3), batch_size=16)
    copy.load_state_dict(state)  # the same data at another path resumes
    assert copy.batches_before() == 2
    other_values.load_state_dict(state, allow_other_data=True)  # a store rewritten on purpose: said explicitly
    assert other_values.batches_before() == 2
    assert state["data"] == copy.state_dict()["data"] and set(state["data"]) == {"x", "y"}


def test_a_state_resumes_whatever_the_cf_decoding_and_is_refused_when_a_static_array_changed(tmp_path):
    """A static array's fingerprint was a hash of its decoded values: a state saved with the default
    ReadOptions was refused after a switch to cf_dtype='float64' (or decode_cf=False) on the very same store,
    saying its first chunk "holds other values ... the store rewritten". It is the hash of the values as stored, as
    for the time arrays; an orography of other values is still refused, by name."""
    import xarray as xr

    from zarrtorch import ReadOptions, Windows

    def write(path, orog):
        ds = xr.Dataset({"x": (("time",), np.arange(ROWS, dtype=np.float32)), "orog": (("cell",), orog)})
        ds["orog"].encoding = {"dtype": "int16", "scale_factor": 0.1, "add_offset": 1000.0, "_FillValue": -32767}
        ds.to_zarr(str(path), mode="w", consolidated=False)
        return path

    def loader(path, **read):
        windows = Windows(history=1, lead=1, inputs=("x",), static=("orog",))
        ds = ZarrIterableDataset(path, windows=windows, seed=5, read=ReadOptions(**read))
        return ZarrDataLoader(ds, batch_size=8)

    orog = np.array([12.5, 800.0, np.nan])
    saved = loader(write(tmp_path / "a.zarr", orog))
    batches = iter(saved)
    next(batches), next(batches)
    state = saved.state_dict()
    for read in (dict(cf_dtype="float64"), dict(decode_cf=False)):
        resumed = loader(tmp_path / "a.zarr", **read)
        resumed.load_state_dict(state)
        assert resumed.batches_before() == 2
    other = loader(write(tmp_path / "b.zarr", orog + 1.0))
    with pytest.raises(ValueError, match=r"data: the first chunk of 'orog' holds other values"):
        other.load_state_dict(state)
