"""The node's chunk cache (``ReadOptions(cache_dir=..., cache_limit_bytes=...)``) in sequences a user meets beside
the usual epochs: a limit too small for one chunk, a store rewritten while a dataset reads it through the cache."""

from __future__ import annotations

import numpy as np
import pytest

from zarrtorch import ReadOptions, ZarrIterableDataset, prepare_zarr
from zarrtorch.course.servers import HttpStoreServer

ROWS = 40  # 5 chunks of 8 rows: x's of 4 KiB (random, stored as they are), y's of 38 bytes


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("limits")
    columns = {"x": np.random.default_rng(0).random((ROWS, 64)), "y": 3 * np.arange(ROWS, dtype=np.int64)}
    prepare_zarr(columns, root / "s.zarr", chunk_rows=8, progress=False)
    with HttpStoreServer(root) as server:
        yield server


def test_a_cache_limit_smaller_than_a_chunk_is_refused_at_construction_not_missed_every_epoch(served, tmp_path):
    """cache_limit_bytes=200 (meant as 200 GB) kept no chunk of x: every epoch fetched each again, silently."""
    read = ReadOptions(cache_dir=tmp_path / "cache", cache_limit_bytes=200)
    with pytest.raises(ValueError, match=r"cache_limit_bytes=200 .* array 'x'"):
        ZarrIterableDataset(f"{served.url}/s.zarr", read=read)


def test_a_store_rewritten_between_two_epochs_is_refused_at_the_next_epoch_not_read_from_old_files(tmp_path):
    """prepare_zarr wrote the store again (other values) between two epochs of one loader reading it through the
    cache: the second epoch served the old values of every chunk the cache held (the new ones where it held none),
    silently. The next epoch is refused by name; a new dataset reads the new store."""
    from zarrtorch import ZarrDataLoader

    root, cache = tmp_path / "served", tmp_path / "cache"
    prepare_zarr({"y": 3 * np.arange(ROWS, dtype=np.int64)}, root / "s.zarr", chunk_rows=8, progress=False)
    with HttpStoreServer(root) as server:
        url = f"{server.url}/s.zarr"
        loader = ZarrDataLoader(ZarrIterableDataset(url, read=ReadOptions(cache_dir=cache)), batch_size=8)
        assert sum(len(b["y"]) for b in loader) == ROWS
        prepare_zarr({"y": 5 * np.arange(ROWS)}, root / "s.zarr", chunk_rows=8, progress=False, overwrite=True)
        loader.set_epoch(1)
        with pytest.raises(ValueError, match="rewritten since this dataset opened it"):
            next(iter(loader))
        fresh = ZarrIterableDataset(url, return_index=True, read=ReadOptions(cache_dir=cache))
        for batch in ZarrDataLoader(fresh, batch_size=8):
            np.testing.assert_array_equal(batch["y"].numpy(), 5 * batch["index"].numpy())
