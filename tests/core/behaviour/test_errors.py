"""Every bad input gets an error that names the array (or path, or argument) and says what to do instead.

Worker-process cases run with DataLoader's ``timeout=`` so that an error lost in a worker fails the test
instead of hanging it.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import zarr

from zarrtorch import (
    ChunkReadError,
    LayoutError,
    ReadOptions,
    ZarrDataLoader,
    ZarrIterableDataset,
    check_first_axis_layout,
    prepare_zarr,
)
from zarrtorch.buffer import schedule


def group_with(path, **arrays):
    """A Zarr v3 group holding arrays given as (data, chunks)."""
    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    for name, (data, chunks) in arrays.items():
        a = g.create_array(name, shape=data.shape, dtype=data.dtype, chunks=chunks)
        if data.size:
            a[:] = data
    return zarr.open_group(str(path), mode="r")


@pytest.fixture()
def store(tmp_path):
    rows = 230
    x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    y = np.arange(rows, dtype=np.int64)
    path = tmp_path / "ok.zarr"
    prepare_zarr({"x": x, "y": y}, path, chunk_rows=20, progress=False)
    return path


# -- layout ---------------------------------------------------------------------------------------------


def test_chunked_along_another_axis(tmp_path):
    g = group_with(tmp_path / "a.zarr", x=(np.zeros((100, 6), "f4"), (10, 2)), y=(np.zeros(100, "i8"), (10,)))
    with pytest.raises(LayoutError) as err:
        ZarrIterableDataset(g)
    msg = str(err.value)
    assert "'x'" in msg and "axis 1" in msg and "(10, 6)" in msg and "prepare_zarr" in msg


def test_arrays_of_different_lengths(tmp_path):
    g = group_with(tmp_path / "a.zarr", x=(np.zeros((100, 2), "f4"), (10, 2)), y=(np.zeros(90, "i8"), (10,)))
    with pytest.raises(LayoutError, match="different first-axis lengths") as err:
        ZarrIterableDataset(g)
    assert "'x' has 100 rows" in str(err.value) and "'y' has 90" in str(err.value)


def test_equal_chunk_counts_different_chunk_lengths(tmp_path):
    # 100 rows in chunks of 10 and of 11: ten chunks each, but chunk i holds other rows in each array
    g = group_with(tmp_path / "a.zarr", x=(np.zeros((100, 2), "f4"), (10, 2)), y=(np.zeros(100, "i8"), (11,)))
    assert g["x"].nchunks == g["y"].nchunks
    with pytest.raises(LayoutError, match="different chunk lengths") as err:
        ZarrIterableDataset(g)
    msg = str(err.value)
    assert "'x' uses 10" in msg and "'y' uses 11" in msg and "chunk_rows" in msg and "prepare_zarr" in msg


def test_zero_rows(tmp_path):
    g = group_with(tmp_path / "a.zarr", x=(np.zeros((0, 3), "f4"), (10, 3)))
    with pytest.raises(LayoutError, match=r"array 'x' has zero rows"):
        ZarrIterableDataset(g)
    with pytest.raises(LayoutError, match="zero rows"):
        prepare_zarr({"x": np.zeros((0, 3))}, tmp_path / "b.zarr", progress=False)


def test_scalar_array(tmp_path):
    g = zarr.open_group(str(tmp_path / "a.zarr"), mode="w", zarr_format=3)
    g.create_array("s", shape=(), dtype="f4")
    with pytest.raises(LayoutError, match="'s' is a scalar"):
        check_first_axis_layout({"s": g["s"]})


# -- sizes and arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3])
def test_too_few_rows_for_every_rank_to_get_a_batch(store, world):
    ds = ZarrIterableDataset(store)
    batch = 230 // world + 1  # world * batch > 230 rows
    for rank in range(world):  # every rank refuses, none starts an epoch with zero batches
        loader = ZarrDataLoader(ds, batch_size=batch, drop_last=True, rank=rank, world_size=world)
        for attempt in (iter, len):
            with pytest.raises(ValueError) as err:
                attempt(loader)
            msg = str(err.value)
            assert "230 rows" in msg and f"{world} rank" in msg and "drop_last=False" in msg
        assert len(ZarrDataLoader(ds, batch_size=batch, drop_last=False, rank=rank, world_size=world)) >= 1


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, True, None])
def test_bad_batch_size(store, batch_size):
    with pytest.raises(ValueError, match="batch_size must be a whole number >= 1"):
        ZarrDataLoader(ZarrIterableDataset(store), batch_size=batch_size)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(shuffle=True), "shuffle= is not used"),
        (dict(sampler=[1, 2]), "sampler= is not used"),
        (dict(in_order=False), "in_order=False"),
        (dict(rank=0), "give both rank and world_size"),
        (dict(rank=2, world_size=2), r"rank must be a whole number in \[0, 2\)"),
    ],
)
def test_bad_loader_arguments(store, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        ZarrDataLoader(ZarrIterableDataset(store), batch_size=4, **kwargs)


def test_bad_dataset_arguments(store):
    with pytest.raises(ValueError, match=r"seed \(shared by every process\) must be a whole number"):
        ZarrIterableDataset(store, seed=1.5)
    with pytest.raises(ValueError, match=r"buffer_chunks .*must be a whole number >= 0"):
        ZarrIterableDataset(store, buffer_chunks=-1)
    with pytest.raises(ValueError, match=r"buffer_chunks .*must be a whole number >= 0"):
        ZarrIterableDataset(store, buffer_chunks=1.5)
    with pytest.raises(ValueError, match="decode_threads must be an integer >= 1"):
        ZarrIterableDataset(store, read=ReadOptions(decode_threads=0))
    with pytest.raises(TypeError, match="needs a zarrtorch.ZarrIterableDataset"):
        ZarrDataLoader([1, 2, 3], batch_size=2)


def test_unknown_array_name(store):
    with pytest.raises(KeyError) as err:
        ZarrIterableDataset(store, variables=["x", "z"])
    assert "'z'" in str(err.value) and "'x'" in str(err.value) and "'y'" in str(err.value)  # lists what exists
    g = zarr.open_group(str(store), mode="r")
    with pytest.raises(KeyError, match="'z'"):
        ZarrIterableDataset({"x": g["x"]}, variables=["z"])


# -- sources --------------------------------------------------------------------------------------------


def test_not_zarr(store):
    with pytest.raises(TypeError) as err:
        ZarrIterableDataset(np.zeros((10, 3)))
    assert "ndarray" in str(err.value) and "prepare_zarr" in str(err.value)
    with pytest.raises(TypeError) as err:
        ZarrIterableDataset({"x": np.zeros((10, 3)), "y": np.zeros(10)})
    assert "'x'" in str(err.value) and "ndarray" in str(err.value) and "prepare_zarr" in str(err.value)
    with pytest.raises(TypeError, match="prepare_zarr"):
        ZarrIterableDataset(12)


def test_missing_store_path(tmp_path):
    missing = tmp_path / "nowhere.zarr"
    with pytest.raises(FileNotFoundError) as err:
        ZarrIterableDataset(str(missing))
    assert str(missing) in str(err.value) and "prepare_zarr" in str(err.value)


def test_path_that_is_not_a_store(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("hello")
    with pytest.raises((ValueError, TypeError, LayoutError)) as err:
        ZarrIterableDataset(tmp_path / "plain")
    assert "plain" in str(err.value) or "no arrays" in str(err.value)


# -- chunks missing or corrupt at read time -------------------------------------------------------------


def _chunk_file(store, name, chunk):
    path = store / name / "c" / str(chunk)
    while path.is_dir():
        path = path / "0"
    assert path.is_file(), path
    return path


def _read_all(loader):
    return [b for b in loader]


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_missing_chunk(store, num_workers):
    _chunk_file(store, "x", 3).unlink()
    ds = ZarrIterableDataset(store, seed=1)
    loader = ZarrDataLoader(ds, batch_size=16, num_workers=num_workers, timeout=120 if num_workers else 0)
    with pytest.raises(ChunkReadError) as err:
        _read_all(loader)
    msg = str(err.value)
    assert "missing chunk 3 (rows 60:80" in msg and "array 'x'" in msg and "x/c/3/0" in msg
    assert "ReadOptions(missing_chunks='fill')" in msg and "prepare_zarr" in msg and "fill value 0.0" in msg
    # opting out reads the fill value, as Zarr does
    rows = _read_all(
        ZarrDataLoader(
            ZarrIterableDataset(store, seed=1, return_index=True, read=ReadOptions(missing_chunks="fill")),
            batch_size=16,
            num_workers=num_workers,
            timeout=120 if num_workers else 0,
        )
    )
    x = np.concatenate([b["x"].numpy() for b in rows])
    idx = np.concatenate([b["index"].numpy() for b in rows])
    assert (x[(idx >= 60) & (idx < 80)] == 0).all() and (x[idx >= 80] != 0).any()


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True])
def test_workers_stop_after_an_error(store, persistent):
    """A worker's error stops the workers at once, not whenever the garbage collector reaches the
    iterator; a persistent loader works again once the chunk is repaired, and is then freed as usual."""
    import gc
    import weakref

    def run():
        path = _chunk_file(store, "x", 4)
        good = path.read_bytes()
        path.unlink()
        loader = ZarrDataLoader(
            ZarrIterableDataset(store, seed=1), batch_size=16, num_workers=2, timeout=120, persistent_workers=persistent
        )
        it = iter(loader)
        workers = it.workers
        with pytest.raises(ChunkReadError, match="missing chunk 4"):
            for _ in it:
                pass
        assert [w.exitcode is not None for w in workers] == [True, True]  # stopped already (normally: 0)
        path.write_bytes(good)
        assert sum(len(b["y"]) for b in loader) == 230
        return weakref.ref(loader)

    gc.disable()
    try:
        ref = run()
        assert ref() is None  # no reference cycle through the error keeps the loader and its new workers
    finally:
        gc.enable()


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_corrupt_chunk(store, num_workers):
    _chunk_file(store, "y", 5).write_bytes(b"this is not zstd data" * 3)
    loader = ZarrDataLoader(
        ZarrIterableDataset(store, seed=1), batch_size=16, num_workers=num_workers, timeout=120 if num_workers else 0
    )
    with pytest.raises(ChunkReadError) as err:
        _read_all(loader)
    msg = str(err.value)
    assert re.search(r"cannot read chunk 5 \(rows 100:120\) of array 'y'", msg) and "y/c/5" in msg


@pytest.mark.parametrize("damage", ["delete", "garbage"])
def test_bad_chunk_when_resuming(store, damage):
    """The rows in the buffer are re-read when resuming mid-epoch: a bad chunk there is reported as well
    (a deleted one must not come back as fill values)."""
    ds = ZarrIterableDataset(store, seed=1, buffer_chunks=4)
    loader = ZarrDataLoader(ds, batch_size=8)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    del it
    # the rows in the buffer at that point: read from the stream (the schedule's counts do not depend on
    # the random draws) and not yet emitted; damage a chunk read completely, so only the buffer needs it
    w = ds.plan(epoch=0, batch_size=8, drop_last=False).workers[0]
    stream = np.concatenate([np.arange(lo, hi) for lo, hi in w.pieces])
    steps = list(
        schedule(
            w.batch_sizes, w.rows, capacity=ds.buffer_rows, warmup_rows=ds.chunk_rows, rng=np.random.default_rng(0)
        )
    )
    read = sum(step.append + step.refill for step in steps[:5])
    emitted = np.concatenate(ds.batch_row_ids(epoch=0, batch_size=8, drop_last=False)[:5])
    held = np.setdiff1d(stream[:read], emitted)
    complete = [c for c in np.unique(held // 20) if np.isin(np.arange(20 * c, 20 * c + 20), stream[:read]).all()]
    chunk = int(complete[0])
    path = _chunk_file(store, "x", chunk)
    path.unlink() if damage == "delete" else path.write_bytes(b"garbage")
    resumed = ZarrDataLoader(ds, batch_size=8)
    resumed.load_state_dict(state)
    it = iter(resumed)
    with pytest.raises(ChunkReadError) as err:
        next(it)  # the first batch after resuming already needs the rows held in the buffer
    what = "missing" if damage == "delete" else "cannot read"
    assert f"{what} chunk {chunk} " in str(err.value) and "array 'x'" in str(err.value)
