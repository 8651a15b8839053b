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
        ds = ddp_demo.NaiveChunkSplit(store, batch_size=8, arrays=["x", "y"], rank=rank, world_size=2)
        batches = list(ds)
        assert len(batches) == len(ds)
        assert all(len(b["index"]) == 8 for b in batches[:-1])
        idx = np.concatenate([b["index"].numpy() for b in batches])
        assert set((idx // CHUNK).tolist()) == set(range(rank, 10, 2))
        x = zarr.open_group(str(store), mode="r")["x"][:]
        np.testing.assert_array_equal(batches[0]["x"].numpy(), x[batches[0]["index"].numpy()])
        seen.append(idx)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(ROWS))


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
