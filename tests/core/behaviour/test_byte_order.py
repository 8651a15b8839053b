"""Zarr v2 arrays stored big-endian (``>f8``, ``>i4``: written by tools that copy NetCDF/HDF5 byte order) are
read in their own order by zarr, which a tensor cannot hold: every batch failed in ``torch.from_numpy`` with a
message naming no array (found by a break-test helper). Batches now hold this machine's byte order, values
exact, for rows, windows and static arrays, with and without workers and through the shared ring."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from zarrtorch import Windows, ZarrDataLoader, ZarrIterableDataset

ROWS = 40


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("endian") / "big.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    t = np.arange(ROWS)
    group.create_array("x", shape=(ROWS, 3), chunks=(8, 3), dtype=">f8")[:] = t[:, None] * 10.0 + np.arange(3)
    group.create_array("k", shape=(ROWS,), chunks=(8,), dtype=">i4")[:] = -t
    group.create_array("c", shape=(ROWS, 2), chunks=(8, 2), dtype=">c8")[:] = (t[:, None] + 1j * np.arange(2)).astype(
        "c8"
    )
    group.create_array("orography", shape=(2, 2), chunks=(1, 2), dtype=">f4")[:] = [[1.5, 2.5], [3.5, 4.5]]
    zarr.consolidate_metadata(str(path))
    return path


@pytest.mark.parametrize(("workers", "transport"), [(0, None), (2, "queue"), (2, "ring")], ids=["0w", "2w", "2w-ring"])
def test_big_endian_rows_stream_exactly(store, workers, transport):
    ds = ZarrIterableDataset(store, variables=["x", "k", "c"], seed=3, return_index=True, buffer_chunks=2)
    fork = {"multiprocessing_context": "fork"} if workers else {}
    loader = ZarrDataLoader(ds, batch_size=6, num_workers=workers, transport=transport, **fork)
    seen = []
    for batch in loader:
        i = batch["index"].numpy()
        seen.extend(i.tolist())
        assert batch["x"].dtype.is_floating_point and batch["k"].dtype.is_signed
        np.testing.assert_array_equal(batch["x"].numpy(), i[:, None] * 10.0 + np.arange(3))
        np.testing.assert_array_equal(batch["k"].numpy(), -i)
        np.testing.assert_array_equal(batch["c"].numpy(), (i[:, None] + 1j * np.arange(2)).astype("c8"))
    assert sorted(seen) == list(range(ROWS))


@pytest.mark.parametrize("workers", [0, 2])
def test_big_endian_windows_and_static_stream_exactly(store, workers):
    w = Windows(history=2, lead=1, inputs=("x",), targets=("k",), static=("orography",))
    ds = ZarrIterableDataset(store, windows=w, seed=1, return_index=True)
    fork = {"multiprocessing_context": "fork"} if workers else {}
    starts = []
    for batch in ZarrDataLoader(ds, batch_size=4, num_workers=workers, **fork):
        s = batch["index"].numpy()
        starts.extend(s.tolist())
        steps = s[:, None] + np.arange(2)
        np.testing.assert_array_equal(batch["x"].numpy(), steps[..., None] * 10.0 + np.arange(3))
        np.testing.assert_array_equal(batch["k_target"].numpy(), -(s[:, None] + 2))
        np.testing.assert_array_equal(batch["orography"].numpy()[0], [[1.5, 2.5], [3.5, 4.5]])
    assert sorted(starts) == list(range(ROWS - 2))
