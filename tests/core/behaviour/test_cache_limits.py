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
