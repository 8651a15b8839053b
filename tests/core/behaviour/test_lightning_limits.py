"""Lightning's batch limits, resumed: a run stopped and resumed from its last checkpoint trains the batches the
uninterrupted run trains, epoch after epoch, whatever limits the trainer sets (``limit_train_batches`` as a count
or a share, ``limit_val_batches``, ``val_check_interval``, ``max_steps`` in the middle of an epoch) and wherever
the checkpoint falls (at an epoch's end, at a step count, after a validation)."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint
from test_lightning import make_store, quiet_trainer  # noqa: I001  (tests/core is on sys.path under pytest)

from zarrtorch.course.models import ForecastModule, channel_stats
from zarrtorch.lightning import ZarrDataModule, trained_per_epoch

CHUNK = 16


class Rows(L.Callback):
    """The rows of every trained batch, by epoch."""

    def __init__(self):
        self.rows: dict[int, list[list[int]]] = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.rows.setdefault(trainer.current_epoch, []).append(batch["index"].tolist())


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("limits") / "s.zarr", rows=24 * CHUNK)


def fit(store, *, ckpt_path=None, callbacks=(), **trainer_kw) -> dict[int, list[list[int]]]:
    L.seed_everything(0, verbose=False)
    dm = ZarrDataModule(store, batch_size=8, return_index=True, seed=3, buffer_chunks=2)
    model = ForecastModule(channel_stats(dm.store, n_chunks=2, stop_row=dm.split_plan.split_row), hidden=4, depth=2)
    rows = Rows()
    trainer_kw.setdefault("enable_checkpointing", bool(callbacks))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=".*(does not have many workers|LeafSpec|val_dataloader|__len__).*")
        quiet_trainer(callbacks=[rows, *callbacks], **trainer_kw).fit(model, datamodule=dm, ckpt_path=ckpt_path)
    # the data module keeps the position: no warning telling its user to use it (a resumed limited epoch's end
    # was taken for an iteration that set_epoch came late to: "use zarrtorch.lightning.ZarrDataModule")
    late = [str(w.message) for w in caught if "came after the iteration" in str(w.message)]
    assert not late, late
    return rows.rows


CASES = {
    # limit_train_batches=4: the loader's epoch never ends, so the checkpoint at step 4 recorded "epoch 0, 4 of 36
    # batches" and the resumed "epoch 1" trained batches 4-7 of epoch 0
    "4 batches, checkpoint at the limit's step": (dict(limit_train_batches=4, limit_val_batches=0), {"steps": 4}),
    "a quarter, checkpoint at the epoch's end": (dict(limit_train_batches=0.25, limit_val_batches=2), {}),
    "a quarter, checkpoint mid-epoch": (dict(limit_train_batches=0.25, limit_val_batches=0), {"steps": 4}),
    "validation every 3 batches, checkpoint after one": (
        dict(limit_train_batches=8, limit_val_batches=1, val_check_interval=3),
        {"steps": 3},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_resumed_run_trains_the_uninterrupted_runs_batches(store, tmp_path, case):
    limits, checkpoint = CASES[case]
    whole = fit(store, max_epochs=3, **limits)
    every = dict(every_n_train_steps=checkpoint["steps"]) if "steps" in checkpoint else {}
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0, **every)
    first = fit(store, max_epochs=1, callbacks=[saver], **limits)
    second = fit(store, max_epochs=3, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"), **limits)
    assert first[0] == whole[0]
    resumed_at = len(whole[0]) - len(second.get(0, []))  # the batches of epoch 0 the checkpoint held as trained
    assert second.get(0, []) == whole[0][resumed_at:]
    assert second[1] == whole[1] and second[2] == whole[2]


def test_max_steps_in_the_middle_of_an_epoch_resumes_there(store, tmp_path):
    whole = fit(store, max_epochs=2, limit_val_batches=0)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0, every_n_train_steps=5)
    first = fit(store, max_steps=5, callbacks=[saver], limit_val_batches=0)
    second = fit(store, max_epochs=2, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"), limit_val_batches=0)
    assert first[0] + second[0] == whole[0] and second[1] == whole[1]


def test_trained_per_epoch_rounds_as_lightning_does():
    assert trained_per_epoch(36, 4) == 4 and trained_per_epoch(3, 4) == 3
    assert trained_per_epoch(36, 0.25) == 9 and trained_per_epoch(36, 1.0) == 36 and trained_per_epoch(10, 0.15) == 1
