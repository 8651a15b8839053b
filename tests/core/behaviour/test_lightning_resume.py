"""Mid-epoch checkpoints through Lightning: ``trainer.fit(ckpt_path=...)`` continues the epoch exactly on the
same number of devices, and elastically on another one (2 CPU processes -> 3), with the rows of the rest
neither lost nor read twice. Lightning fetches a batch ahead; the saved loader position is the trained one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_lightning import CHUNK, make_store  # noqa: I001  (tests/core is on sys.path under pytest)

from zarrtorch import ZarrIterableDataset

SCRIPT = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from zarrtorch.lightning import ZarrDataModule
from zarrtorch.course.models import ForecastModule, channel_stats

store, out, devices, phase = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
flags = sys.argv[5].split(",") if len(sys.argv) > 5 else []
bare = "bare" in flags  # a ZarrDataLoader handed to fit(), not the DataModule
torch.set_num_threads(1)


class Rows(L.Callback):
    def __init__(self):
        self.rows, self.epochs = [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.rows.append(batch["index"].tolist())
        self.epochs.append(trainer.current_epoch)
        with open(f"{out}/rows_{phase}_{trainer.global_rank}.json", "w") as f:
            json.dump({"epoch": trainer.current_epoch, "rows": self.rows, "epochs": self.epochs,
                       "len": len(trainer.train_dataloader)}, f)


dm = ZarrDataModule(store, batch_size=16 if "batch16" in flags else 8, return_index=True, seed=11, buffer_chunks=2)
model = ForecastModule(channel_stats(dm.store, n_chunks=2, stop_row=dm.split_plan.split_row), hidden=4, depth=2)
kw = dict(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", max_epochs=1,
          limit_val_batches=0, num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
          logger=False, default_root_dir=out)
data = dict(datamodule=dm)
if bare:
    dm.setup("fit")
    from zarrtorch import ZarrDataLoader
    data = dict(train_dataloaders=ZarrDataLoader(dm.train_dataset, batch_size=8, drop_last=True))
if phase == "first":  # a job that ends after 3 steps, with a checkpoint there (as at a time limit)
    ckpt = ModelCheckpoint(dirpath=f"{out}/ckpt", every_n_train_steps=3, save_last=True, save_top_k=0)
    trainer = L.Trainer(max_steps=3, callbacks=[Rows(), ckpt], **kw)
    trainer.fit(model, **data)
elif phase == "last":  # a whole epoch, checkpointed by step count at its last batch
    dm.setup("fit")
    from zarrtorch import ZarrDataLoader
    n = len(ZarrDataLoader(dm.train_dataset, batch_size=8, drop_last=True, rank=0, world_size=devices))
    ckpt = ModelCheckpoint(dirpath=f"{out}/ckpt", every_n_train_steps=n, save_last=True, save_top_k=0)
    trainer = L.Trainer(max_steps=n, callbacks=[Rows(), ckpt], **kw)
    trainer.fit(model, **data)
elif phase == "epoch":  # a whole epoch, checkpointed at its end (the course CLI's default)
    ckpt = ModelCheckpoint(dirpath=f"{out}/ckpt", save_last=True, save_top_k=0)
    trainer = L.Trainer(callbacks=[Rows(), ckpt], **kw)
    trainer.fit(model, **data)
else:  # "second" continues the first's epoch, "next" trains the epoch after the checkpointed one, "two" both
    kw["max_epochs"] = 2 if phase in ("next", "two") else 1
    trainer = L.Trainer(callbacks=[Rows()], enable_checkpointing=False, **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, **data, ckpt_path=f"{out}/ckpt/last.ckpt")
    with open(f"{out}/warnings_{phase}_{trainer.global_rank}.json", "w") as f:
        json.dump([str(w.message) for w in caught if "ZarrDataLoader" in str(w.message)], f)
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return make_store(tmp_path_factory.mktemp("lightning_resume") / "data.zarr", rows=24 * CHUNK)


def fit(store, out, devices, phase, bare=False, flags=(), check=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    script = out / "fit.py"
    script.write_text(SCRIPT)
    flags = ",".join([*flags, "bare"] if bare else flags)
    args = [sys.executable, str(script), str(store), str(out), str(devices), phase] + ([flags] if flags else [])
    proc = subprocess.run(args, cwd=out, env=env, capture_output=True, text=True, timeout=300)
    if not check:
        return proc
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rows_{phase}_{r}.json").read_text()) for r in range(devices)]


@pytest.fixture(scope="module")
def first_on_1(store, tmp_path_factory) -> Path:
    """3 steps on 1 device and their checkpoint: the interrupted job that two tests resume, run once."""
    out = tmp_path_factory.mktemp("first_on_1")
    fit(store, out, 1, "first")
    return out


@pytest.fixture(scope="module")
def first_on_2(store, tmp_path_factory) -> Path:
    """3 steps on 2 devices (DDP) and their checkpoint: the interrupted job that two tests resume, run once."""
    out = tmp_path_factory.mktemp("first_on_2")
    fit(store, out, 2, "first")
    return out


def interrupted(first: Path, out: Path, devices: int) -> list[dict]:
    """A copy of an interrupted job's folder (checkpoint, rows) in ``out``, which a test resumes on its own, and
    the rows it trained; the same rows as running it there (its script, store and seed are fixed)."""
    shutil.copytree(first, out, dirs_exist_ok=True)
    return [json.loads((out / f"rows_first_{r}.json").read_text()) for r in range(devices)]


@pytest.mark.slow
def test_same_devices_resume_is_exact(store, first_on_1, tmp_path):
    first = interrupted(first_on_1, tmp_path, 1)
    second = fit(store, tmp_path, 1, "second")
    rows = first[0]["rows"] + second[0]["rows"]
    fit_rows = 24 * CHUNK - round(0.2 * 24) * CHUNK
    ds = ZarrIterableDataset(store, seed=11, buffer_chunks=2, row_range=(0, fit_rows))
    expected = ds.batch_row_ids(epoch=0, batch_size=8, drop_last=True)
    assert len(first[0]["rows"]) == 3 and len(rows) == len(expected)
    assert all(np.array_equal(a, b) for a, b in zip(rows, expected, strict=True))


@pytest.mark.slow
def test_resume_on_more_devices(store, first_on_2, tmp_path):
    first = interrupted(first_on_2, tmp_path, 2)
    second = fit(store, tmp_path, 3, "second")
    assert [len(r["rows"]) for r in first] == [3, 3]
    counts = {len(r["rows"]) for r in second}
    assert len(counts) == 1, "every new rank trains the same number of batches"
    assert {r["len"] for r in second} == {3 + counts.pop()}
    before = [x for r in first for b in r["rows"] for x in b]
    after = [x for r in second for b in r["rows"] for x in b]
    assert len(set(before)) == len(before) and len(set(after)) == len(after)
    assert not set(before) & set(after), "a row trained before the interruption was trained again"
    fit_rows = 24 * CHUNK - round(0.2 * 24) * CHUNK
    assert set(before) | set(after) <= set(range(fit_rows))
    assert fit_rows - len(before) - len(after) < 3 * 8  # left out: less than one batch per new rank


@pytest.mark.slow
def test_resume_from_an_epoch_end_checkpoint_trains_the_next_epoch(store, tmp_path):
    """``last.ckpt`` saved at an epoch's end (ZarrDataModule): the resumed run once trained 0 rows; it trains
    the next epoch, whole, in that epoch's order."""
    first = fit(store, tmp_path, 1, "epoch")
    second = fit(store, tmp_path, 1, "next")
    fit_rows = 24 * CHUNK - round(0.2 * 24) * CHUNK
    ds = ZarrIterableDataset(store, seed=11, buffer_chunks=2, row_range=(0, fit_rows))
    for epoch, run in ((0, first[0]), (1, second[0])):
        expected = ds.batch_row_ids(epoch=epoch, batch_size=8, drop_last=True)
        assert run["epoch"] == epoch and len(run["rows"]) == len(expected)
        assert all(np.array_equal(a, b) for a, b in zip(run["rows"], expected, strict=True))
    assert json.loads((tmp_path / "warnings_next_0.json").read_text()) == []


@pytest.mark.slow
def test_a_bare_loader_resumed_at_an_epoch_end_says_what_it_trains(store, tmp_path):
    """A bare ZarrDataLoader: Lightning does not restore a loader's position when it resumes at an epoch's end
    (no validation since), and calls set_epoch(1) after it began iterating epoch 0. The epoch still trains every
    row once (in epoch 0's order), and a warning names the cause and the fix (once, silently)."""
    fit(store, tmp_path, 1, "epoch", bare=True)
    second = fit(store, tmp_path, 1, "next", bare=True)[0]
    rows = [r for batch in second["rows"] for r in batch]
    assert second["epoch"] == 1 and len(rows) == len(set(rows)) == len(second["rows"]) * 8
    (message,) = json.loads((tmp_path / "warnings_next_0.json").read_text())
    assert "set_epoch(1) came after the iteration over epoch 0 began" in message and "ZarrDataModule" in message


@pytest.mark.slow
def test_a_refused_state_shows_its_own_message_under_lightning(store, first_on_1, tmp_path):
    """A mid-epoch checkpoint resumed with another batch size: the loader's refusal, naming the setting, is
    what the user sees (it was once hidden behind Lightning's "Please call iter(combined_loader) first")."""
    interrupted(first_on_1, tmp_path, 1)
    proc = fit(store, tmp_path, 1, "second", flags=["batch16"], check=False)
    assert proc.returncode != 0
    assert "batch_size: saved 8, now 16" in proc.stderr, proc.stderr[-3000:]
    assert "Please call iter(combined_loader) first" not in proc.stderr


def epoch_rows(run: dict, epoch: int) -> list[list[int]]:
    return [rows for rows, e in zip(run["rows"], run["epochs"], strict=True) if e == epoch]


@pytest.mark.slow
def test_resume_on_fewer_devices_then_whole_epochs(store, first_on_2, tmp_path):
    """2 ranks -> 1: the resumed epoch is 17 batches long on one rank, the next ones 20. Lightning counts an
    epoch's batches once, at its first loader, and stopped every later epoch at 17: 3 batches of each epoch
    never trained, silently. The DataModule now has the loader built again after the resumed epoch."""
    first = interrupted(first_on_2, tmp_path, 2)
    (second,) = fit(store, tmp_path, 1, "two")
    fit_rows = 24 * CHUNK - round(0.2 * 24) * CHUNK
    before = [x for r in first for b in r["rows"] for x in b]
    resumed = [x for b in epoch_rows(second, 0) for x in b]
    assert len(set(before + resumed)) == len(before + resumed), "a row of epoch 0 trained twice"
    assert fit_rows - len(before) - len(resumed) < 8
    ds = ZarrIterableDataset(store, seed=11, buffer_chunks=2, row_range=(0, fit_rows))
    expected = ds.batch_row_ids(epoch=1, batch_size=8, drop_last=True)
    got = epoch_rows(second, 1)
    assert len(got) == len(expected), f"epoch 1 trained {len(got)} of its {len(expected)} batches"
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.slow
def test_a_checkpoint_at_an_epochs_last_batch_resumed_on_fewer_devices(store, tmp_path):
    """A step-count checkpoint that falls on epoch 0's last batch, on 2 ranks, resumed on 1: Lightning resumed
    it as epoch 1 but kept its batch counter (the 2-rank epoch's length, half the 1-rank one) and trained only
    the first half of epoch 1, silently. Now it trains every batch of epoch 1 (each row once; the order is that of
    an epoch resumed on another topology, as the model-based test has it), and nothing of epoch 0."""
    first = fit(store, tmp_path, 2, "last")
    (second,) = fit(store, tmp_path, 1, "two")
    fit_rows = 24 * CHUNK - round(0.2 * 24) * CHUNK
    assert sum(len(r["rows"]) for r in first) * 8 > fit_rows - 2 * 8  # epoch 0, whole, on 2 ranks
    ds = ZarrIterableDataset(store, seed=11, buffer_chunks=2, row_range=(0, fit_rows))
    expected = ds.batch_row_ids(epoch=1, batch_size=8, drop_last=True)
    assert set(second["epochs"]) == {1}
    got = second["rows"]
    assert len(got) == len(expected), f"epoch 1 trained {len(got)} of its {len(expected)} batches"
    rows = [x for b in got for x in b]
    assert len(set(rows)) == len(rows) and set(rows) == {x for b in expected for x in b.tolist()}
