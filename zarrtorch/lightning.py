"""``ZarrDataModule``: a ``LightningDataModule`` over one prepared store, split along time by whole chunks;
``MixedDataModule``: several of them mixed by weight (:class:`zarrtorch.MixedLoader`, ``docs/mix.md``). Both keep
their training loader's position in Lightning's checkpoints and follow the trainer's limits
(:class:`ResumableTraining`).

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

import math
import os
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np

from zarrtorch._read.source import is_url, open_arrays
from zarrtorch._util.arguments import flag
from zarrtorch._util.process import TopologyUnknown
from zarrtorch._util.sizes import ceil_div
from zarrtorch.dataset import ZarrIterableDataset
from zarrtorch.layout import check_first_axis_layout
from zarrtorch.loader import ZarrDataLoader
from zarrtorch.mix import PER_SOURCE, MixedLoader
from zarrtorch.options import ReadOptions, check_batch_order_name

SHUFFLE_MODES = ("none", "chunks", "full")


class _FittingTrainer:
    """The trainer fitting a datamodule, while it fits; held by weak reference: the loader must not keep the
    trainer alive."""

    def __init__(self, datamodule: L.LightningDataModule):
        self._datamodule = weakref.ref(datamodule)

    def trainer(self):
        dm = self._datamodule()
        trainer = getattr(dm, "trainer", None) if dm is not None else None
        if trainer is None or getattr(trainer.state, "fn", None) != "fit":
            return None
        return trainer


class _TrainedBatches(_FittingTrainer):
    """The training batches of this epoch Lightning has processed, for the loader's checkpoint state.

    Lightning fetches one batch ahead, so when it saves a checkpoint the loader has yielded one batch more
    than was trained; on restart Lightning counts its processed batches, and the loader must continue
    right after them."""

    def __call__(self) -> int | None:
        trainer = self.trainer()
        return None if trainer is None else trainer.fit_loop.epoch_loop.batch_progress.current.processed


class _TrainerEpochLength(_FittingTrainer):
    """The batches Lightning trains per epoch (``limit_train_batches`` applied), when fewer than the loader's: once
    they are trained the epoch is over for Lightning, and a checkpoint must hold the next epoch's start."""

    def __call__(self) -> int | None:
        trainer = self.trainer()
        limit = None if trainer is None else trainer.num_training_batches
        return int(limit) if isinstance(limit, (int, float)) and math.isfinite(limit) else None


class _ValidatedPerRun:
    """The batches Lightning takes from a validation loader per validation (``limit_val_batches`` applied): it never
    asks for the rest, so an iteration that reached them is over when Lightning sets the next epoch."""

    def __init__(self, datamodule: L.LightningDataModule, loader):
        self._datamodule, self._loader = weakref.ref(datamodule), weakref.ref(loader)

    def __call__(self) -> int | None:
        dm, loader = self._datamodule(), self._loader()
        trainer = getattr(dm, "trainer", None) if dm is not None else None
        if trainer is None or loader is None:
            return None
        return trained_per_epoch(len(loader), trainer.limit_val_batches)


def trained_per_epoch(length: int, limit: int | float) -> int:
    """The batches of an epoch of ``length`` Lightning trains under ``limit_train_batches=limit`` (a count, or a
    share of the epoch, rounded down as Lightning rounds it)."""
    if isinstance(limit, int):
        return min(length, limit)
    return int(length * limit)


@dataclass(frozen=True)
class SplitPlan:
    """Where the time split falls: rows ``[0, split_row)`` fit, ``[split_row, rows)`` validate. With windows
    (``halo``: a window's rows after its start) the fitting period runs ``halo`` rows past the chunk boundary,
    so that its window starts are the whole chunks ``[0, split_row)`` and the last one's steps stay in it; the
    validation period starts after them (no row in both)."""

    rows: int
    chunk_rows: int
    split_row: int
    halo: int = 0

    @property
    def n_chunks(self) -> int:
        return ceil_div(self.rows, self.chunk_rows)

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
        return 0, self.split_row + self.halo

    @property
    def val_range(self) -> tuple[int, int]:
        """``row_range`` of the validation rows."""
        return self.split_row + self.halo, self.rows


def period_rows(store_rows: int, chunk_rows: int, rows: int | None) -> int:
    """The rows a data module splits: the store's first ``rows``, which must end on a chunk boundary (a period
    that stopped inside a chunk would leave part of that chunk out of both loaders without a word)."""
    if rows is None or int(rows) >= store_rows:
        return int(store_rows)
    rows = int(rows)
    if rows <= 0 or rows % chunk_rows:
        below, above = rows // chunk_rows * chunk_rows, (rows // chunk_rows + 1) * chunk_rows
        hint = f"use {below} or {above}" if below > 0 else f"use {above} or more"
        raise ValueError(
            f"rows={rows} does not end on a chunk boundary of the store (chunks of {chunk_rows} rows): {hint}, "
            f"or leave rows=None for all {store_rows} rows"
        )
    return rows


def plan_split(rows: int, chunk_rows: int, val_fraction: float, halo: int = 0) -> SplitPlan:
    """The last ``round(val_fraction * n_chunks)`` chunks (at least one, and at least one left to fit) validate.

    Validation on the *last* chunks (the most recent times) is the honest split for data that drift in time:
    the model is scored on a period it has never seen, as it would be in use. Splitting by whole chunks keeps
    every chunk boundary where it was, so both windows stream exactly like the store.
    """
    if not 0.0 < float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_chunks = ceil_div(rows, chunk_rows)
    if n_chunks < 2:
        raise ValueError(f"the store has {n_chunks} chunk(s): a split by whole chunks needs at least 2")
    val_chunks = min(n_chunks - 1, max(1, int(round(val_fraction * n_chunks))))
    split = (n_chunks - val_chunks) * int(chunk_rows)
    # the gap after the fitting period's targets, then one whole window: said here, in the user's terms
    if halo and rows - split < 2 * int(halo) + 1:
        raise ValueError(
            f"the validation period (the last {rows - split} rows, {val_chunks} chunk(s) of {chunk_rows}) cannot hold "
            f"the {halo} rows kept free after the fitting period's targets and one window of {halo + 1} rows: raise "
            "val_fraction, or use windows of fewer steps"
        )
    return SplitPlan(int(rows), int(chunk_rows), split, int(halo))


class ResumableTraining(L.LightningDataModule):
    """What a data module needs for its training loader to follow Lightning exactly: the batches Lightning has
    trained (fewer than the loader yielded when it fetches ahead) and the most it trains per epoch
    (``limit_train_batches``, ``max_steps``) told to the loader, the loader's position kept in the data module's
    own state (restored in every order Lightning restores things), and an epoch resumed on another number of ranks
    reconciled with Lightning's counters.

    A subclass builds its training loader (:meth:`new_train_loader`) and loads a state into it
    (:meth:`load_train_state`); the loader (a :class:`~zarrtorch.ZarrDataLoader` or a
    :class:`~zarrtorch.MixedLoader`) has ``consumed_batches``, ``consumer_epoch_length``, ``epoch``, ``set_epoch``,
    ``batches_before``, ``count_as_done``, ``state_dict`` and ``load_state_dict``."""

    def __init__(self):
        super().__init__()
        self._train_loader = None
        self._train_state: dict | None = None  # a checkpoint's loader state, for the next training loader
        self._reload_setting: int | None = None  # the trainer's own, while a reload after a resumed epoch is due
        self._resumed_epoch = 0  # the epoch the last loaded state resumes
        self._state_loaded_from = None  # the trainer's checkpoint path when Lightning last loaded this one's state

    def new_train_loader(self):
        """A training loader at its first epoch's start (Lightning's hooks and a resumed position come after)."""
        raise NotImplementedError

    def load_train_state(self, loader, state: dict) -> None:
        """Load a checkpoint's loader state into ``loader``."""
        raise NotImplementedError

    def train_dataloader(self):
        trainer = getattr(self, "trainer", None)
        self._refuse_a_checkpoint_without_my_state(trainer)
        resumed = self._train_loader
        if self._reload_setting is not None and resumed is not None and self._train_state is None:
            if trainer is not None and trainer.current_epoch <= self._resumed_epoch:
                # Lightning reloads at the resumed epoch's own start: that epoch has still to run, and Lightning's
                # counters are restored by now (not yet when the state was loaded into this loader)
                self._align_with_the_trainers_count(resumed, trainer)
                return resumed
            if trainer is not None:  # that reload: the next epoch, whole, from the same loader (a mix's sources
                # go on from where they stand; a new loader would start them afresh)
                trainer.reload_dataloaders_every_n_epochs, self._reload_setting = self._reload_setting, None
                resumed.set_epoch(trainer.current_epoch)
                return resumed
        loader = self.new_train_loader()
        loader.consumed_batches = _TrainedBatches(self)
        loader.consumer_epoch_length = _TrainerEpochLength(self)
        if self._train_state is not None:
            self._resume(loader, trainer)
        self._train_loader = loader
        return loader

    def _refuse_a_checkpoint_without_my_state(self, trainer) -> None:
        """A fit resumed from a checkpoint this data module's state is not in: Lightning keeps a data module's
        state under its class name and loads nothing into one of another class (a :class:`ZarrDataModule`'s
        checkpoint resumed with a :class:`MixedDataModule`, or the reverse), which would then train its data from
        the start at the checkpoint's epoch and step, silently."""
        if trainer is None or getattr(trainer.state, "fn", None) != "fit" or not trainer.ckpt_path:
            return
        if self._state_loaded_from == trainer.ckpt_path:
            return
        name = type(self).__name__
        raise ValueError(
            f"the checkpoint {str(trainer.ckpt_path)!r} holds no {name} state: it was saved with another data module "
            f"(a {'MixedDataModule' if name == 'ZarrDataModule' else 'ZarrDataModule'}, say) or with none, so the "
            "data's position in it cannot be resumed. Resume it with the data module it was saved with; to train this "
            "data from its start with the trained weights, load only them (YourModel.load_from_checkpoint(path)) "
            "and fit without ckpt_path"
        )

    def _resume(self, loader, trainer) -> None:
        """Load the checkpoint's state into ``loader``, reconcile it with Lightning's counters, and have Lightning
        ask for the loader again when the resumed epoch is over (:meth:`_arm_reload`)."""
        self.load_train_state(loader, self._train_state)
        self._train_state, self._resumed_epoch = None, loader.epoch
        self._align_with_the_trainers_count(loader, trainer)
        self._arm_reload(trainer)

    @staticmethod
    def _align_with_the_trainers_count(loader, trainer) -> None:
        """A checkpoint taken at an epoch's last batch holds the next epoch's start; Lightning resumes it as that
        next epoch, but with its batch counter still at the last epoch's length. On as many ranks that length is
        the next epoch's too, and Lightning starts the epoch afresh; on fewer ranks the epoch is longer and
        Lightning would skip its first batches' worth (2 ranks -> 1: batches 10-19 of 20 asked for, so half the
        epoch untrained). The loader then counts those batches as done (:meth:`ZarrDataLoader.count_as_done`)."""
        if trainer is None or getattr(trainer.state, "fn", None) != "fit":
            return
        counted = int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
        try:
            before = loader.batches_before()
        except TopologyUnknown:
            return
        # the state is an epoch's start (a checkpoint at the last batch of the one before, on any number of
        # ranks) and Lightning goes on from its batch counter: unless that counter reaches the epoch's length
        # here (then Lightning starts the epoch afresh itself), its first batches' worth would be skipped
        starts_epoch = before == 0 and loader.epoch in (trainer.current_epoch, trainer.current_epoch + 1)
        if starts_epoch and 0 < counted < trained_per_epoch(len(loader), trainer.limit_train_batches):
            loader.count_as_done(counted)

    def _arm_reload(self, trainer) -> None:
        """Have Lightning ask for the training loader again at the next epoch's start, once (its own
        ``reload_dataloaders_every_n_epochs`` is put back then). Lightning counts an epoch's batches only when it
        builds the loader, and stops every later epoch at that count; an epoch resumed on another number of ranks
        has another length than the whole epochs after it (2 ranks -> 1: 17 batches, then 20, the last 3 never
        trained). Its counters are restored only after a first loader is built, so this is done after every
        resume: the reload returns the resumed loader while its epoch has still to run (reconciled with those
        counters, :meth:`_align_with_the_trainers_count`), the same loader set to the next epoch after it."""
        if trainer is not None and getattr(trainer.state, "fn", None) == "fit" and self._reload_setting is None:
            self._reload_setting = trainer.reload_dataloaders_every_n_epochs
            trainer.reload_dataloaders_every_n_epochs = 1

    # -- checkpoints: the training loader's position travels with the DataModule's state ------------
    def state_dict(self) -> dict:
        """Saved by Lightning in every checkpoint. Lightning also saves the loader's own state, but restores
        it only if the loader is created after the checkpoint is read, which is not the case when the model
        asks for ``trainer.estimated_stepping_batches`` (a learning-rate schedule): this copy always is."""
        # never empty: Lightning saves no empty state, and a checkpoint without one is refused on resume
        return {"train_loader": self._train_loader.state_dict() if self._train_loader is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self._state_loaded_from = getattr(getattr(self, "trainer", None), "ckpt_path", None)
        self._train_state = state.get("train_loader")
        if self._train_state is not None and self._train_loader is not None:
            self.load_train_state(self._train_loader, self._train_state)
            self._train_state, self._resumed_epoch = None, self._train_loader.epoch
            # the loader was built before (for ``estimated_stepping_batches``) and Lightning counted its batches
            # then: have it asked for again at the resumed epoch's start, where the counts can be reconciled
            self._arm_reload(getattr(self, "trainer", None))


class ZarrDataModule(ResumableTraining):
    """Training and validation loaders over one prepared Zarr store, split along time by whole chunks.

    Both datasets read the same store: the training one the rows ``split_plan.fit_range``, the validation
    one the rows ``split_plan.val_range`` (``row_range=``); nothing is copied or written.

    Args:
        store: path or URL (``s3://...``, ``https://...``) of a store written by ``prepare_zarr``.
        storage_options: for a URL, fsspec options (``endpoint_url``, ``key``/``secret``, ``anon``...).
        batch_size: rows per batch on each rank (validation: ``val_batch_size``, default the same).
        num_workers: DataLoader worker processes per rank (0: read in the training process).
        buffer_chunks: shuffle-buffer size in chunks for ``shuffle="full"``.
        seed: the seed every rank shares (chunk order and buffer draws of each epoch derive from it).
        val_fraction: share of the chunks, taken at the end of the time axis, used for validation.
        shuffle: ``"none"``, ``"chunks"`` or ``"full"`` (see the module docstring).
        variables: names of the arrays to load (default: all data arrays of the store).
        return_index: add ``"index"`` (row numbers of the store) to every batch.
        pin_memory: pin batches for fast copies to the GPU (default: when the rank trains on a CUDA device).
        read: how the store is read (:class:`zarrtorch.ReadOptions`: ``storage_options`` for a URL, decode
            threads, requests in flight...).
        windows: samples are windows of time steps (:class:`zarrtorch.windows.Windows`), each inside its period:
            no training window reaches into the validation period.
        rows: split and read only the store's first ``rows`` rows (default: all), for a run on a shorter
            period; a whole number of chunks, or at least the store's length (then all of it).
        allow_other_data: resume a checkpoint whose store's first bytes differ from this store's (a store
            rewritten on purpose with the same rows); by default such a checkpoint is refused.
        batch_order: ``"rank"``: each rank's batches are the same whatever ``num_workers``
            (:class:`~zarrtorch.ZarrDataLoader`, ``docs/batch-order.md``); default ``"worker"``.
    """

    def __init__(
        self,
        store: str | os.PathLike,
        *,
        batch_size: int = 32,
        val_batch_size: int | None = None,
        num_workers: int = 0,
        buffer_chunks: int = 8,
        seed: int = 0,
        val_fraction: float = 0.2,
        shuffle: str = "full",
        variables: Sequence[str] | None = None,
        return_index: bool = False,
        pin_memory: bool | None = None,
        persistent_workers: bool | None = None,
        read: ReadOptions | None = None,
        windows=None,
        rows: int | None = None,
        allow_other_data: bool = False,
        batch_order: str = "worker",
    ):
        super().__init__()
        self.windows = windows
        self.allow_other_data = flag(allow_other_data, "allow_other_data")
        if read is not None and not isinstance(read, ReadOptions):
            raise TypeError(f"read must be a zarrtorch.ReadOptions(...), got {type(read).__name__}: {read!r}")
        read = read or ReadOptions()
        if shuffle not in SHUFFLE_MODES:
            raise ValueError(f"shuffle must be one of {SHUFFLE_MODES}, got {shuffle!r}")
        self.store = store if is_url(store) else Path(store)  # a URL through Path would lose a slash: s3:/b
        self.read = read
        self.batch_size = int(batch_size)
        self.val_batch_size = int(val_batch_size or batch_size)
        self.num_workers = int(num_workers)
        check_batch_order_name(batch_order)
        self.batch_order = batch_order
        self.buffer_chunks = int(buffer_chunks)
        self.seed = int(seed)
        self.val_fraction = float(val_fraction)
        self.shuffle = shuffle
        self.variables = list(variables) if variables is not None else None
        self.return_index = bool(return_index)
        self.pin_memory = None if pin_memory is None else bool(pin_memory)  # None: decided in the rank
        self.persistent_workers = (self.num_workers > 0) if persistent_workers is None else bool(persistent_workers)
        arrays = open_arrays(self.store, self.variables, storage_options=read.storage_options, retry=read.retry)
        static = windows.static if windows is not None else ()
        arrays = {n: a for n, a in arrays.items() if n not in static}  # the datasets take them out too
        layout = check_first_axis_layout(arrays)
        halo = windows.span - 1 if windows is not None else 0
        self.split_plan = plan_split(
            period_rows(layout.rows, layout.chunk_rows, rows), layout.chunk_rows, self.val_fraction, halo
        )
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
        common = dict(variables=self.variables, seed=self.seed, return_index=self.return_index, read=self.read)
        common["windows"] = self.windows
        self.train_dataset = ZarrIterableDataset(
            self.store, shuffle=shuffle, buffer_chunks=buffer_chunks, row_range=self.split_plan.fit_range, **common
        )
        # validation reads every row once, plus fewer than world-size rows repeated to even out the ranks:
        # "padding" marks those, so that a metric's mean counts each row once (ForecastModule does)
        self.val_dataset = ZarrIterableDataset(
            self.store, shuffle=False, row_range=self.split_plan.val_range, return_padding=True, **common
        )

    def _pinned(self) -> bool:
        """``pin_memory``, or (``None``) whether this rank trains on a CUDA device: decided in the rank, from its
        strategy, never by ``torch.cuda.is_available()`` in the process that builds the DataModule (that
        initialises CUDA there, and ``ddp_notebook``'s later fork then fails; a CPU run on a GPU node would pin
        for nothing)."""
        if self.pin_memory is not None:
            return self.pin_memory
        trainer = getattr(self, "trainer", None)
        device = getattr(getattr(trainer, "strategy", None), "root_device", None)
        return device is not None and device.type == "cuda"

    def _loader_kwargs(self) -> dict:
        kw = {"num_workers": self.num_workers, "pin_memory": self._pinned(), "batch_order": self.batch_order}
        if self.num_workers > 0:
            kw["persistent_workers"] = self.persistent_workers
        return kw

    def new_train_loader(self) -> ZarrDataLoader:
        if self.train_dataset is None:
            self.setup("fit")
        return ZarrDataLoader(self.train_dataset, batch_size=self.batch_size, drop_last=True, **self._loader_kwargs())

    def load_train_state(self, loader: ZarrDataLoader, state: dict) -> None:
        loader.load_state_dict(state, allow_other_data=self.allow_other_data)

    def val_dataloader(self) -> ZarrDataLoader:
        if self.val_dataset is None:
            self.setup("validate")
        loader = ZarrDataLoader(
            self.val_dataset, batch_size=self.val_batch_size, drop_last=False, **self._loader_kwargs()
        )
        loader.consumer_epoch_length = _ValidatedPerRun(self, loader)
        return loader

    # -- helpers ------------------------------------------------------------------------------------
    def describe(self) -> str:
        """One paragraph on the split, with dates when the store has a time coordinate."""
        p = self.split_plan
        text = (
            f"{p.rows} rows in {p.n_chunks} chunks of {p.chunk_rows}: fit on rows [0, {p.fit_range[1]}) "
            f"({p.n_chunks - p.val_chunks} chunks{f' + {p.halo} rows' if p.halo else ''}), validate on rows "
            f"[{p.val_range[0]}, {p.rows}) ({p.val_chunks} chunks{f' - {p.halo} rows' if p.halo else ''})"
        )
        days = self._days([0, p.fit_range[1] - 1, p.val_range[0], p.val_range[1] - 1])
        if days is not None:
            text += f"; fit {days[0]} .. {days[1]}, validate {days[2]} .. {days[3]}"
        if self.windows is not None:
            from zarrtorch.windows import WindowStarts

            fit, val = (WindowStarts.of(self.windows, p.rows, r).n for r in (p.fit_range, p.val_range))
            text += f"; windows of {self.windows.span} rows: {fit} to fit on, {val} to validate on"
        return text

    def _days(self, rows: list[int]) -> list[str] | None:
        """The dates (``YYYY-MM-DD``) of ``rows`` from the store's ``time`` coordinate, or None without one.

        CF's "<unit> since <date>" in a standard calendar (what xarray writes for datetime64 times) is decoded
        here: opening the store with xarray for four dates cost every training command about half a second.
        Other encodings go to xarray when it is installed."""
        try:
            (time,) = open_arrays(self.store, ["time"], storage_options=self.read.storage_options).values()
            values = time[rows]
        except (KeyError, ValueError, OSError):  # no time coordinate (plain arrays)
            return None
        stamps = cf_datetimes(values, time.attrs.get("units"), time.attrs.get("calendar"))
        if stamps is None:
            try:
                import xarray as xr

                ds = xr.open_zarr(str(self.store), consolidated=None, storage_options=self.read.storage_options)
                stamps = ds["time"].values[rows]
            except (ImportError, KeyError, ValueError, OSError):
                return None
        if not np.issubdtype(np.asarray(stamps).dtype, np.datetime64):
            return None
        return [str(d) for d in np.datetime_as_string(stamps, unit="D")]


CF_SECONDS = {"days": 86400, "day": 86400, "d": 86400, "hours": 3600, "hour": 3600, "h": 3600, "minutes": 60}
CF_SECONDS |= {"minute": 60, "seconds": 1, "second": 1, "s": 1}
STANDARD_CALENDARS = (None, "standard", "gregorian", "proleptic_gregorian")
GREGORIAN_START = np.datetime64("1582-10-15T00:00:00", "s")


def cf_datetimes(values: np.ndarray, units, calendar) -> np.ndarray | None:
    """``values`` (integers, or floats as ERA5's netCDF files often hold) in CF's ``"<unit> since <date>"`` as
    datetime64 to the second, or None for what this does not decode (another calendar, an unknown unit or date,
    a value that is not finite): xarray's job then."""
    if not isinstance(units, str) or calendar not in STANDARD_CALENDARS or " since " not in units:
        return None
    unit, _, origin = units.partition(" since ")
    per = CF_SECONDS.get(unit.strip().lower())
    values = np.asarray(values)
    if per is None or values.dtype.kind not in "iuf" or not np.isfinite(values).all():
        return None
    try:
        start = np.datetime64(origin.strip().replace(" ", "T").rstrip("Z"), "s")
    except ValueError:  # a time zone offset, or a date numpy does not parse
        return None
    seconds = values.astype(np.int64) * per if values.dtype.kind in "iu" else np.round(values * per).astype(np.int64)
    stamps = start + seconds.astype("timedelta64[s]")
    if calendar != "proleptic_gregorian" and min(start, stamps.min()) < GREGORIAN_START:
        return None  # CF's standard calendar is Julian before 1582-10-15, numpy's Gregorian throughout
    return stamps


class MixedDataModule(ResumableTraining):
    """Training on a mix of stores (:class:`zarrtorch.MixedLoader`), each validated on its own period, with
    everything :class:`ZarrDataModule` does for one store under Lightning: exact resume from Lightning's
    checkpoints, ``limit_train_batches``/``max_steps``/``val_check_interval`` told to the loader, a new order every
    epoch, the ranks and world size from the trainer.

    Args:
        sources: ``{name: ZarrDataModule}`` (or a list: names ``"0"``, ``"1"``...). Each source's data module says
            how its store is split, read and batched (its ``batch_size``, workers, shuffle, windows, ``rows``,
            ``allow_other_data``...); with per-source batches every source has the same ``batch_size``. This data
            module uses them only to build their datasets and loaders (it gives them its trainer).
        weights, rows, epoch_rows, seed, batches: the mix, as :class:`zarrtorch.MixedLoader`'s: each batch says its
            source in ``batch["source"]``, every rank draws the same source at every step.

    Validation: :meth:`val_dataloader` returns every source's validation loader, in the sources' order, so
    Lightning calls ``validation_step(batch, batch_idx, dataloader_idx)`` with ``dataloader_idx`` the source's
    index in :attr:`names`. The mix's arguments are checked here, at construction.
    """

    def __init__(
        self,
        sources: Mapping[str, ZarrDataModule] | Sequence[ZarrDataModule],
        *,
        weights: Mapping[str, float] | Sequence[float] | None = None,
        rows: Mapping[str, int] | Sequence[int] | None = None,
        epoch_rows: int | None = None,
        seed: int = 0,
        batches: str = PER_SOURCE,
    ):
        super().__init__()
        self.sources = named_data_modules(sources)
        self.mix_options = dict(weights=weights, rows=rows, epoch_rows=epoch_rows, seed=seed, batches=batches)
        self.new_train_loader()  # refuses bad mix arguments now, by name

    @property
    def names(self) -> list[str]:
        """The sources' names, in order (``dataloader_idx`` of validation indexes them)."""
        return list(self.sources)

    def _sources_with_my_trainer(self) -> dict[str, ZarrDataModule]:
        """The sources, each told this data module's trainer (it decides their pinning, in the rank)."""
        for source in self.sources.values():
            source.trainer = getattr(self, "trainer", None)
        return self.sources

    def setup(self, stage: str | None = None) -> None:
        for source in self._sources_with_my_trainer().values():
            source.setup(stage)

    def new_train_loader(self) -> MixedLoader:
        loaders = {name: source.new_train_loader() for name, source in self._sources_with_my_trainer().items()}
        return MixedLoader(loaders, **self.mix_options)

    def load_train_state(self, loader: MixedLoader, state: dict) -> None:
        allowed = {name: source.allow_other_data for name, source in self.sources.items()}
        loader.load_state_dict(state, allow_other_data=allowed)

    def val_dataloader(self) -> list[ZarrDataLoader]:
        return [source.val_dataloader() for source in self._sources_with_my_trainer().values()]

    def describe(self) -> str:
        """Every source's split, one line each."""
        return "\n".join(f"{name}: {source.describe()}" for name, source in self.sources.items())


def named_data_modules(sources) -> dict[str, ZarrDataModule]:
    """``{name: ZarrDataModule}`` from a mapping or a list, each a ZarrDataModule given once."""
    if isinstance(sources, Mapping):
        named = {str(k): v for k, v in sources.items()}
    elif isinstance(sources, Sequence) and not isinstance(sources, str):
        named = {str(i): v for i, v in enumerate(sources)}
    else:
        raise TypeError(f"sources must be {{name: ZarrDataModule}} or a list of them, got {type(sources).__name__}")
    for name, source in named.items():
        if not isinstance(source, ZarrDataModule):
            raise TypeError(
                f"source {name!r} must be a zarrtorch.lightning.ZarrDataModule, got {type(source).__name__}"
            )
    if len({id(s) for s in named.values()}) < len(named):
        raise ValueError(
            f"a ZarrDataModule is given as two sources ({list(named)}): give each source a data module of its own"
        )
    return named
