"""Layouts met in object storage: Zarr v3 shards written by ``prepare_zarr`` and read locally and over
HTTP, Zarr v2 stores, stores written straight to S3, and preparation computed on a ``dask.distributed``
cluster of processes (a ``LocalCluster`` started and closed here)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch.course.servers import HttpStoreServer, S3Server

ROWS = 100


def columns(rows=ROWS):
    return {"x": np.arange(rows * 6, dtype=np.float32).reshape(rows, 2, 3), "y": np.arange(rows) * 3}


def stream(ds: ZarrIterableDataset, **kw) -> np.ndarray:
    """The rows of epoch 0, sorted, each checked against the values written."""
    batches = list(ZarrDataLoader(ds, batch_size=7, **kw))
    y = np.concatenate([b["y"].numpy() for b in batches])
    x = np.concatenate([b["x"].numpy() for b in batches])
    np.testing.assert_array_equal(x, columns()["x"][y // 3])  # rows intact, arrays paired
    return np.sort(y)


def objects(path) -> int:
    return sum(1 for p in path.rglob("*") if p.is_file() and p.name != "zarr.json")


def test_shards_written_and_read_locally_and_over_http(tmp_path):
    chunked = prepare_zarr(columns(), tmp_path / "c.zarr", chunk_rows=5, progress=False)
    sharded = prepare_zarr(columns(), tmp_path / "s.zarr", chunk_rows=5, shard_chunks=4, progress=False)
    assert sharded["x"].shards == (20, 2, 3) and sharded["x"].chunks == (5, 2, 3) and chunked["x"].shards is None
    assert objects(tmp_path / "c.zarr") == 2 * 20 and objects(tmp_path / "s.zarr") == 2 * 5  # 4x fewer objects
    local = ZarrIterableDataset(tmp_path / "s.zarr", shuffle=False)
    assert local.chunk_rows == 20  # the shard is the unit read and distributed
    np.testing.assert_array_equal(stream(local), np.arange(ROWS) * 3)
    with HttpStoreServer(tmp_path) as server:
        remote = ZarrIterableDataset(f"{server.url}/s.zarr", shuffle=False)
        np.testing.assert_array_equal(
            stream(remote, num_workers=2, multiprocessing_context="fork"), np.arange(ROWS) * 3
        )
        assert any(k.startswith("s.zarr/x/c/") for k in server.requests)


def test_zarr_v2_store_keeps_working(tmp_path):
    group = zarr.open_group(tmp_path / "v2.zarr", mode="w", zarr_format=2)
    for name, values in columns().items():
        group.create_array(name, shape=values.shape, chunks=(8, *values.shape[1:]), dtype=values.dtype)[:] = values
    zarr.consolidate_metadata(tmp_path / "v2.zarr", zarr_format=2)
    np.testing.assert_array_equal(stream(ZarrIterableDataset(tmp_path / "v2.zarr", shuffle=False)), np.arange(ROWS) * 3)
    with HttpStoreServer(tmp_path) as server:
        ds = ZarrIterableDataset(f"{server.url}/v2.zarr", shuffle=False)
        np.testing.assert_array_equal(stream(ds), np.arange(ROWS) * 3)


@pytest.mark.slow
def test_prepare_writes_to_s3_and_refuses_to_overwrite(tmp_path):
    with S3Server() as s3:
        s3.create_bucket("prep")
        url = "s3://prep/data/p.zarr"
        prepare_zarr(columns(), url, chunk_rows=8, storage_options=s3.storage_options, progress=False)
        with pytest.raises(FileExistsError, match="overwrite=True"):
            prepare_zarr(columns(), url, chunk_rows=8, storage_options=s3.storage_options, progress=False)
        prepare_zarr(columns(), url, chunk_rows=16, storage_options=s3.storage_options, overwrite=True, progress=False)
        ds = ZarrIterableDataset(url, shuffle=False, read=ReadOptions(storage_options=s3.storage_options))
        assert ds.chunk_rows == 16
        np.testing.assert_array_equal(stream(ds), np.arange(ROWS) * 3)


def on_a_worker(block):
    """Fails unless it runs inside a dask.distributed worker process: proves the cluster computed it."""
    from distributed import get_worker

    get_worker()
    return block


@pytest.mark.slow
def test_prepare_on_a_dask_distributed_cluster(tmp_path):
    da = pytest.importorskip("dask.array")
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        distributed.Client(cluster),
        S3Server() as s3,
    ):
        s3.create_bucket("prep")
        source = {
            n: da.from_array(v, chunks=(10, *v.shape[1:])).map_blocks(on_a_worker, dtype=v.dtype)
            for n, v in columns().items()
        }
        with pytest.raises(ValueError, match="No worker found"):
            on_a_worker(np.zeros(1))  # ... and this process is not one
        prepare_zarr(source, tmp_path / "d.zarr", chunk_rows=8, progress=False)
        prepare_zarr(source, "s3://prep/d.zarr", chunk_rows=8, storage_options=s3.storage_options, progress=False)
        for src, opts in ((tmp_path / "d.zarr", None), ("s3://prep/d.zarr", s3.storage_options)):
            ds = ZarrIterableDataset(src, shuffle=False, read=ReadOptions(storage_options=opts))
            np.testing.assert_array_equal(stream(ds), np.arange(ROWS) * 3)


VARIABLES = ("t2m", "u10", "v10", "msl", "tp")


def era5_like(path, rows=40):
    """One array per variable, chunks of a single time step, values encoding (variable, row)."""
    data = {
        v: np.full((rows, 4, 8), 1000 * k, np.float32) + np.arange(rows, dtype=np.float32)[:, None, None]
        for k, v in enumerate(VARIABLES)
    }
    return prepare_zarr(data, path, chunk_rows=1, progress=False)


@pytest.mark.slow
def test_chosen_variables_stacked_into_one_channel_tensor_over_http(tmp_path):
    era5_like(tmp_path / "era5.zarr")
    with HttpStoreServer(tmp_path) as server:
        ds = ZarrIterableDataset(
            f"{server.url}/era5.zarr",
            variables=["u10", "t2m", "tp"],
            seed=4,
            buffer_chunks=3,
            stack={"inputs": ["u10", "t2m"]},
            return_index=True,
        )
        seen, counts = [], []
        for rank in range(2):
            loader = ZarrDataLoader(
                ds, batch_size=4, num_workers=2, rank=rank, world_size=2, multiprocessing_context="fork"
            )
            batches = list(loader)
            counts.append(len(batches))
            for b in batches:
                assert set(b) == {"inputs", "tp", "index"} and b["inputs"].shape[1:] == (2, 4, 8)
                rows = b["index"].numpy().astype(np.float32)
                np.testing.assert_array_equal(b["inputs"][:, 0, 0, 0].numpy(), 1000 + rows)  # u10, in the order given
                np.testing.assert_array_equal(b["inputs"][:, 1, 2, 3].numpy(), rows)  # t2m
                np.testing.assert_array_equal(b["tp"][:, 0, 0].numpy(), 4000 + rows)
                seen.extend(b["index"].tolist())
        assert counts[0] == counts[1] and sorted(seen) == list(range(40))


@pytest.mark.parametrize(
    "stack,message",
    [
        ({"x": ["t2m", "nope"]}, "not loaded"),
        ({"x": ["t2m"], "y": ["t2m", "u10"]}, "more than one stack"),
        ({"t2m": ["u10", "v10"]}, "also an array's name"),
        ({"x": []}, "lists no arrays"),
    ],
)
def test_bad_stacks_are_refused(tmp_path, stack, message):
    era5_like(tmp_path / "era5.zarr", rows=4)
    with pytest.raises((KeyError, ValueError), match=message):
        ZarrIterableDataset(tmp_path / "era5.zarr", stack=stack)


def test_stacking_arrays_of_different_shapes_is_refused(tmp_path):
    prepare_zarr(
        {"a": np.zeros((4, 2), "f4"), "b": np.zeros((4, 3), "f4")}, tmp_path / "m.zarr", chunk_rows=2, progress=False
    )
    with pytest.raises(ValueError, match="mixes row shapes"):
        ZarrIterableDataset(tmp_path / "m.zarr", stack={"ab": ["a", "b"]})
