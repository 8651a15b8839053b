"""The DDP demonstration of notebook 02: the naive chunk split really breaks a gloo run, zarrtorch's does not."""

import numpy as np
import pytest
import zarr

from zarrtorch.course import ddp_demo

ROWS, CHUNK = 150, 16  # 10 chunks, the last one partial (6 rows)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("ddp") / "small.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    rng = np.random.default_rng(0)
    x = group.create_array("x", shape=(ROWS, 2, 4, 4), chunks=(CHUNK, 2, 4, 4), dtype="float32")
    y = group.create_array("y", shape=(ROWS, 4, 4), chunks=(CHUNK, 4, 4), dtype="float32")
    x[:] = rng.normal(size=x.shape).astype("float32")
    y[:] = rng.normal(size=y.shape).astype("float32")
    return path


def test_naive_batch_counts_unequal():
    # rank 0: chunks 0,2,4,6,8 = 80 rows; rank 1: 1,3,5,7 + the 6-row chunk 9 = 70 rows
    assert ddp_demo.naive_batch_counts(ROWS, CHUNK, world_size=2, batch_size=8) == [10, 9]
    assert ddp_demo.naive_batch_counts(ROWS, CHUNK, world_size=2, batch_size=8, drop_last=True) == [10, 8]
    assert ddp_demo.naive_batch_counts(128, 16, world_size=2, batch_size=8) == [8, 8]


def test_naive_split_reads_every_row_once(store):
    seen = []
    for rank in range(2):
        ds = ddp_demo.NaiveChunkSplit(store, batch_size=8, variables=["x", "y"], rank=rank, world_size=2)
        batches = list(ds)
        assert len(batches) == len(ds)
        assert all(len(b["index"]) == 8 for b in batches[:-1])
        idx = np.concatenate([b["index"].numpy() for b in batches])
        assert set((idx // CHUNK).tolist()) == set(range(rank, 10, 2))
        x = zarr.open_group(str(store), mode="r")["x"][:]
        np.testing.assert_array_equal(batches[0]["x"].numpy(), x[batches[0]["index"].numpy()])
        seen.append(idx)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(ROWS))


@pytest.mark.parametrize("split_by_worker, times", [(True, 1), (False, 2)])
def test_naive_split_with_two_workers_reads_each_row_once_or_once_per_worker(store, split_by_worker, times):
    """Lesson 02 shows the other way to read rows twice: a dataset whose ``__iter__`` ignores which DataLoader
    worker runs it yields the rank's whole share from every worker."""
    from torch.utils.data import DataLoader

    ds = ddp_demo.NaiveChunkSplit(
        store, batch_size=8, variables=["y"], rank=0, world_size=1, split_by_worker=split_by_worker
    )
    seen = np.concatenate([b["index"].numpy() for b in DataLoader(ds, batch_size=None, num_workers=2)])
    assert np.array_equal(np.bincount(seen, minlength=ROWS), np.full(ROWS, times))


@pytest.mark.slow
def test_naive_split_fails_and_zarrtorch_completes(store):
    common = dict(world_size=2, store=store, batch_size=8, timeout_s=10, inputs="x", target="y")
    naive = ddp_demo.launch("naive", **common)
    assert [r["rank"] for r in naive] == [0, 1]
    assert [r["batches_planned"] for r in naive] == [10, 9], naive
    # the short rank finishes its 9 batches and leaves; the long one fails in the collective of batch 10
    assert naive[1]["status"] == "ok" and naive[1]["batches_done"] == 9, naive
    assert naive[0]["status"] == "error" and naive[0]["batches_done"] == 9, naive
    assert naive[0]["error_type"] and naive[0]["error"]

    ours = ddp_demo.launch("zarrtorch", **common)
    assert all(r["status"] == "ok" for r in ours), ours
    counts = [r["batches_done"] for r in ours]
    assert counts[0] == counts[1] == ROWS // (2 * 8) == 9
    assert all(r["rows_read_twice"] == 0 and r["rows_all_ranks"] == 2 * 9 * 8 for r in ours)


# ---------------------------------------------------------------------------------------------------------
# The demo sized to the data (no processes, no data: the course presets' numbers only)
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", ["tiny", "small", "workshop"])
def test_demo_rows_fits_budget_and_keeps_naive_counts_unequal(size):
    from zarrtorch.course.synthetic import PRESETS, TRAIN_CHUNK_ROWS
    from zarrtorch.plan import epoch_plan

    p, chunk = PRESETS[size], TRAIN_CHUNK_ROWS[size]
    used = ddp_demo.demo_rows(p.n_time, chunk, p.sample_nbytes, world_size=2, batch_size=32)
    assert 0 < used <= p.n_time
    if p.n_time * p.sample_nbytes <= ddp_demo.DEMO_BUDGET_MB * 2**20:
        assert used == p.n_time  # the whole store when it fits
    else:
        assert used % chunk == 0  # whole chunks: a valid row_range for ZarrIterableDataset
        assert used * p.sample_nbytes <= ddp_demo.DEMO_BUDGET_MB * 2**20
    naive = ddp_demo.naive_batch_counts(used, chunk, world_size=2, batch_size=32)
    assert len(set(naive)) > 1, naive  # the demonstration still has a rank with an extra batch
    plans = [
        epoch_plan(used, chunk, seed=0, epoch=0, batch_size=32, drop_last=True, world_size=2, rank=r) for r in range(2)
    ]
    assert plans[0].batches == plans[1].batches > 0


def test_demo_rows_on_workshop_numbers():
    # 640 KiB rows in chunks of 32 (20 MiB): 6 chunks fit 128 MiB, but 6 deal evenly to 2 ranks; 5 do not
    assert ddp_demo.demo_rows(16_384, 32, 640 * 2**10, world_size=2, batch_size=32) == 5 * 32
    assert ddp_demo.naive_batch_counts(5 * 32, 32, world_size=2, batch_size=32) == [3, 2]
    # a budget below one chunk still gives one chunk
    assert ddp_demo.demo_rows(16_384, 32, 640 * 2**10, world_size=2, batch_size=32, budget_mb=1) == 32


def test_naive_split_window_reads_only_the_window(store):
    seen = []
    for rank in range(2):
        kw = dict(batch_size=8, variables=["x", "y"], rank=rank, world_size=2, rows=5 * CHUNK)
        ds = ddp_demo.NaiveChunkSplit(store, **kw)
        batches = list(ds)
        assert len(batches) == len(ds) == [3, 2][rank] * CHUNK // 8
        seen.append(np.concatenate([b["index"].numpy() for b in batches]))
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(5 * CHUNK))
    with pytest.raises(ValueError, match="chunk boundary"):
        ddp_demo.NaiveChunkSplit(store, batch_size=8, variables=["x", "y"], rank=0, world_size=2, rows=CHUNK + 1)


def test_launch_reports_killed_ranks_with_elapsed_time(store, tmp_path):
    # a "python" that never answers: the launcher must kill it and still report elapsed_s (no KeyError later)
    hang = tmp_path / "hang.sh"
    hang.write_text("#!/bin/sh\nexec sleep 60\n")
    hang.chmod(0o755)
    res = ddp_demo.launch("naive", world_size=2, store=store, python=str(hang), wall_limit_s=0.1, rows=2 * CHUNK)
    assert [r["status"] for r in res] == ["killed", "killed"]
    assert all(r["elapsed_s"] >= 0.1 for r in res)
