"""zarrtorch.course.shuffle_study: simulated batches equal the dataset's, and the extra quality measure."""

import numpy as np
import pytest
import zarr

import zarrtorch as zt
from zarrtorch import quality
from zarrtorch.course import shuffle_study

ROWS, CHUNK = 203, 16  # 13 chunks, the last one partial


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("shuffle") / "s.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    x = group.create_array("x", shape=(ROWS, 3), chunks=(CHUNK, 3), dtype="float32")
    x[:] = np.arange(ROWS * 3, dtype="float32").reshape(ROWS, 3)
    return path


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world,workers,drop_last", [(1, 0, True), (2, 2, True), (3, 1, False), (2, 3, False)])
def test_simulate_batches_equals_dataset(store, shuffle, world, workers, drop_last):
    ds = zt.ZarrIterableDataset(store, seed=5, shuffle=shuffle, buffer_chunks=3)
    for epoch in (0, 1):
        for rank in range(world):
            expected = ds.batch_row_ids(
                epoch=epoch, rank=rank, world_size=world, num_workers=workers, batch_size=8, drop_last=drop_last
            )
            got = shuffle_study.simulate_batches(
                ROWS,
                CHUNK,
                batch_size=8,
                buffer_chunks=3,
                seed=5,
                epoch=epoch,
                world_size=world,
                rank=rank,
                num_workers=workers,
                shuffle=shuffle,
                drop_last=drop_last,
            )
            assert len(got) == len(expected)
            for a, b in zip(got, expected, strict=True):
                np.testing.assert_array_equal(a, b)


def test_batch_mean_spread():
    values = np.sin(np.linspace(0, 2 * np.pi, 4000))  # one "season"
    in_order = [np.arange(i, i + 40) for i in range(0, 4000, 40)]
    perfect = quality.perfect_shuffle_batches(4000, 40, seed=1)
    assert shuffle_study.batch_mean_spread(in_order, values) > 5
    assert 0.7 < shuffle_study.batch_mean_spread(perfect, values) < 1.3
    assert shuffle_study.expected_batch_mean_std(values, 4000) == 0.0


def test_memory_matches_dataset(store):
    ds = zt.ZarrIterableDataset(store, buffer_chunks=4)
    assert shuffle_study.buffer_memory_bytes(
        CHUNK, ds.row_bytes, buffer_chunks=4, decode_threads=2
    ) == ds.worker_memory_bytes(decode_threads=2)


def test_sweep_records():
    recs = shuffle_study.sweep(
        2000,
        chunk_rows=[16, 64],
        buffer_rows=[64, 256],
        batch_size=32,
        row_bytes=10,
        epochs=(0, 1),
        values=np.arange(2000.0),
    )
    assert [(r["chunk_rows"], r["buffer_chunks"]) for r in recs] == [(16, 4), (16, 16), (64, 1), (64, 4)]
    for r in recs:
        assert 0 < r["chunk_diversity"] <= 1.05 and -1 <= r["order_correlation"] <= 1
        # the buffer, 2 reads in flight (one decode thread) of 64 chunks each (chunks of 160 and 640 bytes: as many
        # as a read takes), the chunk being consumed
        assert r["memory_bytes"] == (r["buffer_chunks"] + 2 * 64 + 1) * r["chunk_rows"] * 10
    # at a fixed buffer size in rows, shorter chunks mix better
    assert recs[1]["chunk_diversity"] > recs[3]["chunk_diversity"]
    with pytest.raises(ValueError):
        shuffle_study.sweep(100, chunk_rows=[8], batch_size=4)


def test_fitting_buffers_drop_buffers_larger_than_the_store():
    from zarrtorch.course.shuffle_study import fitting_buffers

    # the tiny store: 1,460 rows in chunks of 64; 32 chunks = 2,048 rows would never fill
    assert fitting_buffers(1460, 64, [1, 2, 4, 8, 16, 32]) == [1, 2, 4, 8, 16]
    assert fitting_buffers(18_980, 64, [1, 2, 4, 8, 16, 32]) == [1, 2, 4, 8, 16, 32]
    assert fitting_buffers(100, 64, [0, 1, 2]) == [1]
    assert fitting_buffers(10, 64, [1, 2]) == []
