"""Two loaders on one dataset run their epochs apart: each yields every row of its epoch exactly once, whatever
the order in which their batches are taken."""

from __future__ import annotations

import time

import numpy as np
import pytest

from zarrtorch import ZarrDataLoader, ZarrIterableDataset, prepare_zarr

ROWS, CHUNK, BATCH = 400, 10, 10


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("two") / "s.zarr"
    prepare_zarr({"x": np.arange(ROWS, dtype=np.float32)}, path, chunk_rows=CHUNK, progress=False)
    return path


def rows_of(batches) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([b["index"].numpy() for b in batches]), np.concatenate([b["x"].numpy() for b in batches])


@pytest.mark.parametrize("work_ahead", [0, 2])
def test_a_loader_starting_its_next_epoch_does_not_take_the_other_loaders_early_reads(store, work_ahead):
    """Loader A drains the end of epoch 0 (its reads for epoch 1 started, into its buffer's free end) while loader
    B, on the same dataset, starts epoch 1: B took A's early reads, so both used A's buffer arrays at once (A
    yielded 361 distinct rows of 400, B 384)."""
    ds = ZarrIterableDataset(store, buffer_chunks=8, return_index=True)
    for taken in range(ROWS // BATCH - 12, ROWS // BATCH, 2):
        a_loader = ZarrDataLoader(ds, batch_size=BATCH, work_ahead=work_ahead)
        b_loader = ZarrDataLoader(ds, batch_size=BATCH, work_ahead=work_ahead)
        a_iter = iter(a_loader)
        a = []
        for _ in range(taken):
            a.append(next(a_iter))
            time.sleep(0.005)  # A's early reads finish and are staged in its buffer
        b_loader.set_epoch(1)
        b_iter = iter(b_loader)
        b = [next(b_iter) for _ in range(3)]
        a += list(a_iter)
        b += list(b_iter)
        for name, got in (("A", a), ("B", b)):
            index, x = rows_of(got)
            assert sorted(index.tolist()) == list(range(ROWS)), f"{name}, B started after {taken} of A's batches"
            np.testing.assert_array_equal(x, index)


def test_the_dataset_a_user_built_is_not_written_by_its_loaders(store):
    ds = ZarrIterableDataset(store, buffer_chunks=2)
    loader = ZarrDataLoader(ds, batch_size=BATCH)
    list(loader)
    before = dict(vars(ds))
    list(loader)
    assert loader.data is ds and vars(ds).keys() == before.keys()
    assert all(vars(ds)[k] is v for k, v in before.items() if k != "_fingerprints")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_plain_torch_dataloader_is_refused_with_the_fix(store, num_workers):
    """A stock ``torch.utils.data.DataLoader(dataset, batch_size=None)`` knows no batch size, epoch or rank split:
    each worker would read every row and ranks would yield unequal batches. torch gives a dataset no hook when a
    DataLoader is built, so the refusal comes at the first ``iter()`` (in the main process or the worker), naming
    ZarrDataLoader; ``len()`` refuses alike."""
    from torch.utils.data import DataLoader

    ds = ZarrIterableDataset(store)
    plain = DataLoader(ds, batch_size=None, num_workers=num_workers)
    with pytest.raises(TypeError, match=r"through zarrtorch.ZarrDataLoader\(dataset, batch_size=...\), not a plain"):
        next(iter(plain))
    with pytest.raises(TypeError, match="ZarrDataLoader"):
        len(ds)
