"""Arrays whose rows hold no elements (shape ``(n, 0)``: an empty channel list) have no chunk files, since
zarr writes none for them. The loader called each of those chunks missing and told the user to rewrite the
store with prepare_zarr, whose store failed the same way (found by a break-test helper)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from zarrtorch import Windows, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch.course.servers import HttpStoreServer


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("odd")
    group = zarr.open_group(str(root / "z.zarr"), mode="w")
    group.create_array("e", shape=(20, 0), chunks=(4, 0), dtype="f4")
    group.create_array("i", shape=(20,), chunks=(4,), dtype="i8")[:] = np.arange(20)
    zarr.consolidate_metadata(str(root / "z.zarr"))
    prepare_zarr({"e": np.zeros((20, 0), "f4"), "i": np.arange(20)}, root / "p.zarr", chunk_rows=4, progress=False)
    return root


@pytest.mark.parametrize("name", ["z.zarr", "p.zarr"])
@pytest.mark.parametrize("workers", [0, 2])
def test_rows_of_no_elements_stream_without_chunk_files(stores, name, workers):
    fork = {"multiprocessing_context": "fork"} if workers else {}
    ds = ZarrIterableDataset(stores / name, seed=1)
    batches = list(ZarrDataLoader(ds, batch_size=4, num_workers=workers, **fork))
    assert sorted(np.concatenate([b["i"].numpy() for b in batches]).tolist()) == list(range(20))
    assert all(tuple(b["e"].shape) == (len(b["i"]), 0) for b in batches)


def test_windows_and_http_of_rows_of_no_elements(stores):
    with HttpStoreServer(stores) as server:
        ds = ZarrIterableDataset(f"{server.url}/z.zarr", windows=Windows(history=2, lead=1), return_index=True)
        batches = list(ZarrDataLoader(ds, batch_size=4))
    assert sorted(np.concatenate([b["index"].numpy() for b in batches]).tolist()) == list(range(18))
    assert all(tuple(b["e"].shape[1:]) == (2, 0) and tuple(b["e_target"].shape[1:]) == (1, 0) for b in batches)
    for b in batches:
        np.testing.assert_array_equal(b["i_target"].numpy()[:, 0], b["index"].numpy() + 2)
