"""Lightning callbacks the course uses to look inside training runs, and a switch for Lightning's chatter.

``RowRecorder`` records which rows every rank trained on (lessons 05-06 check them against the plan);
``HistoryWriter`` gets results out of DDP processes a notebook cannot see; ``DataWait`` measures how long the training
loop waited for data; ``quiet_lightning`` hides start-up notices that teach nothing in a notebook.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import torch

from zarrtorch.course.say import say


def quiet_lightning() -> None:
    """Silence Lightning's start-up notices and the warnings that do not apply to a ``ZarrDataLoader``.

    Hidden: the GPU/TPU availability lines and tips (information, not warnings); "IterableDataset has
    ``__len__``" (the loader's length is exact: every worker knows its own share); "does not have many
    workers" (``num_workers=0`` is a choice here: decoding runs in threads of the main process); a
    deprecation inside Lightning itself. Real warnings still show.
    """
    import logging

    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*`IterableDataset` has `__len__` defined.*")
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings("ignore", message=r".*no `val_dataloader`.*")


class RowRecorder(L.Callback):
    """Record, every epoch, the row numbers each rank trained on (the batches need ``"index"``:
    ``return_index=True``) and the loader's epoch; gathered on every rank, written by rank 0 to ``path``
    (JSON) at the end of ``fit``.

    ``epochs`` is a list of ``{"epoch", "loader_epoch", "rows": [rows of rank 0, rows of rank 1, ...]}``.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else None
        self.epochs: list[dict] = []
        self._rows: list[np.ndarray] = []
        self._loader_epoch: int | None = None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._rows = []
        self._loader_epoch = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if batch_idx == 0:
            loader = trainer.train_dataloader
            self._loader_epoch = getattr(loader, "epoch", None)
        if isinstance(batch, dict) and "index" in batch:
            self._rows.append(batch["index"].detach().cpu().numpy().astype(np.int64))

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        from zarrtorch.course.requeue import Requeued

        if isinstance(exception, Requeued):  # every rank stops at the same step: record the epoch so far
            self.on_train_epoch_end(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        local = np.concatenate(self._rows) if self._rows else np.zeros(0, dtype=np.int64)
        batches = len(self._rows)
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            gathered: list = [None] * trainer.world_size
            torch.distributed.all_gather_object(gathered, (local.tolist(), batches))
            rows = [r for r, _ in gathered]
            batch_counts = [b for _, b in gathered]
        else:
            rows, batch_counts = [local.tolist()], [batches]
        self.epochs.append(
            {
                "epoch": int(trainer.current_epoch),
                "loader_epoch": self._loader_epoch,
                "batches": [int(b) for b in batch_counts],
                "rows": rows,
            }
        )

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.path is not None and trainer.is_global_zero:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({"world_size": trainer.world_size, "epochs": self.epochs}))


class HistoryWriter(L.Callback):
    """Write the module's per-epoch ``history`` (and ``extra``) as JSON from rank 0 at the end of ``fit``:
    the way to get results out of processes that a notebook cannot see (``strategy="ddp_notebook"``)."""

    def __init__(self, path: str | os.PathLike, extra: dict | None = None):
        self.path = Path(path)
        self.extra = dict(extra or {})

    def on_fit_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            out = {"world_size": trainer.world_size, "history": getattr(pl_module, "history", []), **self.extra}
            self.path.write_text(json.dumps(out, indent=1))


def summarize_rows(epochs: list[dict]) -> list[dict]:
    """Per epoch: rows and batches per rank, whether the ranks' rows are disjoint, and how many of each
    rank's rows it also had in the previous epoch."""
    out = []
    prev = None
    for e in epochs:
        sets = [set(r) for r in e["rows"]]
        union = set().union(*sets)
        row = {
            "epoch": e["epoch"],
            "loader_epoch": e.get("loader_epoch"),
            "batches": e["batches"],
            "rows": [len(r) for r in e["rows"]],
            "duplicates_within_rank": [len(r) - len(s) for r, s in zip(e["rows"], sets, strict=True)],
            "disjoint": sum(len(s) for s in sets) == len(union),
            "same_as_previous_epoch": None if prev is None else [len(s & p) for s, p in zip(sets, prev, strict=True)],
        }
        out.append(row)
        prev = sets
    return out


class DataWait(L.Callback):
    """The share of each epoch's training time that this rank's loop spent waiting for its next batch.

    Lightning takes a batch from the loader between one batch's end (or the epoch's start, which includes
    starting the DataLoader's workers) and the next batch's start; the time there is the wait, the rest is the
    training step. Whether DataLoader workers help is decided by that wait, and it depends on the node (its
    cores, the step's use of the interpreter): measure it with ``--workers 0`` and ``--workers 2``. An epoch
    resumed mid-way starts without the epoch-start hook: its wait counts from its first batch. Rank 0 prints
    every rank's share (gathered at the epoch's end) and ``figures`` keeps them for ``metrics.json``."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.figures: list[dict] = []  # per epoch: {"epoch", "share_per_rank", "seconds_per_rank"}
        self._reset(None)

    def _reset(self, start: float | None) -> None:
        self._start = self._mark = start  # the epoch's start, and the end of the last batch (or the start)
        self._end: float | None = None
        self._waited = 0.0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._reset(self.clock())

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        now = self.clock()
        if self._mark is None:  # resumed mid-epoch: no epoch-start hook
            self._start = now
        else:
            self._waited += now - self._mark

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._mark = self._end = self.clock()

    def epoch_figures(self) -> tuple[float, float]:
        """(seconds waited, seconds of training) of this rank's epoch so far."""
        if self._start is None or self._end is None:
            return 0.0, 0.0
        return self._waited, self._end - self._start

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        import torch

        waited, seconds = self.epoch_figures()
        mine = torch.tensor([waited, seconds], dtype=torch.float32, device=pl_module.device)
        every = trainer.strategy.all_gather(mine).reshape(-1, 2).cpu().tolist()  # one collective, every rank
        shares = [w / s if s > 0 else 0.0 for w, s in every]
        self.figures.append(
            {"epoch": int(trainer.current_epoch), "share_per_rank": shares, "seconds_per_rank": [w for w, _ in every]}
        )
        if trainer.is_global_zero:
            say(f"epoch {trainer.current_epoch} | {wait_summary(shares)}")
        self._reset(None)


def wait_summary(shares: list[float]) -> str:
    """One line: the share of the epoch each rank's loop waited for data (the most and the mean over many)."""
    if len(shares) <= 4:
        each = ", ".join(f"rank {r} {share:.1%}" for r, share in enumerate(shares))
        return f"data wait (share of the epoch spent waiting for the next batch): {each}"
    worst = max(range(len(shares)), key=shares.__getitem__)
    return (
        f"data wait (share of the epoch spent waiting for the next batch): at most {shares[worst]:.1%} (rank "
        f"{worst}), {sum(shares) / len(shares):.1%} on average over {len(shares)} ranks"
    )
