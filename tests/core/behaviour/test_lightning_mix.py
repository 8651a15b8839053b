"""A mix of stores under Lightning (``zarrtorch.lightning.MixedDataModule``): a Trainer fits on per-source batches
that say their source, each source's rows once per epoch; a run interrupted mid-epoch or at a
``limit_train_batches`` epoch's end and resumed from its checkpoint trains the uninterrupted run's batches; two DDP
ranks draw the same source at every step, and their job resumed on one device trains every row once."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import zarr
from lightning.pytorch.callbacks import ModelCheckpoint
from test_lightning import CHUNK, make_store, quiet_trainer, run_script  # noqa: I001  (tests/core is on sys.path)

from zarrtorch.lightning import MixedDataModule, ZarrDataModule

BATCH = 8
CHUNKS = {"era": 8, "cerra": 4}  # a quarter of each validates: era fits on 96 rows, cerra on 48


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("lightning_mix")
    return {
        name: make_store(root / f"{name}.zarr", rows=n * CHUNK, seed=i) for i, (name, n) in enumerate(CHUNKS.items())
    }


def mixed_data(stores, **mix) -> MixedDataModule:
    sources = {
        name: ZarrDataModule(path, batch_size=BATCH, return_index=True, seed=3, buffer_chunks=2, val_fraction=0.25)
        for name, path in stores.items()
    }
    return MixedDataModule(sources, seed=7, **mix)


class OneHead(L.LightningModule):
    """A tiny model; remembers which sources' validation loaders it was given (``dataloader_idx``)."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, 1)
        self.validated: set[int] = set()

    def training_step(self, batch, batch_idx):
        x, y = batch["fields"].mean(dim=(2, 3)), batch["target"].mean(dim=(1, 2))
        return torch.nn.functional.mse_loss(self.head(x).squeeze(1), y)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.validated.add(dataloader_idx)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Batches(L.Callback):
    """(source, rows) of every trained batch, by epoch."""

    def __init__(self):
        self.batches: dict[int, list[tuple[str, list[int]]]] = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.batches.setdefault(trainer.current_epoch, []).append((batch["source"], batch["index"].tolist()))


def fit(stores, *, ckpt_path=None, callbacks=(), model=None, **trainer_kw) -> dict[int, list[tuple[str, list[int]]]]:
    L.seed_everything(0, verbose=False)
    seen = Batches()
    trainer_kw.setdefault("enable_checkpointing", any(isinstance(c, ModelCheckpoint) for c in callbacks))
    trainer_kw.setdefault("limit_val_batches", 0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(does not have many workers|LeafSpec|val_dataloader|__len__).*")
        trainer = quiet_trainer(callbacks=[seen, *callbacks], **trainer_kw)
        trainer.fit(model or OneHead(), datamodule=mixed_data(stores), ckpt_path=ckpt_path)
    return seen.batches


class FromItsSource(L.Callback):
    """Checks every trained batch's rows against the store its ``"source"`` names."""

    def __init__(self, stores):
        self.fields = {name: zarr.open_group(str(path), mode="r")["fields"] for name, path in stores.items()}
        self.checked = 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        stored = self.fields[batch["source"]][batch["index"].numpy()]
        np.testing.assert_array_equal(batch["fields"].numpy(), stored)
        self.checked += 1


def test_a_trainer_fits_two_epochs_on_per_source_batches_that_say_their_source(stores):
    model, checked = OneHead(), FromItsSource(stores)
    epochs = fit(stores, max_epochs=2, model=model, callbacks=[checked], limit_val_batches=1.0)
    for e in (0, 1):
        rows = {name: [] for name in stores}
        for source, index in epochs[e]:
            rows[source] += index
        # the default mix: every source's fitting rows once per epoch, in batches of one source
        assert sorted(rows["era"]) == list(range(96)) and sorted(rows["cerra"]) == list(range(48))
    assert checked.checked == 2 * (96 + 48) // BATCH
    assert [s for s, _ in epochs[0]] != [s for s, _ in epochs[1]]  # a new order of sources every epoch
    assert model.validated == {0, 1}  # every source's validation loader, dataloader_idx its index in names


def test_bad_mix_arguments_are_refused_when_the_data_module_is_built(stores):
    def source(name, **kw):
        return ZarrDataModule(stores[name], **{"batch_size": BATCH, "val_fraction": 0.25, **kw})

    with pytest.raises(ValueError, match="other batch sizes"):
        MixedDataModule({"era": source("era"), "cerra": source("cerra", batch_size=4)})
    with pytest.raises(ValueError, match="weights must name every source once"):
        MixedDataModule({"era": source("era"), "cerra": source("cerra")}, weights={"era": 1, "cera": 1})
    with pytest.raises(TypeError, match="source 'cerra' must be a zarrtorch.lightning.ZarrDataModule"):
        MixedDataModule({"era": source("era"), "cerra": str(stores["cerra"])})
    one = source("era")
    with pytest.raises(ValueError, match="a ZarrDataModule is given as two sources"):
        MixedDataModule({"era": one, "again": one})


def fit_module(data, ckpt_path=None, **trainer_kw) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(does not have many workers|LeafSpec|val_dataloader|__len__).*")
        checkpointing = "callbacks" in trainer_kw
        trainer_kw = {"max_epochs": 1, "limit_val_batches": 0, "enable_checkpointing": checkpointing, **trainer_kw}
        quiet_trainer(**trainer_kw).fit(OneHead(), datamodule=data, ckpt_path=ckpt_path)


def a_single_store_module(stores) -> ZarrDataModule:
    return ZarrDataModule(stores["era"], batch_size=BATCH, seed=3, buffer_chunks=2, val_fraction=0.25)


@pytest.mark.parametrize("saved_with", ["ZarrDataModule", "MixedDataModule"])
def test_a_checkpoint_of_the_other_data_module_is_refused_not_resumed_from_the_start(stores, tmp_path, saved_with):
    """Lightning keeps a data module's state under its class name and loads nothing into a data module of another
    class: a ZarrDataModule's checkpoint resumed with a MixedDataModule (and the reverse) trained the mix from its
    start, silently, at the checkpoint's epoch."""
    single, mixed = a_single_store_module(stores), mixed_data(stores)
    saving, resuming = (single, mixed) if saved_with == "ZarrDataModule" else (mixed, single)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0)
    fit_module(saving, callbacks=[saver], limit_train_batches=2)
    with pytest.raises(ValueError, match=f"holds no {type(resuming).__name__} state.*saved with another data module"):
        fit_module(resuming, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"), max_epochs=2, limit_train_batches=2)


CASES = {
    # epoch 1 after the resume drew the sources' epoch-0 rows again (the reload after a resumed epoch built a fresh
    # mix); with a limit, the limited epoch ran again (no set_epoch reached the mix)
    "mid-epoch, 5 steps": (dict(max_epochs=2), 5),
    "limit_train_batches=5, checkpoint at the limit's step": (dict(max_epochs=3, limit_train_batches=5), 5),
    "limit_train_batches=8, checkpoint mid-epoch": (dict(max_epochs=3, limit_train_batches=8), 3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_resumed_mix_trains_the_uninterrupted_runs_batches(stores, tmp_path, case):
    limits, steps = CASES[case]
    whole = fit(stores, **limits)
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0, every_n_train_steps=steps)
    first = fit(stores, callbacks=[saver], **{**limits, "max_steps": steps})
    second = fit(stores, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"), **limits)
    if "limit_train_batches" in limits:
        assert all(len(batches) == limits["limit_train_batches"] for batches in whole.values())
    assert first[0] + second.get(0, []) == whole[0]
    assert all(second[e] == whole[e] for e in range(1, limits["max_epochs"]))


DDP_SCRIPT = """
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
sys.path.insert(0, {here!r})
from test_lightning_mix import Batches, OneHead, mixed_data


if __name__ == "__main__":
    stores, out = json.loads(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    seen = Batches()
    # a checkpoint every 3 steps: the test resumes the one at step 3 on one device
    saver = ModelCheckpoint(dirpath=out + "/ckpt", filename="{{step}}", every_n_train_steps=3, save_top_k=-1)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False, limit_val_batches=0,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[seen, saver])
    trainer.fit(OneHead(), datamodule=mixed_data(stores))
    with open(f"{{out}}/rank{{trainer.global_rank}}.json", "w") as f:
        json.dump({{str(e): b for e, b in seen.batches.items()}}, f)
"""


@pytest.mark.slow
def test_two_ddp_ranks_draw_the_same_source_at_every_step(stores, tmp_path):
    """Lightning's DDP (gloo, 2 CPU processes): the ranks' sources agree step by step; the default mix gives each
    source's fitting rows once per epoch, split between the ranks. A job of 2 ranks stopped after 3 steps and
    resumed on one device trains every row of the epoch once: resumed with its count of 3 steps, Lightning took the
    rest of a len() that left them out, and stopped 3 steps short."""
    script = tmp_path / "mix_ddp.py"
    script.write_text(DDP_SCRIPT.format(here=str(Path(__file__).parent)))
    run_script(script, json.dumps({name: str(path) for name, path in stores.items()}), tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert list(ranks[0]) == ["0", "1"]
    fitting_rows = {name: list(range(CHUNKS[name] * 3 // 4 * CHUNK)) for name in CHUNKS}
    for e in ("0", "1"):
        sources = [[s for s, _ in r[e]] for r in ranks]
        assert sources[0] == sources[1] and set(sources[0]) == {"era", "cerra"}
        for name in CHUNKS:
            a, b = ({i for s, idx in r[e] if s == name for i in idx} for r in ranks)
            assert not a & b, f"epoch {e}, {name}: both ranks drew rows {sorted(a & b)[:5]}"
            assert sorted(a | b) == fitting_rows[name]

    stopped = [r["0"][:3] for r in ranks]  # the job stopped after its checkpoint at step 3
    resumed = fit(stores, ckpt_path=str(tmp_path / "ckpt" / "step=3.ckpt"), max_epochs=2)
    for name in CHUNKS:
        rows = [i for batches in [*stopped, resumed[0]] for s, idx in batches if s == name for i in idx]
        assert sorted(rows) == fitting_rows[name], name
