"""Lightning integration: the time split (two row windows of one store), the model, the epoch reaching the
loader with Lightning's default settings (data module and bare loader), and a real 2-process DDP fit on CPU
(gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import zarr

from zarrtorch import ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch.course.callbacks import RowRecorder, summarize_rows
from zarrtorch.course.models import ForecastModule, channel_stats
from zarrtorch.lightning import ZarrDataModule, plan_split

CHUNK = 16
ROWS = 9 * CHUNK + 5  # a partial last chunk
REPO = Path(__file__).resolve().parents[3]


def make_store(path: Path, rows: int = ROWS, chunk_rows: int = CHUNK, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    fields = rng.normal(size=(rows, 4, 8, 16)).astype(np.float32)
    fields[:, 0] += np.arange(rows, dtype=np.float32)[:, None, None] * 0.01
    target = (fields[:, 0] + 0.1 * rng.normal(size=(rows, 8, 16))).astype(np.float32)
    prepare_zarr({"fields": fields, "target": target}, path, chunk_rows=chunk_rows, progress=False)
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return make_store(tmp_path_factory.mktemp("lightning") / "train.zarr")


def quiet_trainer(**kwargs) -> L.Trainer:
    options = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    options.update(kwargs)
    return L.Trainer(**options)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*IterableDataset.*__len__.*")
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*LeafSpec.*")
        warnings.filterwarnings("ignore", message=".*no `val_dataloader`.*")
        yield


# -- split -------------------------------------------------------------------------------------------------
def test_plan_split_by_whole_chunks():
    p = plan_split(ROWS, CHUNK, 0.2)  # 10 chunks, 2 validate
    assert (p.n_chunks, p.val_chunks, p.split_row) == (10, 2, 8 * CHUNK)
    assert plan_split(100, 10, 0.01).val_chunks == 1  # at least one
    assert plan_split(100, 10, 0.99).val_chunks == 9  # at least one chunk left to fit
    with pytest.raises(ValueError):
        plan_split(10, 10, 0.2)
    with pytest.raises(ValueError):
        plan_split(100, 10, 1.0)
    # windows of 11 rows: the validation period needs the 10-row gap and one window; 167 rows in chunks of 27 left
    # 5 rows, refused with a row_range the user never gave (found by a break-test helper)
    with pytest.raises(
        ValueError, match=r"validation period \(the last 5 rows.*one window of 11 rows: raise val_fraction"
    ):
        plan_split(167, 27, 0.2, halo=10)
    assert plan_split(167, 27, 0.2, halo=2).val_rows == 5  # a gap of 2 and a window of 3 fit


def test_datamodule_splits_by_row_windows_without_copying(tmp_path):
    src = make_store(tmp_path / "train.zarr")
    before = sorted(p.name for p in tmp_path.iterdir())
    dm = ZarrDataModule(src, batch_size=8, shuffle="none", return_index=True)
    dm.setup("fit")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written next to the store
    assert dm.split_plan.fit_range == (0, 8 * CHUNK) and dm.split_plan.val_range == (8 * CHUNK, ROWS)
    fit, val = dm.train_dataset, dm.val_dataset
    assert (fit.row_offset, fit.rows, val.row_offset, val.rows) == (0, 8 * CHUNK, 8 * CHUNK, ROWS - 8 * CHUNK)
    orig = zarr.open_group(str(src), mode="r")
    # validation: every row of the last chunks (partial last chunk included), in time order, store row numbers
    batches = list(dm.val_dataloader())
    index = np.concatenate([b["index"].numpy() for b in batches])
    np.testing.assert_array_equal(index, np.arange(8 * CHUNK, ROWS))
    np.testing.assert_array_equal(np.concatenate([b["target"].numpy() for b in batches]), orig["target"][8 * CHUNK :])
    # training: fitting rows only
    rows = np.concatenate([b["index"].numpy() for b in dm.train_dataloader()])
    assert rows.max() < 8 * CHUNK and len(rows) == 8 * CHUNK
    assert "fit on rows [0, 128)" in dm.describe()


def test_datamodule_on_a_shorter_period_reads_only_its_rows(tmp_path):
    """``rows=``: the first chunks only, split as a store of that length would be; a period that would stop
    inside a chunk is refused with the chunk boundaries around it."""
    src = make_store(tmp_path / "train.zarr")
    dm = ZarrDataModule(src, batch_size=8, shuffle="none", return_index=True, rows=5 * CHUNK)
    assert (dm.split_plan.rows, dm.split_plan.fit_range, dm.split_plan.val_range) == (
        5 * CHUNK,
        (0, 4 * CHUNK),
        (4 * CHUNK, 5 * CHUNK),
    )
    val = np.concatenate([b["index"].numpy() for b in dm.val_dataloader()])
    np.testing.assert_array_equal(val, np.arange(4 * CHUNK, 5 * CHUNK))
    fit = np.concatenate([b["index"].numpy() for b in dm.train_dataloader()])
    np.testing.assert_array_equal(np.sort(fit), np.arange(4 * CHUNK))
    assert ZarrDataModule(src, rows=10 * ROWS).split_plan.rows == ROWS  # longer than the store: all of it
    with pytest.raises(
        ValueError, match=f"rows={CHUNK + 1} does not end on a chunk boundary.*use {CHUNK} or {2 * CHUNK}"
    ):
        ZarrDataModule(src, rows=CHUNK + 1)
    with pytest.raises(ValueError, match=f"use {CHUNK} or more"):
        ZarrDataModule(src, rows=3)


def test_datamodule_shuffle_modes(tmp_path):
    src = make_store(tmp_path / "train.zarr")
    options = {
        mode: ZarrDataModule(src, shuffle=mode, buffer_chunks=3)._dataset_options()
        for mode in ("none", "chunks", "full")
    }
    assert options == {"none": (False, 1), "chunks": (True, 0), "full": (True, 3)}
    dm = ZarrDataModule(src, batch_size=8, shuffle="chunks", return_index=True, seed=2)
    rows = np.concatenate([b["index"].numpy() for b in dm.train_dataloader()])
    chunks = rows // CHUNK
    starts = np.r_[0, np.nonzero(np.diff(chunks))[0] + 1]
    assert len(starts) == 8 and not np.array_equal(chunks[starts], np.arange(8))  # whole chunks, shuffled
    for a, b in zip(starts, np.r_[starts[1:], len(rows)], strict=True):
        np.testing.assert_array_equal(rows[a:b], np.arange(rows[a], rows[a] + CHUNK))  # rows in order


def test_datamodule_batch_order_rank_gives_the_batches_of_no_worker(tmp_path):
    """``ZarrDataModule(batch_order="rank")``: the training batches with 2 workers are those with none (a laptop's
    run reproduces a cluster run's batches whatever its workers)."""
    src = make_store(tmp_path / "train.zarr")

    def rows(workers):
        dm = ZarrDataModule(src, batch_size=8, num_workers=workers, return_index=True, seed=2, batch_order="rank")
        return [b["index"].tolist() for b in dm.train_dataloader()]

    assert rows(2) == rows(0)
    with pytest.raises(ValueError, match="batch_order must be"):
        ZarrDataModule(src, batch_order="ranks")


def test_split_of_an_xarray_store_keeps_dates(tmp_path):
    import pandas as pd
    import xarray as xr

    rows = 3 * CHUNK + 3
    ds = xr.Dataset(
        {
            "fields": (("time", "variable", "lat", "lon"), np.ones((rows, 2, 4, 8), np.float32)),
            "target": (("time", "lat", "lon"), np.zeros((rows, 4, 8), np.float32)),
        },
        coords={"time": pd.date_range("2000-01-01", periods=rows, freq="6h")},
    )
    src = tmp_path / "train.zarr"
    prepare_zarr(ds, src, chunk_rows=CHUNK, progress=False)
    dm = ZarrDataModule(src, val_fraction=0.25)
    assert dm.split_plan.split_row == 3 * CHUNK
    dm.setup("fit")
    assert dm.train_dataset.rows == 3 * CHUNK and dm.val_dataset.rows == 3
    day = str(ds["time"].values[3 * CHUNK])[:10]
    assert f"validate {day}" in dm.describe()


def test_the_described_dates_are_those_of_the_rows_used(tmp_path):
    """With ``rows=`` the periods end at the rows used, not at the store's end (seen failing: the validation
    period of a one-year window of a 12-year store was printed as ending in 2011)."""
    import pandas as pd
    import xarray as xr

    rows = 8 * CHUNK
    time = pd.date_range("2000-01-01", periods=rows, freq="6h")
    ds = xr.Dataset({"fields": (("time", "x"), np.zeros((rows, 4), np.float32))}, coords={"time": time})
    src = tmp_path / "train.zarr"
    prepare_zarr(ds, src, chunk_rows=CHUNK, progress=False)
    dm = ZarrDataModule(src, val_fraction=0.25, rows=4 * CHUNK)
    first_val, last = (str(time.values[r])[:10] for r in (3 * CHUNK, 4 * CHUNK - 1))
    assert f"validate {first_val} .. {last}" in dm.describe()
    assert str(time.values[-1])[:10] not in dm.describe()


# -- model ---------------------------------------------------------------------------------------------------
def test_channel_stats_and_untrained_model_is_persistence(store):
    stats = channel_stats(store, chunks=[0, 3])
    f = zarr.open_group(str(store), mode="r")["fields"]
    x = np.concatenate([f[0:CHUNK], f[3 * CHUNK : 4 * CHUNK]]).astype(np.float64)
    np.testing.assert_allclose(stats["mean"], x.mean(axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(stats["std"], x.std(axis=(0, 2, 3)), rtol=1e-5)
    model = ForecastModule(stats, hidden=4, depth=2)
    fields = torch.from_numpy(f[:8])
    torch.testing.assert_close(model(fields), fields[:, 0])  # the last layer starts at zero: skill 0


# -- the epoch reaches the loader with Lightning's default settings ---------------------------------------------
def test_datamodule_epochs_reach_the_loader(store, tmp_path):
    L.seed_everything(0, verbose=False)
    dm = ZarrDataModule(store, batch_size=8, return_index=True, seed=3)
    rec = RowRecorder()
    model = ForecastModule(channel_stats(dm.store, n_chunks=2, stop_row=dm.split_plan.split_row), hidden=4, depth=2)
    quiet_trainer(max_epochs=3, callbacks=[rec]).fit(model, datamodule=dm)
    assert [e["loader_epoch"] for e in rec.epochs] == [0, 1, 2]
    bound = dm.train_dataloader()  # a loader as Lightning's is configured
    for e in rec.epochs:
        expected = np.concatenate(bound.batch_row_ids(epoch=e["epoch"]))
        np.testing.assert_array_equal(e["rows"][0], expected)
    assert rec.epochs[0]["rows"][0] != rec.epochs[1]["rows"][0]
    assert [h["epoch"] for h in model.history] == [0, 1, 2]
    assert all(np.isfinite(h["val_skill"]) for h in model.history)
    summary = summarize_rows(rec.epochs)
    assert all(s["duplicates_within_rank"] == [0] for s in summary)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bare_loader_follows_lightning_epochs(store, num_workers):
    """A ZarrDataLoader handed straight to Trainer.fit: Lightning's set_epoch reaches it (and its workers)."""
    ds = ZarrIterableDataset(store, seed=5, return_index=True)
    kw = {"persistent_workers": True} if num_workers else {}
    loader = ZarrDataLoader(ds, batch_size=8, drop_last=True, num_workers=num_workers, **kw)
    rec = RowRecorder()
    model = ForecastModule(channel_stats(store, n_chunks=2), hidden=4, depth=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*starts again with the same order.*")
        quiet_trainer(max_epochs=3, callbacks=[rec], limit_val_batches=0).fit(model, train_dataloaders=loader)
    assert [e["loader_epoch"] for e in rec.epochs] == [0, 1, 2]
    for e in rec.epochs:
        expected = np.concatenate(loader.batch_row_ids(epoch=e["epoch"]))
        np.testing.assert_array_equal(e["rows"][0], expected)
    assert len({tuple(e["rows"][0]) for e in rec.epochs}) == 3  # a new order every epoch


# -- a real 2-process DDP fit --------------------------------------------------------------------------------
DDP_SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.filterwarnings("ignore")
    import torch
    import lightning as L
    from zarrtorch import ZarrDataLoader, ZarrIterableDataset
    from zarrtorch.course.callbacks import HistoryWriter, RowRecorder
    from zarrtorch.lightning import ZarrDataModule
    from zarrtorch.course.models import ForecastModule, channel_stats

    if __name__ == "__main__":
        store, out = sys.argv[1], sys.argv[2]
        torch.set_num_threads(1)
        L.seed_everything(0, verbose=False)
        dm = ZarrDataModule(store, batch_size=8, return_index=True, seed=11, buffer_chunks=2)
        model = ForecastModule(channel_stats(dm.store, n_chunks=2, stop_row=dm.split_plan.split_row), hidden=4, depth=2)
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[RowRecorder(out + "/rows.json"), HistoryWriter(out + "/history.json")])
        trainer.fit(model, datamodule=dm)
        open(f"{out}/done-fit-{trainer.global_rank}", "w").close()
        # the same processes, a bare ZarrDataLoader over the whole store (partial last chunk) for training
        loader = ZarrDataLoader(ZarrIterableDataset(store, seed=12, buffer_chunks=2, return_index=True),
                                batch_size=8, drop_last=True)
        bare = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, callbacks=[RowRecorder(out + "/rows_bare.json")])
        stats = channel_stats(dm.store, n_chunks=2, stop_row=dm.split_plan.split_row)
        bare.fit(ForecastModule(stats, hidden=4, depth=2), train_dataloaders=loader)
        open(f"{out}/done-bare-{bare.global_rank}", "w").close()
        # the same processes again: validation alone, of another store (15 validation rows)
        dm = ZarrDataModule(sys.argv[3], batch_size=4, val_fraction=0.1, seed=3)
        model = ForecastModule(channel_stats(dm.store, n_chunks=2, stop_row=dm.split_plan.split_row), hidden=4, depth=2)
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
                            enable_model_summary=False)
        (metrics,) = trainer.validate(model, datamodule=dm, verbose=False)
        if trainer.global_rank == 0:
            with open(out + "/val.json", "w") as f:
                json.dump({"val_rows": dm.split_plan.val_rows, **metrics}, f)
    """
)


def run_script(script, store, tmp_path, *extra) -> None:
    """Run a script that starts its own two DDP ranks, outside any launcher this test process may run under (its
    rank and Slurm variables would make Lightning join that job instead); ``extra``: more arguments for it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_NTASKS", "SLURM_PROCID"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, str(script), str(store), str(tmp_path), *map(str, extra)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def ddp_run(store, tmp_path_factory) -> Path:
    """One launch of 2 DDP ranks (starting them costs more than what they run): a fit with the DataModule, a fit
    with a bare loader, then validation alone of a store with 15 validation rows; the folder of what they wrote."""
    out = tmp_path_factory.mktemp("ddp_run")
    script = out / "ddp_fit.py"
    script.write_text(DDP_SCRIPT)
    run_script(script, store, out, make_store(out / "v.zarr", rows=9 * CHUNK + 15))
    return out


@pytest.mark.slow
def test_two_process_ddp_fit_partial_chunk(store, ddp_run):
    assert (ddp_run / "done-fit-0").exists() and (ddp_run / "done-fit-1").exists()
    record = json.loads((ddp_run / "rows.json").read_text())
    assert record["world_size"] == 2
    epochs = record["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1] and [e["loader_epoch"] for e in epochs] == [0, 1]
    fit_rows = 8 * CHUNK  # the fitting part: whole chunks; the partial chunk went to validation
    per_rank_batches = fit_rows // (2 * 8)
    for e in epochs:
        r0, r1 = (set(r) for r in e["rows"])
        assert e["batches"] == [per_rank_batches, per_rank_batches]
        assert len(r0) == len(e["rows"][0]) == per_rank_batches * 8
        assert not r0 & r1, "ranks must see disjoint rows within an epoch"
        assert r0 | r1 <= set(range(fit_rows))
    for rank in (0, 1):
        assert epochs[0]["rows"][rank] != epochs[1]["rows"][rank]
        assert set(epochs[0]["rows"][rank]) != set(epochs[1]["rows"][rank]), "the partition must change per epoch"
    # the rows each rank saw are exactly the plan's (computed here without any process group)
    ds = ZarrIterableDataset(store, seed=11, buffer_chunks=2, return_index=True, row_range=(0, fit_rows))
    loader = ZarrDataLoader(ds, batch_size=8, drop_last=True, rank=0, world_size=2)
    for e in epochs:
        for rank in (0, 1):
            expected = np.concatenate(loader.batch_row_ids(epoch=e["epoch"], rank=rank, world_size=2))
            np.testing.assert_array_equal(e["rows"][rank], expected)
    history = json.loads((ddp_run / "history.json").read_text())
    assert history["world_size"] == 2 and len(history["history"]) == 2
    assert all("val_skill" in h for h in history["history"])  # validation: partial chunk, padded across ranks

    # training over the partial last chunk itself
    assert (ddp_run / "done-bare-0").exists() and (ddp_run / "done-bare-1").exists()
    bare = json.loads((ddp_run / "rows_bare.json").read_text())["epochs"]
    ds = ZarrIterableDataset(store, seed=12, buffer_chunks=2, return_index=True)
    planner = ZarrDataLoader(ds, batch_size=8, drop_last=True, rank=0, world_size=2)
    per_rank = ROWS // (2 * 8)
    for e in bare:
        assert e["batches"] == [per_rank, per_rank]
        assert not set(e["rows"][0]) & set(e["rows"][1])
        for rank in (0, 1):
            expected = np.concatenate(planner.batch_row_ids(epoch=e["epoch"], rank=rank, world_size=2))
            np.testing.assert_array_equal(e["rows"][rank], expected)
    assert [e["loader_epoch"] for e in bare] == [0, 1]
    assert any(r >= 9 * CHUNK for e in bare for rows in e["rows"] for r in rows)  # the partial chunk is read
    for rank in (0, 1):
        assert set(bare[0]["rows"][rank]) != set(bare[1]["rows"][rank])


# -- validation under DDP: every row counted once ------------------------------------------------------------
@pytest.mark.slow
def test_validation_under_ddp_counts_each_row_once(ddp_run):
    """15 validation rows on 2 ranks: the padding row (repeated so that both ranks get 2 batches) is left out of
    the mean; it was once counted (16 rows, one twice). The ranks are those of ``ddp_run``, after its fits."""
    store = ddp_run / "v.zarr"
    got = json.loads((ddp_run / "val.json").read_text())
    assert got["val_rows"] == 15
    group = zarr.open_group(str(store), mode="r")
    fields, target = group["fields"][9 * CHUNK :], group["target"][9 * CHUNK :]
    stats = channel_stats(store, n_chunks=2, stop_row=9 * CHUNK)
    persistence = fields[:, stats["persistence_channel"]]
    expected = float(np.mean((persistence.astype(np.float64) - target) ** 2))
    assert got["persistence_mse"] == pytest.approx(expected, rel=1e-6)


def test_building_the_datamodule_does_not_touch_cuda(store, monkeypatch):
    """``torch.cuda.is_available()`` in ``__init__`` initialised CUDA in the notebook's process, and
    ``ddp_notebook``'s fork then failed ("Cannot re-initialize CUDA in forked subprocess") on a hub with GPUs;
    pinning is decided in the rank, from its strategy's device."""

    def touched():
        raise AssertionError("CUDA queried while building the DataModule")

    monkeypatch.setattr(torch.cuda, "is_available", touched)
    dm = ZarrDataModule(store, batch_size=8)
    assert dm._pinned() is False  # no trainer yet: nothing to pin for
    trainer = quiet_trainer(max_epochs=1)
    dm.trainer = trainer
    assert dm._pinned() is False  # a CPU strategy
    assert ZarrDataModule(store, batch_size=8, pin_memory=True)._pinned() is True


def test_the_datamodule_sees_its_trainer(tmp_path):
    """The DataModule looked for its trainer as ``_trainer``, which LightningDataModule does not have: it never
    pinned memory for a CUDA rank, and never told the loader how many batches the trainer had consumed."""
    from types import SimpleNamespace

    from zarrtorch.lightning import _TrainedBatches

    dm = ZarrDataModule(make_store(tmp_path / "d.zarr"), batch_size=4)
    assert dm._loader_kwargs()["pin_memory"] is False  # no trainer yet
    progress = SimpleNamespace(current=SimpleNamespace(processed=7))
    for device, pinned in (("cuda", True), ("cpu", False)):
        dm.trainer = SimpleNamespace(
            strategy=SimpleNamespace(root_device=torch.device(device)),
            state=SimpleNamespace(fn="fit"),
            fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
        )
        assert dm._loader_kwargs()["pin_memory"] is pinned
    assert _TrainedBatches(dm)() == 7


def test_datamodule_takes_the_static_arrays_among_the_variables_as_the_dataset_does(tmp_path):
    """``ZarrDataModule(variables=[..., "orography"], windows=Windows(static=("orography",)))``: the dataset takes
    a static array out of the time arrays, but the DataModule checked the first-axis layout of every variable first
    and refused the arrays it had just been given ("'orography' has 4 rows")."""
    from zarrtorch import Windows

    src = make_store(tmp_path / "train.zarr")
    group = zarr.open_group(str(src), mode="a")
    group.create_array("orography", data=np.arange(4, dtype=np.float32))
    with warnings.catch_warnings():  # zarr: consolidated metadata is not in the v3 spec (prepare_zarr writes it)
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(src))
    windows = Windows(history=2, lead=1, inputs=("fields",), targets=("target",), static=("orography",))
    dm = ZarrDataModule(src, batch_size=8, variables=["fields", "target", "orography"], windows=windows)
    batch = next(iter(dm.train_dataloader()))
    np.testing.assert_array_equal(batch["orography"][0].numpy(), np.arange(4, dtype=np.float32))
    assert batch["fields"].shape[1] == 2 and batch["target_target"].shape[1] == 1


def test_the_dates_are_described_without_xarray(tmp_path, monkeypatch):
    """The dates come from the ``time`` coordinate's CF encoding, decoded without xarray: opening the store with
    xarray for four dates cost every training command about a second of imports at its start."""
    import pandas as pd
    import xarray as xr

    rows = 4 * CHUNK
    time = pd.date_range("1999-12-31 18:00", periods=rows, freq="6h")
    ds = xr.Dataset({"fields": (("time", "x"), np.zeros((rows, 4), np.float32))}, coords={"time": time})
    src = tmp_path / "train.zarr"
    prepare_zarr(ds, src, chunk_rows=CHUNK, progress=False)
    dm = ZarrDataModule(src, val_fraction=0.25)
    monkeypatch.setitem(sys.modules, "xarray", None)  # import xarray now raises ImportError
    text = dm.describe()
    first_val, last = (str(time.values[r])[:10] for r in (3 * CHUNK, rows - 1))
    assert f"fit 1999-12-31 .. {str(time.values[3 * CHUNK - 1])[:10]}, validate {first_val} .. {last}" in text


@pytest.mark.parametrize(
    "units",
    [
        "hours since 2000-01-01",
        "days since 1979-01-01 00:00:00",
        "seconds since 1970-01-01T06:00:00Z",
        "minutes since 2000-03-01 12:30",
    ],
)
def test_cf_times_decode_as_xarray_decodes_them(units):
    import xarray as xr

    from zarrtorch.lightning import cf_datetimes

    for values in (np.array([0, 1, 59, 1439, 100_000], dtype=np.int64), np.array([0.0, 1.5, 59.25, 1e5])):
        ours = cf_datetimes(values, units, "proleptic_gregorian")
        theirs = xr.decode_cf(xr.Dataset({"t": ("n", values, {"units": units, "calendar": "standard"})}))["t"].values
        # to the minute: below a second xarray truncates and this rounds (1.5 s), dates are printed to the day
        np.testing.assert_array_equal(ours.astype("datetime64[m]"), theirs.astype("datetime64[m]"))


@pytest.mark.parametrize(
    "values,units,calendar",
    [
        ([1], "days since 2000-01-01", "noleap"),
        ([np.nan], "days since 2000-01-01", None),
        ([1], "fortnights since 2000-01-01", None),
        ([1], "days", None),
        ([1], "days since 2000-01-01 00:00 +05:00", None),
        ([1], "days since 1500-01-01", "standard"),  # Julian dates in CF's standard calendar
    ],
)
def test_what_cf_datetimes_does_not_decode_is_left_to_xarray(values, units, calendar):
    from zarrtorch.lightning import cf_datetimes

    assert cf_datetimes(np.array(values), units, calendar) is None


@pytest.mark.parametrize("dtype", ["int32", "float64"])
def test_an_era5_like_time_in_hours_since_1900_is_described(tmp_path, dtype):
    """Breaking it as a user: a store converted from ERA5's netCDF files keeps its time as hours since 1900, int32
    or float64, in a plain Zarr group xarray cannot open (no dimension names). The float64 one printed no dates
    (neither this decoding nor xarray took it); both give them now."""
    import pandas as pd
    import zarr

    rows = 8 * CHUNK
    time = pd.date_range("1979-01-01", periods=rows, freq="6h")
    group = zarr.open_group(tmp_path / "era5.zarr", mode="w")
    hours = ((time - pd.Timestamp("1900-01-01")) / pd.Timedelta("1h")).values.astype(dtype)
    group.create_array("time", data=hours).attrs.update(units="hours since 1900-01-01 00:00:00.0", calendar="gregorian")
    group.create_array("fields", data=np.zeros((rows, 4), np.float32), chunks=(CHUNK, 4))
    text = ZarrDataModule(tmp_path / "era5.zarr", val_fraction=0.25, variables=["fields"]).describe()
    first_val, last = (str(time.values[r])[:10] for r in (6 * CHUNK, rows - 1))
    assert f"fit 1979-01-01 .. {str(time.values[6 * CHUNK - 1])[:10]}, validate {first_val} .. {last}" in text
