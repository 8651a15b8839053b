"""Lightning glue: a ``LightningDataModule`` over a prepared store, and callbacks that record what each rank saw.

``ZarrDataModule`` splits the store along time by whole chunks (the last ``val_fraction`` of the chunks
validate) without copying anything: the training and the validation datasets are two row windows
(``row_range=``) of the same store. It hands Lightning :class:`zarrtorch.ZarrDataLoader` objects. Those
need no special Trainer settings: Lightning's default ``use_distributed_sampler=True`` leaves iterable
datasets alone, and the ``set_epoch`` Lightning calls on the loader's sampler every epoch reaches the loader,
so every epoch gets a new chunk order and a new split between ranks.

Shuffle modes (``shuffle=``):

* ``"none"``: chunks in time order, rows in time order (what reading a file front to back gives);
* ``"chunks"``: a new random chunk order every epoch, no row buffer (``buffer_chunks=0``): the rows of
  each chunk stay in time order, so a batch holds consecutive times of one or two chunks;
* ``"full"``: random chunk order plus a shuffle buffer of ``buffer_chunks`` chunks, so a batch mixes rows
  from several distant periods.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

import lightning as L

from zarrtorch.dataset import ZarrIterableDataset
from zarrtorch.layout import check_first_axis_layout
from zarrtorch.loader import ZarrDataLoader
from zarrtorch.source import open_arrays

SHUFFLE_MODES = ("none", "chunks", "full")


@dataclass(frozen=True)
class SplitPlan:
    """Where the time split falls: rows ``[0, split_row)`` fit, ``[split_row, rows)`` validate."""

    rows: int
    chunk_rows: int
    split_row: int

    @property
    def n_chunks(self) -> int:
        return -(-self.rows // self.chunk_rows)

    @property
    def val_chunks(self) -> int:
        return self.n_chunks - self.split_row // self.chunk_rows

    @property
    def fit_rows(self) -> int:
        return self.split_row

    @property
    def val_rows(self) -> int:
        return self.rows - self.split_row

    @property
    def fit_range(self) -> tuple[int, int]:
        """``row_range`` of the fitting rows."""
        return 0, self.split_row

    @property
    def val_range(self) -> tuple[int, int]:
        """``row_range`` of the validation rows."""
        return self.split_row, self.rows


def plan_split(rows: int, chunk_rows: int, val_fraction: float) -> SplitPlan:
    """The last ``round(val_fraction * n_chunks)`` chunks (at least one, and at least one left to fit) validate.

    Validation on the *last* chunks (the most recent times) is the honest split for data that drift in time:
    the model is scored on a period it has never seen, as it would be in use. Splitting by whole chunks keeps
    every chunk boundary where it was, so both windows stream exactly like the store.
    """
    if not 0.0 < float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_chunks = -(-int(rows) // int(chunk_rows))
    if n_chunks < 2:
        raise ValueError(f"the store has {n_chunks} chunk(s): a split by whole chunks needs at least 2")
    val_chunks = min(n_chunks - 1, max(1, int(round(val_fraction * n_chunks))))
    return SplitPlan(int(rows), int(chunk_rows), (n_chunks - val_chunks) * int(chunk_rows))


class ZarrDataModule(L.LightningDataModule):
    """Training and validation loaders over one prepared Zarr store, split along time by whole chunks.

    Both datasets read the same store: the training one the rows ``split_plan.fit_range``, the validation
    one the rows ``split_plan.val_range`` (``row_range=``); nothing is copied or written.

    Args:
        store: path of a store written by ``prepare_zarr`` (default: the course's ``train.zarr`` for
            ``$ZARRTORCH_SIZE``).
        batch_size: rows per batch on each rank (validation: ``val_batch_size``, default the same).
        num_workers: DataLoader worker processes per rank (0: read in the training process).
        buffer_chunks: shuffle-buffer size in chunks for ``shuffle="full"``.
        seed: the seed every rank shares (chunk order and buffer draws of each epoch derive from it).
        val_fraction: share of the chunks, taken at the end of the time axis, used for validation.
        shuffle: ``"none"``, ``"chunks"`` or ``"full"`` (see the module docstring).
        arrays: the arrays to load (default: all data arrays of the store).
        return_index: add ``"index"`` (row numbers of the store) to every batch.
        pin_memory: pin batches for fast copies to the GPU (default: when CUDA is available).
    """

    def __init__(self, store: str | os.PathLike | None = None, *, batch_size: int = 32, val_batch_size: int | None = None,
                 num_workers: int = 0, buffer_chunks: int = 8, seed: int = 0, val_fraction: float = 0.2,
                 shuffle: str = "full", arrays: Sequence[str] | None = None, return_index: bool = False,
                 pin_memory: bool | None = None, persistent_workers: bool | None = None,
                 decode_threads: int | None = None):
        super().__init__()
        if shuffle not in SHUFFLE_MODES:
            raise ValueError(f"shuffle must be one of {SHUFFLE_MODES}, got {shuffle!r}")
        if store is None:
            from zarrtorch.paths import train_store_path

            store = train_store_path()
        self.store = Path(store)
        self.batch_size = int(batch_size)
        self.val_batch_size = int(val_batch_size or batch_size)
        self.num_workers = int(num_workers)
        self.buffer_chunks = int(buffer_chunks)
        self.seed = int(seed)
        self.val_fraction = float(val_fraction)
        self.shuffle = shuffle
        self.arrays = list(arrays) if arrays is not None else None
        self.return_index = bool(return_index)
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        self.persistent_workers = (self.num_workers > 0) if persistent_workers is None else bool(persistent_workers)
        self.decode_threads = decode_threads
        layout = check_first_axis_layout(open_arrays(self.store, self.arrays))
        self.split_plan = plan_split(layout.rows, layout.chunk_rows, self.val_fraction)
        self.train_dataset: ZarrIterableDataset | None = None
        self.val_dataset: ZarrIterableDataset | None = None

    # -- data ---------------------------------------------------------------------------------------
    def _dataset_options(self) -> tuple[bool, int]:
        if self.shuffle == "none":
            return False, 1
        if self.shuffle == "chunks":
            return True, 0  # chunk order only: no row buffer
        return True, self.buffer_chunks

    def setup(self, stage: str | None = None) -> None:
        shuffle, buffer_chunks = self._dataset_options()
        common = dict(arrays=self.arrays, seed=self.seed, return_index=self.return_index,
                      decode_threads=self.decode_threads)
        self.train_dataset = ZarrIterableDataset(self.store, shuffle=shuffle, buffer_chunks=buffer_chunks,
                                                 row_range=self.split_plan.fit_range, **common)
        self.val_dataset = ZarrIterableDataset(self.store, shuffle=False, row_range=self.split_plan.val_range,
                                               **common)

    def _loader_kwargs(self) -> dict:
        kw = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kw["persistent_workers"] = self.persistent_workers
        return kw

    def train_dataloader(self) -> ZarrDataLoader:
        if self.train_dataset is None:
            self.setup("fit")
        return ZarrDataLoader(self.train_dataset, batch_size=self.batch_size, drop_last=True, **self._loader_kwargs())

    def val_dataloader(self) -> ZarrDataLoader:
        if self.val_dataset is None:
            self.setup("validate")
        return ZarrDataLoader(self.val_dataset, batch_size=self.val_batch_size, drop_last=False,
                              **self._loader_kwargs())

    # -- helpers ------------------------------------------------------------------------------------
    def channel_stats(self, n_chunks: int = 4) -> dict:
        """Normalisation statistics from ``n_chunks`` chunks spread over the *fitting* rows only."""
        from zarrtorch.models import channel_stats

        return channel_stats(self.store, n_chunks=n_chunks, stop_row=self.split_plan.split_row)

    def describe(self) -> str:
        """One paragraph on the split, with dates when the store has a time coordinate."""
        p = self.split_plan
        text = (f"{p.rows} rows in {p.n_chunks} chunks of {p.chunk_rows}: fit on rows [0, {p.split_row}) "
                f"({p.n_chunks - p.val_chunks} chunks), validate on rows [{p.split_row}, {p.rows}) ({p.val_chunks} chunks)")
        try:
            import xarray as xr

            ds = xr.open_zarr(str(self.store), consolidated=None)
            t = ds["time"].values
            fmt = lambda v: str(np.datetime_as_string(v, unit="D"))  # noqa: E731
            text += f"; fit {fmt(t[0])} .. {fmt(t[p.split_row - 1])}, validate {fmt(t[p.split_row])} .. {fmt(t[-1])}"
        except Exception:  # no time coordinate (a store written from plain arrays)
            pass
        return text


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


# ---------------------------------------------------------------------------------------------------------
# Callbacks
# ---------------------------------------------------------------------------------------------------------
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
        self.epochs.append({"epoch": int(trainer.current_epoch), "loader_epoch": self._loader_epoch,
                            "batches": [int(b) for b in batch_counts], "rows": rows})

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
        row = {"epoch": e["epoch"], "loader_epoch": e.get("loader_epoch"), "batches": e["batches"],
               "rows": [len(r) for r in e["rows"]],
               "duplicates_within_rank": [len(r) - len(s) for r, s in zip(e["rows"], sets)],
               "disjoint": sum(len(s) for s in sets) == len(union),
               "same_as_previous_epoch": None if prev is None else [len(s & p) for s, p in zip(sets, prev)]}
        out.append(row)
        prev = sets
    return out
