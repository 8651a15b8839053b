"""zarrtorch.course.reference_compare: the predicted partition of zarr-torch-dataset 0.0.9 and a real 2-rank run."""

import numpy as np
import pytest
import zarr

pytest.importorskip("zarrdataset")

from zarrtorch.course import reference_compare as rc  # noqa: E402


@pytest.fixture
def store(tmp_path):
    """200 rows in chunks of 16 (13 chunks, the last one of 8 rows), 4 channels on a 4 x 4 grid."""
    path = tmp_path / "s.zarr"
    g = zarr.open_group(str(path), mode="w")
    a = g.create_array("fields", shape=(200, 4, 4, 4), chunks=(16, 4, 4, 4), dtype="float32")
    a[:] = np.arange(200 * 64, dtype=np.float32).reshape(200, 4, 4, 4)
    return path


@pytest.mark.filterwarnings("ignore:The number of selected chunks")
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_predicted_rows_match_the_library(store, world, monkeypatch):
    """Run the library in this process as each rank (its rank lookup patched) and count the rows it yields."""
    import zarrdataset.iterable_dataset as impl

    predicted = rc.reference_rows_per_rank(200, 16, world, seed=0)
    for rank in range(world):
        monkeypatch.setattr(impl, "_get_gpu_info", lambda rank=rank: (rank, world))
        loader = rc.reference_loader(store, batch_size=8, drop_last=False, num_workers=0, context=None, seed=0)
        rows = np.concatenate([b[1].numpy() for b in loader])
        assert len(rows) == predicted[rank] == len(np.unique(rows))


def test_two_ranks_unequal_batches_stop_ddp(store):
    """A real 2-process gloo run, bounded: the reference gives the ranks unequal batch counts and the DDP epoch
    fails on the rank with the extra batch; zarrtorch gives equal counts and both ranks finish."""
    predicted = [n // 8 for n in rc.reference_rows_per_rank(200, 16, 2, seed=0)]
    assert predicted[0] != predicted[1]
    ref = rc.launch("reference", store=store, batch_size=8, epochs=2, train=True, timeout_s=5, wall_limit_s=60)
    assert [r["status"] for r in ref] == ["ok", "ok"]
    assert [r["epochs"][0]["batches"] for r in ref] == predicted
    assert all(r["epochs"][0]["rows"] == r["epochs"][1]["rows"] for r in ref)  # frozen partition and order
    assert sorted(r["train"]["status"] for r in ref) == ["error", "ok"]
    ours = rc.launch("zarrtorch", store=store, batch_size=8, epochs=1, train=True, timeout_s=5, wall_limit_s=60)
    assert [r["train"]["status"] for r in ours] == ["ok", "ok"]
    assert ours[0]["epochs"][0]["batches"] == ours[1]["epochs"][0]["batches"] == 200 // 16
    assert not set(ours[0]["epochs"][0]["rows"]) & set(ours[1]["epochs"][0]["rows"])


@pytest.mark.parametrize("size", ["tiny", "small", "workshop"])
def test_the_comparison_fits_its_budget_at_every_size(size):
    """The course presets' numbers, cheaply: all rows while they fit 1 GiB, else a partial last chunk and
    reference batch counts that still differ between the 2 ranks (what the appendix shows)."""
    from zarrtorch.course.synthetic import PRESETS, TRAIN_CHUNK_ROWS

    preset, chunk = PRESETS[size], TRAIN_CHUNK_ROWS[size]
    rows = rc.comparison_rows(preset.n_time, chunk, preset.sample_nbytes, batch_size=32)
    if preset.n_time * preset.sample_nbytes <= rc.COMPARISON_BUDGET_MB * 2**20:
        assert rows == preset.n_time
    else:
        assert rows * preset.sample_nbytes <= rc.COMPARISON_BUDGET_MB * 2**20 and rows % chunk == chunk // 2
        assert len({r // 32 for r in rc.reference_rows_per_rank(rows, chunk, 2)}) == 2


def test_comparison_store_copies_the_first_rows(tmp_path):
    xr = pytest.importorskip("xarray")
    from zarrtorch import prepare_zarr

    x = np.arange(200 * 16, dtype=np.float32).reshape(200, 4, 4)
    ds = xr.Dataset({"fields": (("time", "y", "x"), x), "target": (("time",), np.arange(200, dtype=np.float32))})
    store = tmp_path / "train.zarr"
    prepare_zarr(ds, store, chunk_rows=16, progress=False)
    assert rc.comparison_store(store, batch_size=8) == store  # small enough: the store itself
    budget = 100 * 17 * 4 / 2**20  # room for 100 rows of fields + target
    window = rc.comparison_store(store, batch_size=8, budget_mb=budget, out_dir=tmp_path / "scratch")
    expected_rows = rc.comparison_rows(200, 16, 17 * 4, batch_size=8, budget_mb=budget)
    assert window.parent == tmp_path / "scratch" and expected_rows % 16 == 8 and expected_rows <= 100
    g = zarr.open_group(str(window), mode="r")
    assert g["fields"].shape == (expected_rows, 4, 4) and g["fields"].chunks[0] == 16
    np.testing.assert_array_equal(g["fields"][:], x[:expected_rows])
    np.testing.assert_array_equal(g["target"][:], np.arange(expected_rows, dtype=np.float32))
    assert rc.comparison_store(store, batch_size=8, budget_mb=budget, out_dir=window.parent) == window  # reused
