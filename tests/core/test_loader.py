"""ZarrDataLoader on real Zarr stores: what it yields equals the plan, rows stay paired, epochs reach
workers however they are started, resuming continues exactly, and every accepted source works.

``x`` rows encode their row number (``x[i].flat[k] == 6 * i + k``) and ``y[i] == 10 * i + 7``, so every batch
says which rows it holds and whether its arrays are paired.
"""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pytest
import torch
import zarr

from zarrtorch import Topology, ZarrDataLoader, ZarrIterableDataset, prepare_zarr

ROWS, CHUNK = 437, 20  # 22 chunks, the last one partial (17 rows)


def write_store(path, rows=ROWS, chunk=CHUNK):
    x = (6 * np.arange(rows, dtype=np.float32)[:, None] + np.arange(6, dtype=np.float32)).reshape(rows, 2, 3)
    y = 10 * np.arange(rows, dtype=np.int64) + 7
    return prepare_zarr({"x": x, "y": y}, path, chunk_rows=chunk, progress=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("loader") / "data.zarr"
    write_store(path)
    return path


def rows_of(batch) -> np.ndarray:
    """The row numbers a batch holds, after checking every array agrees on them."""
    x, y = batch["x"].numpy(), batch["y"].numpy()
    ids = (x[:, 0, 0] / 6).astype(np.int64)
    np.testing.assert_array_equal(x.reshape(len(x), -1), 6 * ids[:, None] + np.arange(6))
    np.testing.assert_array_equal(y, 10 * ids + 7)
    if "index" in batch:
        np.testing.assert_array_equal(batch["index"].numpy(), ids)
    return ids


def epoch_rows(loader, epoch=None) -> list[np.ndarray]:
    if epoch is not None:
        loader.set_epoch(epoch)
    return [rows_of(b) for b in loader]


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("drop_last", [True, False])
def test_output_equals_batch_row_ids(store, num_workers, drop_last):
    ds = ZarrIterableDataset(store, seed=3, buffer_chunks=3, return_index=True)
    world, batch = 2, 16
    seen = []
    for rank in range(world):
        loader = ZarrDataLoader(
            ds, batch_size=batch, drop_last=drop_last, num_workers=num_workers, rank=rank, world_size=world
        )
        got = epoch_rows(loader, epoch=1)
        expected = ds.batch_row_ids(
            epoch=1, rank=rank, world_size=world, num_workers=num_workers, batch_size=batch, drop_last=drop_last
        )
        assert same(got, expected)
        assert len(loader) == len(got)
        seen.extend(got)
    seen = np.concatenate(seen)
    if drop_last:
        assert len(np.unique(seen)) == len(seen) > ROWS - world * batch
    else:
        assert set(seen.tolist()) == set(range(ROWS)) and len(seen) - ROWS < world


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("num_workers,world,drop_last", [(0, 1, False), (2, 3, False), (2, 3, True), (3, 2, False)])
def test_len_is_exact(store, num_workers, world, drop_last):
    ds = ZarrIterableDataset(store, seed=0, buffer_chunks=2)
    for rank in range(world):
        loader = ZarrDataLoader(
            ds, batch_size=24, drop_last=drop_last, num_workers=num_workers, rank=rank, world_size=world
        )
        batches = list(loader)
        assert len(loader) == len(batches)
        sizes = [len(b["y"]) for b in batches]
        assert sizes[:-1] == [24] * (len(sizes) - 1)  # only the last batch may be partial
        if drop_last:
            assert sizes[-1] == 24


@pytest.mark.slow
def test_set_epoch_reaches_persistent_workers(store):
    ds = ZarrIterableDataset(store, seed=5, buffer_chunks=2)
    runs = {}
    for persistent in (False, True):
        loader = ZarrDataLoader(ds, batch_size=16, num_workers=2, persistent_workers=persistent)
        runs[persistent] = [epoch_rows(loader, epoch=e) for e in range(3)]
    for e in range(3):
        assert same(runs[True][e], runs[False][e])
        assert same(runs[True][e], ds.batch_row_ids(epoch=e, num_workers=2, batch_size=16, drop_last=False))
    assert not same(runs[True][0], runs[True][1]) and not same(runs[True][1], runs[True][2])


def test_set_epoch_forgotten_warns(store):
    loader = ZarrDataLoader(ZarrIterableDataset(store, seed=5), batch_size=64)
    first = epoch_rows(loader)
    with pytest.warns(UserWarning, match="set_epoch"):
        again = epoch_rows(loader)
    assert same(first, again)


@pytest.mark.slow
def test_main_process_iteration_changes_nothing(store):
    ds = ZarrIterableDataset(store, seed=9, buffer_chunks=2)
    expected = ds.batch_row_ids(epoch=2, num_workers=2, batch_size=16, drop_last=True)
    # iterate in the main process first: a loader without workers, and part of the worker loader's epoch
    main = ZarrDataLoader(ds, batch_size=16, drop_last=True, num_workers=0)
    assert len(epoch_rows(main, epoch=2)) == len(expected)
    loader = ZarrDataLoader(ds, batch_size=16, drop_last=True, num_workers=2)
    loader.set_epoch(2)
    assert len(loader) == len(expected)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert same(epoch_rows(loader), expected)
    # iterating the dataset itself without a loader is refused, and leaves no trace
    with pytest.raises(TypeError, match="ZarrDataLoader"):
        next(iter(ds))
    assert same(epoch_rows(loader, epoch=2), expected)


@pytest.mark.slow
def test_spawn_and_fork_workers_agree(store):
    ds = ZarrIterableDataset(store, seed=11, buffer_chunks=2)
    runs = []
    for context in ("fork", "spawn"):
        loader = ZarrDataLoader(
            ds,
            batch_size=16,
            drop_last=True,
            num_workers=2,
            rank=1,
            world_size=2,
            multiprocessing_context=context,
            persistent_workers=True,
        )
        runs.append([epoch_rows(loader, epoch=e) for e in (0, 1)])
    for e in (0, 1):
        assert same(runs[0][e], runs[1][e])
        assert same(
            runs[0][e], ds.batch_row_ids(epoch=e, rank=1, world_size=2, num_workers=2, batch_size=16, drop_last=True)
        )


# -- resuming -------------------------------------------------------------------------------------------


def _resume_case(store, num_workers, ks, *, drop_last, shuffle=True):
    ds = ZarrIterableDataset(store, seed=13, buffer_chunks=3, shuffle=shuffle)
    kw = dict(batch_size=8, drop_last=drop_last, num_workers=num_workers, rank=1, world_size=2)
    full = epoch_rows(ZarrDataLoader(ds, **kw), epoch=4)
    n = len(full)
    for k in ks:
        k = n if k is None else (k if k >= 0 else n + k)  # None: after the last batch
        first = ZarrDataLoader(ds, **kw)
        first.set_epoch(4)
        head = []
        if k:
            for batch in first:
                head.append(rows_of(batch))
                if len(head) == k:
                    break
        state = first.state_dict()
        resumed = ZarrDataLoader(ds, **kw)
        if k == n:  # a finished epoch is saved as the start of the next one
            assert state["epoch"] == 5 and state["batches_seen"] == 0
            resumed.load_state_dict(state)
            assert same(epoch_rows(resumed), epoch_rows(ZarrDataLoader(ds, **kw), epoch=5))
            continue
        assert state["epoch"] == 4 and state["batches_seen"] == k
        resumed.load_state_dict(state)
        resumed.set_epoch(4)  # Lightning calls set_epoch with the same epoch after restoring: keeps the position
        tail = epoch_rows(resumed)
        assert same(head + tail, full), f"resuming after {k} of {n} batches"
        # the next epoch is whole again
        assert same(epoch_rows(resumed, epoch=5), epoch_rows(ZarrDataLoader(ds, **kw), epoch=5))


@pytest.mark.parametrize("drop_last,shuffle", [(True, True), (False, True), (False, False)])
def test_resume_without_workers(store, drop_last, shuffle):
    # 0, during warm-up (buffer still filling), mid-buffer, the last batch, after the last batch
    _resume_case(store, 0, [0, 1, 3, 9, -1, None], drop_last=drop_last, shuffle=shuffle)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("num_workers,ks,drop_last", [(2, [0, 1, 4, 13, -1], True), (3, [2, 7, -2], False)])
def test_resume_with_workers(store, num_workers, ks, drop_last):
    # mid-round positions (k not a multiple of num_workers) included: the DataLoader restarts at worker 0
    _resume_case(store, num_workers, ks, drop_last=drop_last)


def test_resume_at_end_of_epoch(store):
    """A state saved once an epoch is over resumes into the next epoch, whole, whether set_epoch comes before
    the iterator (a training loop) or after it (Lightning builds the iterator first): it never trains 0 rows."""
    ds = ZarrIterableDataset(store, seed=13, buffer_chunks=3)
    fresh = epoch_rows(ZarrDataLoader(ds, batch_size=8, drop_last=True), epoch=3)
    for when in ("finished", "last batch taken"):
        loader = ZarrDataLoader(ds, batch_size=8, drop_last=True)
        if when == "finished":
            epoch_rows(loader, epoch=2)
        else:
            loader.set_epoch(2)
            it = iter(loader)
            for _ in range(len(loader)):
                next(it)
        state = loader.state_dict()
        assert (state["epoch"], state["batches_seen"]) == (3, 0)
        for set_epoch_first in (False, True):
            resumed = ZarrDataLoader(ds, batch_size=8, drop_last=True)
            resumed.load_state_dict(state)
            if set_epoch_first:
                resumed.set_epoch(3)
            assert same(epoch_rows(resumed), fresh)


@pytest.mark.parametrize(
    "change,saved_as",
    [
        (dict(batch_size=16), "batch_size: saved 8, now 16"),
        (dict(drop_last=False), "drop_last: saved True, now False"),
    ],
)
def test_resume_with_other_settings_refused(store, change, saved_as):
    """Another world size or worker count is an elastic resume (tests/core/test_resume.py); another batch
    size or drop_last is refused, naming the setting."""
    ds = ZarrIterableDataset(store, seed=13)
    kw = dict(batch_size=8, drop_last=True, num_workers=0, rank=1, world_size=2)
    loader = ZarrDataLoader(ds, **kw)
    next(iter(loader))
    state = loader.state_dict()
    other = ZarrDataLoader(ds, **{**kw, **change})
    with pytest.raises(ValueError, match="cannot resume") as err:
        other.load_state_dict(state)
    assert saved_as in str(err.value)


def test_resume_refused_on_other_data(store, tmp_path):
    ds = ZarrIterableDataset(store, seed=13)
    loader = ZarrDataLoader(ds, batch_size=8, rank=0, world_size=1)
    next(iter(loader))
    state = loader.state_dict()
    other = ZarrIterableDataset(write_store(tmp_path / "other.zarr", rows=ROWS + 1))
    with pytest.raises(ValueError, match=f"rows: saved {ROWS}, now {ROWS + 1}"):
        ZarrDataLoader(other, batch_size=8, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed: saved 13, now 14"):
        ZarrDataLoader(ZarrIterableDataset(store, seed=14), batch_size=8, rank=0, world_size=1).load_state_dict(state)


def test_resume_refused_on_another_row_window(store):
    """The row window is part of the signature: a state saved on one window does not resume another one of
    the same length (same rows and chunk_rows, other offset), nor the whole store."""
    kw = dict(batch_size=8, rank=0, world_size=1)
    ds = ZarrIterableDataset(store, seed=13, row_range=(2 * CHUNK, 8 * CHUNK))
    loader = ZarrDataLoader(ds, **kw)
    next(iter(loader))
    state = loader.state_dict()
    assert (state["spec"]["row_offset"], state["spec"]["rows"]) == (2 * CHUNK, 6 * CHUNK)
    shifted = ZarrIterableDataset(store, seed=13, row_range=(4 * CHUNK, 10 * CHUNK))
    with pytest.raises(ValueError, match=f"row_offset: saved {2 * CHUNK}, now {4 * CHUNK}"):
        ZarrDataLoader(shifted, **kw).load_state_dict(state)
    with pytest.raises(ValueError, match=f"rows: saved {6 * CHUNK}, now {ROWS}"):
        ZarrDataLoader(ZarrIterableDataset(store, seed=13), **kw).load_state_dict(state)
    same_window = ZarrDataLoader(ZarrIterableDataset(store, seed=13, row_range=(2 * CHUNK, 8 * CHUNK)), **kw)
    same_window.load_state_dict(state)  # accepted
    rest = np.concatenate(epoch_rows(same_window))
    assert rest.min() >= 2 * CHUNK and rest.max() < 8 * CHUNK
    # a dict that is not a whole state (a key missing) is refused, naming the key
    whole = ZarrDataLoader(ZarrIterableDataset(store, seed=13), **kw)
    partial = {k: v for k, v in whole.state_dict().items() if k != "batches_seen"}
    with pytest.raises(ValueError, match=r"keys \['batches_seen'\] are missing"):
        ZarrDataLoader(ZarrIterableDataset(store, seed=13), **kw).load_state_dict(partial)
    spec = whole.state_dict()["spec"]
    no_offset = {**whole.state_dict(), "spec": {k: v for k, v in spec.items() if k != "row_offset"}}
    with pytest.raises(ValueError, match=r"'spec' must hold \[.*'row_offset'"):
        ZarrDataLoader(ZarrIterableDataset(store, seed=13), **kw).load_state_dict(no_offset)


def test_resume_applied_when_topology_is_known(store):
    """Without a process group, a state is applied when iteration starts (once the topology is known): saved
    on 2 ranks after one batch each, resumed on 1, the rest is every row the 2 ranks had not consumed."""
    ds = ZarrIterableDataset(store, seed=13, return_index=True)
    saved = ZarrDataLoader(ds, batch_size=8, rank=1, world_size=2)
    next(iter(saved))
    loader = ZarrDataLoader(ds, batch_size=8)  # world size 1 from torch.distributed (not initialised)
    loader.load_state_dict(saved.state_dict())
    consumed = np.concatenate(
        [ds.batch_row_ids(epoch=0, rank=r, world_size=2, batch_size=8, drop_last=False)[0] for r in (0, 1)]
    )
    rest = np.concatenate(epoch_rows(loader))
    assert not set(rest.tolist()) & set(consumed.tolist())
    assert sorted(rest.tolist() + consumed.tolist()) == list(range(ROWS))
    with pytest.raises(ValueError, match="batch_size: saved 8, now 4"):
        other = ZarrDataLoader(ds, batch_size=4)
        other.load_state_dict(saved.state_dict())
        iter(other)


# -- cached mode ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_cache_freezes_rows_and_reads_once(store, tmp_path, num_workers):
    path = tmp_path / "copy.zarr"
    shutil.copytree(store, path)
    world, rank = 2, 0
    cached = ZarrIterableDataset(path, seed=17, buffer_chunks=2, keep_in_memory=True)
    plain = ZarrIterableDataset(path, seed=17, buffer_chunks=2)
    kw = dict(batch_size=16, drop_last=True, num_workers=num_workers, rank=rank, world_size=world)
    loader = ZarrDataLoader(cached, persistent_workers=num_workers > 0, **kw)
    epochs = [epoch_rows(loader, epoch=0)]
    shutil.rmtree(path)  # later epochs must come from the processes' memory
    epochs += [epoch_rows(loader, epoch=e) for e in (1, 2)]
    uncached0 = epoch_rows(ZarrDataLoader(ZarrIterableDataset(store, seed=17, buffer_chunks=2), **kw), epoch=0)
    # the rows of epoch 0 are those of the uncached epoch 0 (in another order: pieces are shuffled too)
    for e, rows in enumerate(epochs):
        assert same(
            rows,
            cached.batch_row_ids(
                epoch=e, rank=rank, world_size=world, num_workers=num_workers, batch_size=16, drop_last=True
            ),
        )
        np.testing.assert_array_equal(np.sort(np.concatenate(rows)), np.sort(np.concatenate(uncached0)))
    assert not same(epochs[0], epochs[1]) and not same(epochs[1], epochs[2])  # the order still changes
    # whereas without the cache the partition itself changes between epochs
    plain_1 = plain.batch_row_ids(
        epoch=1, rank=rank, world_size=world, num_workers=num_workers, batch_size=16, drop_last=True
    )
    assert set(np.concatenate(plain_1).tolist()) != set(np.concatenate(uncached0).tolist())


def test_cache_with_workers_needs_persistent_workers(store):
    with pytest.raises(ValueError, match="persistent_workers=True"):
        ZarrDataLoader(ZarrIterableDataset(store, keep_in_memory=True), batch_size=8, num_workers=2)


# -- order, shards, sources -----------------------------------------------------------------------------


def test_no_shuffle_yields_rows_in_order(store):
    ds = ZarrIterableDataset(store, shuffle=False)
    for epoch in (0, 1):
        got = epoch_rows(ZarrDataLoader(ds, batch_size=30), epoch=epoch)
        np.testing.assert_array_equal(np.concatenate(got), np.arange(ROWS))
    per_rank = -(-ROWS // 3)
    for rank in range(3):
        got = np.concatenate(epoch_rows(ZarrDataLoader(ds, batch_size=30, rank=rank, world_size=3)))
        np.testing.assert_array_equal(got, np.arange(rank * per_rank, (rank + 1) * per_rank) % ROWS)


def test_no_shuffle_with_workers(store):
    ds = ZarrIterableDataset(store, shuffle=False)
    got = epoch_rows(ZarrDataLoader(ds, batch_size=30, num_workers=2))
    assert same(got, ds.batch_row_ids(epoch=0, num_workers=2, batch_size=30, drop_last=False))
    for rows in got:  # each batch is a run of consecutive rows
        np.testing.assert_array_equal(rows, np.arange(rows[0], rows[0] + len(rows)))
    np.testing.assert_array_equal(np.sort(np.concatenate(got)), np.arange(ROWS))


# -- chunk order only (buffer_chunks=0) ---------------------------------------------------------------------


def _runs_inside_chunks(rows: np.ndarray) -> list[np.ndarray]:
    """Cut a worker's stream at chunk boundaries: every piece must be a run of consecutive rows."""
    breaks = np.nonzero(rows[1:] // CHUNK != rows[:-1] // CHUNK)[0] + 1
    runs = np.split(rows, breaks)
    for run in runs:
        np.testing.assert_array_equal(run, np.arange(run[0], run[0] + len(run)))  # in order inside the chunk
    return runs


@pytest.mark.parametrize(
    "num_workers", [0, pytest.param(2, marks=pytest.mark.filterwarnings("ignore:This DataLoader will create"))]
)
@pytest.mark.parametrize("drop_last", [True, False])
def test_chunk_order_only_matches_batch_row_ids(store, num_workers, drop_last):
    ds = ZarrIterableDataset(store, seed=4, buffer_chunks=0, return_index=True)
    assert ds.buffer_rows == 0
    world, batch = 2, 16
    seen = []
    for rank in range(world):
        loader = ZarrDataLoader(
            ds, batch_size=batch, drop_last=drop_last, num_workers=num_workers, rank=rank, world_size=world
        )
        got = epoch_rows(loader, epoch=2)
        expected = ds.batch_row_ids(
            epoch=2, rank=rank, world_size=world, num_workers=num_workers, batch_size=batch, drop_last=drop_last
        )
        assert same(got, expected) and len(loader) == len(got)
        # each worker's stream: increasing runs inside chunks, in the plan's chunk order
        plan = loader.spec.plan(2, Topology(rank, world, loader.num_workers))
        for w in plan.workers:
            first = w.first_batch
            stream = np.concatenate(got[first : first + len(w.batch_sizes)]) if num_workers == 0 else None
            if stream is None:  # the DataLoader interleaves workers round-robin: take this worker's batches
                from zarrtorch.plan import round_robin_order

                order = round_robin_order([len(x.batch_sizes) for x in plan.workers])
                stream = np.concatenate([b for b, owner in zip(got, order, strict=True) if owner == w.worker])
            np.testing.assert_array_equal(stream, np.concatenate([np.arange(a, b) for a, b in w.pieces]))
            runs = _runs_inside_chunks(stream)
            assert len(runs) >= 2
        seen.extend(got)
    seen = np.concatenate(seen)
    if drop_last:
        assert len(np.unique(seen)) == len(seen)
    else:
        assert set(seen.tolist()) == set(range(ROWS))


def test_chunk_order_only_changes_chunk_order_every_epoch(store):
    ds = ZarrIterableDataset(store, seed=4, buffer_chunks=0)
    loader = ZarrDataLoader(ds, batch_size=10, drop_last=False)
    orders = []
    for epoch in range(3):
        rows = np.concatenate(epoch_rows(loader, epoch=epoch))
        runs = _runs_inside_chunks(rows)
        assert all(len(r) == min(CHUNK, ROWS - r[0]) for r in runs)  # whole chunks, each in time order
        orders.append(tuple(int(r[0]) // CHUNK for r in runs))
        assert sorted(orders[-1]) == list(range(-(-ROWS // CHUNK)))
    assert len(set(orders)) == 3, "a new chunk order every epoch"
    assert orders[0] != tuple(range(-(-ROWS // CHUNK)))
    # no buffer memory, unlike buffer_chunks >= 1
    buffered = ZarrIterableDataset(store, seed=4, buffer_chunks=2)
    assert buffered.worker_memory_bytes() - ds.worker_memory_bytes() == 2 * CHUNK * ds.row_bytes
    assert ds.worker_memory_bytes() == ZarrIterableDataset(store, shuffle=False).worker_memory_bytes()


def test_chunk_order_only_in_a_row_window_resumes(store):
    ds = ZarrIterableDataset(store, seed=6, buffer_chunks=0, row_range=(3 * CHUNK, ROWS))
    kw = dict(batch_size=8, drop_last=True)
    full = epoch_rows(ZarrDataLoader(ds, **kw), epoch=1)
    assert np.concatenate(full).min() >= 3 * CHUNK
    first = ZarrDataLoader(ds, **kw)
    first.set_epoch(1)
    head = []
    for batch in first:
        head.append(rows_of(batch))
        if len(head) == 5:
            break
    resumed = ZarrDataLoader(ds, **kw)
    resumed.load_state_dict(first.state_dict())
    assert same(head + epoch_rows(resumed), full)


def _sharded_group(path, rows=ROWS, shard=40, inner=10):
    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    x = (6 * np.arange(rows, dtype=np.float32)[:, None] + np.arange(6, dtype=np.float32)).reshape(rows, 2, 3)
    y = 10 * np.arange(rows, dtype=np.int64) + 7
    for name, data in (("x", x), ("y", y)):
        a = g.create_array(
            name, shape=data.shape, dtype=data.dtype, chunks=(inner, *data.shape[1:]), shards=(shard, *data.shape[1:])
        )
        a[:] = data
    return g


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sharded_store_streams_every_row_once_by_default(tmp_path, num_workers):
    """A Zarr v3 sharded store, refused until the shard became the unit by default (issue 43), streams every row
    once with no setting: 437 rows in shards of 40 rows of 10-row inner chunks, the last shard partial (37 rows)
    and its last inner chunk too (7 rows); the values are zarr's."""
    g = _sharded_group(tmp_path / "sharded.zarr")
    assert ROWS % 40 == 37 and ROWS % 40 % 10 == 7
    ds = ZarrIterableDataset(g, seed=1, buffer_chunks=2, return_index=True)
    batches = list(ZarrDataLoader(ds, batch_size=16, num_workers=num_workers))
    index = np.concatenate([b["index"].numpy() for b in batches])
    np.testing.assert_array_equal(np.sort(index), np.arange(ROWS))
    for name in ("x", "y"):
        np.testing.assert_array_equal(np.concatenate([b[name].numpy() for b in batches]), g[name][...][index])


def test_the_shard_is_the_unit_read_and_distributed(tmp_path):
    g = _sharded_group(tmp_path / "sharded.zarr")
    ds = ZarrIterableDataset(g, seed=1, buffer_chunks=2)
    assert ds.chunk_rows == 40 and ds.layout.sharded
    plan = ds.plan(epoch=1, batch_size=16, drop_last=False, world_size=2, rank=0)
    pieces = np.concatenate([w.pieces for w in plan.workers])
    assert (pieces[:, 0] // 40 == (pieces[:, 1] - 1) // 40).all()  # the shard is the unit
    assert (pieces[1:-1, 0] % 40 == 0).all()  # whole shards inside the rank's slice
    for rank in range(2):
        got = epoch_rows(ZarrDataLoader(ds, batch_size=16, rank=rank, world_size=2), epoch=1)
        assert same(
            got, ds.batch_row_ids(epoch=1, rank=rank, world_size=2, num_workers=0, batch_size=16, drop_last=False)
        )


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_xarray_written_store(tmp_path, zarr_format):
    xr = pytest.importorskip("xarray")
    n, ny, nx = 137, 3, 4
    t = np.arange(n)
    temp = 6 * t[:, None, None].astype(np.float32) + np.arange(ny * nx, dtype=np.float32).reshape(1, ny, nx)
    ds = xr.Dataset(
        {
            "temp": (("time", "lat", "lon"), temp),
            "rain": (("time", "lat", "lon"), -temp),
            # static, larger than the data, first dimension lat: it must not make lat the sample axis
            "orography": (("lat", "lon", "level"), np.ones((ny, nx, 400), np.float64)),
        },
        coords={
            "time": t.astype("i8"),
            "lat": np.arange(ny, dtype="f8"),
            "lon": np.arange(nx, dtype="f8"),
            "station": ("time", t * 10),
            "area": (("lat", "lon"), np.ones((ny, nx))),
        },
        attrs={"title": "test"},
    )
    enc = {v: {"chunks": (25, ny, nx)} for v in ("temp", "rain")}
    enc["station"] = {"chunks": (25,)}
    path = tmp_path / "xr.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(path, encoding=enc, zarr_format=zarr_format, consolidated=zarr_format == 2)
    dataset = ZarrIterableDataset(str(path), seed=2, buffer_chunks=2, return_index=True)
    assert sorted(dataset.arrays) == ["rain", "temp"]  # coordinates and the static field are left out
    assert dataset.rows == n and dataset.chunk_rows == 25
    seen = []
    for batch in ZarrDataLoader(dataset, batch_size=10):
        idx = batch["index"].numpy()
        np.testing.assert_array_equal(batch["temp"].numpy(), temp[idx])
        np.testing.assert_array_equal(batch["rain"].numpy(), -temp[idx])
        seen.append(idx)
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(n))


def test_path_mapping_and_group_sources(store):
    g = zarr.open_group(str(store), mode="r")
    expected = ZarrIterableDataset(g, seed=4).batch_row_ids(epoch=1, batch_size=32, drop_last=True)
    for source in (str(store), store, {"x": g["x"], "y": g["y"]}):
        ds = ZarrIterableDataset(source, seed=4)
        assert sorted(ds.arrays) == ["x", "y"]
        assert same(epoch_rows(ZarrDataLoader(ds, batch_size=32, drop_last=True), epoch=1), expected)
    only_y = ZarrIterableDataset(store, variables=["y"], seed=4, return_index=True)
    for batch in ZarrDataLoader(only_y, batch_size=32):
        assert set(batch) == {"y", "index"}
        np.testing.assert_array_equal(batch["y"].numpy(), 10 * batch["index"].numpy() + 7)


def test_return_index_and_dtypes(store):
    plain = next(iter(ZarrDataLoader(ZarrIterableDataset(store), batch_size=8)))
    assert set(plain) == {"x", "y"}
    assert plain["x"].dtype == torch.float32 and plain["y"].dtype == torch.int64 and plain["x"].shape == (8, 2, 3)
    indexed = next(iter(ZarrDataLoader(ZarrIterableDataset(store, return_index=True), batch_size=8)))
    assert set(indexed) == {"x", "y", "index"} and indexed["index"].dtype == torch.int64
    rows_of(indexed)


def test_transform_runs_on_batches(store):
    ds = ZarrIterableDataset(store, transform=_scale_x, return_index=True)
    for batch in ZarrDataLoader(ds, batch_size=50):
        np.testing.assert_array_equal(batch["x"][:, 0, 0].numpy(), 12 * batch["index"].numpy())


def _scale_x(batch):
    return {**batch, "x": batch["x"] * 2}


@pytest.mark.slow
def test_persistent_workers_stop_cleanly(store):
    """Dropping the loader stops its persistent workers at once: no reference cycle leaves them to the
    garbage collector, which would close their queues first and make DataLoader wait 5 s per worker and
    then kill it."""
    import gc
    import weakref

    loader = ZarrDataLoader(ZarrIterableDataset(store), batch_size=64, num_workers=2, persistent_workers=True)
    epoch_rows(loader, epoch=0)
    epoch_rows(loader, epoch=1)
    workers = list(loader._iterator._workers)
    ref = weakref.ref(loader)
    gc.disable()
    try:
        del loader
        assert ref() is None  # freed by reference counting alone
        assert [w.is_alive() for w in workers] == [False, False]
    finally:
        gc.enable()


def test_sampler_forwards_set_epoch(store):
    """Lightning calls set_epoch on ``loader.sampler``: it must reach the loader."""
    ds = ZarrIterableDataset(store, seed=21, buffer_chunks=2)
    loader = ZarrDataLoader(ds, batch_size=32)
    loader.sampler.set_epoch(4)
    assert loader.epoch == 4
    assert same(epoch_rows(loader), ds.batch_row_ids(epoch=4, batch_size=32, drop_last=False))


def test_no_warning_without_shuffle(store):
    """Iterating again without set_epoch only warns when there is a shuffle to repeat (not for evaluation)."""
    import warnings

    loader = ZarrDataLoader(ZarrIterableDataset(store, shuffle=False), batch_size=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert same(epoch_rows(loader), epoch_rows(loader))


def test_set_epoch_warns_of_a_late_call_only_while_the_iteration_can_go_on(store):
    """set_epoch after an iteration's first batches warns that the iteration keeps its epoch; after a break
    (the iterator dropped) nothing goes on, and the warning once said it did."""
    loader = ZarrDataLoader(ZarrIterableDataset(store, seed=1), batch_size=32)
    for _ in loader:
        break
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.set_epoch(1)
    first = [rows_of(b) for b in loader]
    assert sorted(np.concatenate(first).tolist()) == list(range(ROWS))
    loader.set_epoch(2)
    held = iter(loader)
    next(held)
    with pytest.warns(UserWarning, match=r"set_epoch\(3\) came after the iteration over epoch 2 began"):
        loader.set_epoch(3)


def test_a_late_set_epoch_warns_at_the_first_batch_of_an_iterator_that_had_yielded_none(store):
    """Lightning, resumed after a validation, builds a validation iterator of the old epoch, draws nothing from it,
    then sets the next epoch: the loader warned "set_epoch(1) came after the iteration over epoch 0 began" though
    no batch of epoch 0 was ever handed out. Nothing is said for an iterator that yields nothing; one drawn from
    after the late call still says it."""
    loader = ZarrDataLoader(ZarrIterableDataset(store, seed=1), batch_size=32)
    unused = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.set_epoch(1)
    assert unused is not None
    drawn = iter(loader)
    loader.set_epoch(2)
    with pytest.warns(UserWarning, match=r"set_epoch\(2\) came after the iteration over epoch 1 began"):
        next(drawn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len([rows_of(b) for b in drawn]) == len(loader) - 1  # said once, at its first batch


def test_set_epoch_after_an_iteration_that_yielded_its_every_batch_does_not_warn(store):
    """Lightning's validation loop takes exactly ``len()`` batches (never the end) and keeps the iterator; its
    next ``set_epoch`` warned "came after the iteration over epoch 0 began" every epoch for a validation of 1 or 2
    batches (a MixedDataModule's small source), though that iteration was over."""
    loader = ZarrDataLoader(ZarrIterableDataset(store, shuffle=False), batch_size=ROWS // 2, drop_last=True)
    held = iter(loader)
    assert len([next(held) for _ in range(len(loader))]) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.set_epoch(1)


@pytest.mark.parametrize("transport", ["ring", "queue"])
def test_rows_kept_in_memory_with_padding_flags_through_workers(tmp_path, transport):
    """``keep_in_memory=True`` + ``return_padding=True`` + a shuffle buffer + workers failed with ``KeyError:
    'padding'`` in the worker (the batch slot's padding column was looked up among the stored arrays)."""
    path = tmp_path / "s.zarr"
    prepare_zarr({"x": np.arange(100, dtype=np.float32)}, path, chunk_rows=10, progress=False)
    seen = []
    for rank in range(3):
        ds = ZarrIterableDataset(path, keep_in_memory=True, return_padding=True, buffer_chunks=2, return_index=True)
        loader = ZarrDataLoader(
            ds,
            batch_size=8,
            num_workers=2,
            persistent_workers=True,
            rank=rank,
            world_size=3,
            transport=transport,
            multiprocessing_context="fork",
        )
        for epoch in range(2):
            loader.set_epoch(epoch)
            rows = [b for b in loader]
            for b in rows:
                np.testing.assert_array_equal(b["x"].numpy(), b["index"].numpy())
            if epoch == 0:
                seen += [(int(i), bool(p)) for b in rows for i, p in zip(b["index"], b["padding"], strict=True)]
    real = [i for i, padded in seen if not padded]
    assert sorted(real) == list(range(100))  # every row once unflagged; the flagged ones only even out the ranks
    assert 0 < len(seen) - len(real) < 3
