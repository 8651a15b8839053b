"""``ZarrIterableDataset``: each DataLoader worker streams whole batches of its share of an epoch.

Every process (rank, worker) evaluates the same pure plan (:mod:`zarrtorch.plan`) and reads only its own
pieces; batches are assembled inside the worker through the bounded shuffle buffer
(:mod:`zarrtorch.buffer`), so whole batches, not samples, cross the process boundary. The epoch, the
resume point and the rank/world size are set by :class:`zarrtorch.ZarrDataLoader` in a small shared-memory
tensor (:class:`zarrtorch.state.EpochState`), which reaches workers whatever their start method,
persistent or not.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from zarrtorch.buffer import INDEX_ONLY, buffer_rng, rank_batches
from zarrtorch.cf import packings
from zarrtorch.early import EarlyReads, reads_early
from zarrtorch.fetch import RetryPolicy
from zarrtorch.layout import check_first_axis_layout, restrict_rows
from zarrtorch.plan import RankPlan, epoch_plan, plan_fingerprint, resume_roles
from zarrtorch.pool import Pools
from zarrtorch.process import cpu_share
from zarrtorch.reader import PieceReader
from zarrtorch.resume import EpochSpec, resumed_plan
from zarrtorch.ring import BatchRing
from zarrtorch.settings import check_settings
from zarrtorch.sizes import held_chunks, row_bytes
from zarrtorch.source import all_local, for_this_process, open_arrays, secrets_of, store_label
from zarrtorch.stacking import check_stack, stack_columns
from zarrtorch.state import EpochState, EpochView, LoaderConfig, epoch_view
from zarrtorch.stream import stream_batches

THROUGH_THE_LOADER = (
    "iterate a ZarrIterableDataset through zarrtorch.ZarrDataLoader(dataset, batch_size=...): the loader "
    "decides the batch size, epoch and rank split that every worker must agree on"
)


class ZarrIterableDataset(IterableDataset):
    """Stream rows of first-axis-chunked Zarr arrays as batches: ``{name: tensor}``.

    Iterate it through :class:`zarrtorch.ZarrDataLoader`, which sets the batch size, epoch and topology.

    Args:
        source: a zarr Group, a path or URL (``s3://``, ``https://``...: reopened in each process, so fork,
            spawn and forkserver workers all work), a mapping name -> zarr.Array, or a store written by xarray.
        arrays: subset of array names to load (default: all data arrays).
        shuffle: shuffle the chunk order every epoch (shared seed) and rows in the buffer.
        seed: the seed every process shares; together with the epoch it fixes the whole epoch's order.
        buffer_chunks: shuffle-buffer size per worker, in chunks; memory per worker is about
            ``(buffer_chunks + requests_in_flight + 1) x chunk bytes`` (see ``worker_memory_bytes``).
            ``0``: chunk order only (with ``shuffle`` the chunk order still changes every epoch, but each
            worker streams its rows in order and holds no buffer). Without ``shuffle`` no buffer is used.
        decode_threads: threads decoding chunks per process (default: the process's share of the CPUs).
        requests_in_flight: chunks read ahead at once per process; default ``decode_threads + 1`` for a
            local store, 8 for a remote one, where each request waits for the network.
        storage_options: for a URL: fsspec options (``endpoint_url``, ``key``/``secret``, ``anon``...).
        retry: timeout and retries for each remote request (:class:`zarrtorch.fetch.RetryPolicy`).
        stack: ``{name: [array names]}``: yield those arrays as one ``name`` with a channel axis 1 (one
            array per variable, as in ERA5-like stores, becomes one input tensor).
        cache: keep the rows a process reads in RAM for later epochs (data that fits the cluster's memory);
            the chunk-to-rank assignment is then frozen at epoch 0's (the order in each process still changes).
        allow_shards: accept sharded arrays, the shard being the unit of reading and distribution.
        return_index: add ``"index"``, the global row numbers of the batch (useful to check and to
            de-duplicate evaluation padding).
        transform: a picklable callable applied to each batch dict inside the worker.
        check_chunks: raise if a chunk is missing from the store, not read the fill value.
        row_range: ``(start, stop)``: use only these rows, e.g. a training period and a validation
            period of one store, without copying. ``start`` must fall on a chunk boundary, and so must
            ``stop`` unless it is the end. Row numbers (``return_index``) stay those of the store.
        decode_cf: decode CF-packed arrays (``scale_factor``, ``add_offset``, ``_FillValue``) to floats with
            NaN where the fill was, as xarray does (:mod:`zarrtorch.cf`); ``False`` streams the stored values.
        return_padding: add ``"padding"``, a bool per row, True for the rows repeated only to give every rank
            the same number of batches (``drop_last=False``): leave them out of a metric's mean.
    """

    def __init__(
        self,
        source,
        *,
        arrays: Sequence[str] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        buffer_chunks: int = 8,
        decode_threads: int | None = None,
        cache: bool = False,
        allow_shards: bool = False,
        return_index: bool = False,
        transform: Callable[[dict], dict] | None = None,
        check_chunks: bool = True,
        row_range: tuple[int, int] | None = None,
        requests_in_flight: int | None = None,
        storage_options: dict | None = None,
        retry: RetryPolicy | None = None,
        stack: dict[str, Sequence[str]] | None = None,
        decode_cf: bool = True,
        return_padding: bool = False,
    ):
        check_settings(seed=seed, buffer_chunks=buffer_chunks, decode_threads=decode_threads,
                       requests_in_flight=requests_in_flight)  # fmt: skip
        self.retry = retry or RetryPolicy()
        self.arrays = open_arrays(source, arrays, storage_options=storage_options, retry=self.retry)
        self._secrets = secrets_of(storage_options)  # never shown in a message (zarrtorch.source.redact)
        self._arrays_pid, self._pools = os.getpid(), Pools()  # per process: see __iter__
        self.layout = check_first_axis_layout(self.arrays, allow_shards=allow_shards)
        self.packings = packings(self.arrays, decode_cf)
        self.stack = check_stack(stack, self.out_columns)
        self.row_offset = 0
        if row_range is not None:
            self.row_offset, self.layout = restrict_rows(self.layout, row_range)
        self.shuffle, self.seed, self.buffer_chunks = bool(shuffle), int(seed), int(buffer_chunks)
        self.decode_threads, self.requests_in_flight = decode_threads, requests_in_flight
        self.cache, self.return_index, self.check_chunks = bool(cache), bool(return_index), bool(check_chunks)
        self.return_padding = bool(return_padding)
        self.transform = transform
        self.config: LoaderConfig | None = None  # set by the ZarrDataLoader that iterates this dataset
        self.epoch_state: EpochState | None = None
        self.ring: BatchRing | None = None  # the loader's shared batch slots, when its workers use them
        self._cache_store: dict | None = None
        self._cache_owner: int | None = None
        self._early: EarlyReads | None = None  # the next epoch's first reads, started as this one ends
        self._loader_starting = False  # True while a ZarrDataLoader starts an epoch in this process

    def attach(self, config: LoaderConfig, epoch_state: EpochState, ring: BatchRing | None = None) -> None:
        """Called by :class:`zarrtorch.ZarrDataLoader` each time it starts an epoch, before its workers copy
        the dataset: two loaders may share one dataset (say with other batch sizes), each epoch then
        runs with the configuration of the loader that iterates it."""
        if config != self.config:
            self._cache_store = None
        self.config, self.epoch_state, self.ring = config, epoch_state, ring

    def __repr__(self) -> str:
        stores = sorted({store_label(a, self._secrets) for a in self.arrays.values()})
        return (
            f"ZarrIterableDataset({', '.join(stores)}, arrays={list(self.arrays)}, rows={self.rows}, "
            f"chunk_rows={self.chunk_rows}, shuffle={self.shuffle}, seed={self.seed}, "
            f"buffer_chunks={self.buffer_chunks})"
        )

    @property
    def rows(self) -> int:
        return self.layout.rows

    @property
    def chunk_rows(self) -> int:
        return self.layout.chunk_rows

    @property
    def buffer_rows(self) -> int:
        return self.buffer_chunks * self.chunk_rows

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of every array together, as stored (decompressed): what the buffer holds."""
        return row_bytes(self.arrays)

    @property
    def columns(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Row shape and dtype of each array as stored: the shuffle buffer's columns."""
        return {n: (tuple(a.shape[1:]), np.dtype(a.dtype)) for n, a in self.arrays.items()}

    @property
    def out_columns(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Row shape and dtype of each array in a batch (CF-packed arrays decoded, :mod:`zarrtorch.cf`)."""
        return {n: (shape, self.packings[n].dtype if n in self.packings else dt) for n, (shape, dt) in
                self.columns.items()}  # fmt: skip

    @property
    def batch_row_bytes(self) -> int:
        """Bytes of one row of every array in a batch (decoded CF-packed arrays are wider than stored)."""
        return sum(int(np.prod(shape, dtype=np.int64)) * dt.itemsize for shape, dt in self.out_columns.values())

    def in_flight(self, decode_threads: int) -> int:
        """Chunks one process decoding in ``decode_threads`` threads reads ahead at once (remote: 8)."""
        return self.requests_in_flight or (decode_threads + 1 if all_local(self.arrays) else 8)

    def worker_memory_bytes(self, decode_threads: int = 1) -> int:
        """Decoded data one worker holds at most (:func:`zarrtorch.sizes.held_chunks` chunks; no buffer
        without ``shuffle`` or with ``buffer_chunks=0``)."""
        held = held_chunks(buffer_chunks=self.buffer_chunks, in_flight=self.in_flight(decode_threads),
                           row_shuffle=self._row_shuffle)  # fmt: skip
        return held * self.chunk_rows * self.row_bytes

    def fingerprint(self, batch_size: int, drop_last: bool) -> str:
        """What fixes this dataset's batches for a loader of ``batch_size`` and ``drop_last``
        (:func:`zarrtorch.plan.plan_fingerprint`), for checkpoints and the ranks' agreement."""
        return plan_fingerprint(
            rows=self.rows, chunk_rows=self.chunk_rows, row_offset=self.row_offset, seed=self.seed,
            shuffle=self.shuffle, buffer_chunks=self.buffer_chunks, cache=self.cache, batch_size=int(batch_size),
            drop_last=bool(drop_last),
        )  # fmt: skip

    def _require_config(self) -> LoaderConfig:
        if self.config is None:
            raise TypeError(THROUGH_THE_LOADER)
        return self.config

    def current_epoch(self) -> EpochView:
        """Epoch, batches to skip, rank and world size as published by the loader, else from torch.distributed."""
        return epoch_view(self.epoch_state)

    def plan(
        self, *, epoch: int, rank: int = 0, world_size: int = 1, history: tuple = (), **loader_settings
    ) -> RankPlan:
        """The epoch's plan for one rank. ``num_workers``, ``batch_size`` and ``drop_last`` default to the
        loader's configuration; ``history`` (the epoch's earlier segments on other topologies, see
        :mod:`zarrtorch.resume`) gives the plan of what is left of an interrupted epoch."""
        cfg = self.config
        settings = {"num_workers": cfg.num_workers if cfg else 0}
        if cfg is not None:
            settings.update(batch_size=cfg.batch_size, drop_last=cfg.drop_last)
        settings.update((k, v) for k, v in loader_settings.items() if v is not None)
        if "batch_size" not in settings or "drop_last" not in settings:
            self._require_config()
        if history:
            if self.cache:
                raise ValueError("cache=True freezes the partition on one topology: it cannot continue an epoch "
                                 "on another; resume on the saved topology or start the epoch afresh")  # fmt: skip
            spec = EpochSpec(self.rows, self.chunk_rows, self.seed, epoch, settings["batch_size"],
                             settings["drop_last"], self.shuffle, self.buffer_chunks)  # fmt: skip
            return resumed_plan(spec, tuple(history), world_size=world_size, rank=rank,
                                num_workers=settings["num_workers"])  # fmt: skip
        return epoch_plan(
            self.rows, self.chunk_rows, seed=self.seed, epoch=epoch, world_size=world_size, rank=rank,
            shuffle=self.shuffle, freeze_partition=self.cache, **settings,
        )  # fmt: skip

    @property
    def _row_shuffle(self) -> bool:
        """Whether rows go through the shuffle buffer (``shuffle`` and ``buffer_chunks >= 1``)."""
        return self.shuffle and self.buffer_chunks > 0

    def batch_row_ids(self, *, epoch: int, rank: int = 0, world_size: int = 1, **loader_settings) -> list[np.ndarray]:
        """The global row numbers of every batch the loader yields on ``rank``, in order, computed without
        reading data (the same schedule the workers run). Settings as for :meth:`plan`."""
        plan = self.plan(epoch=epoch, rank=rank, world_size=world_size, **loader_settings)
        batches = rank_batches(
            plan, seed=self.seed, chunk_rows=self.chunk_rows, buffer_chunks=self.buffer_chunks,
            row_shuffle=self._row_shuffle,
        )  # fmt: skip
        return [b + self.row_offset for b in batches]

    def __len__(self) -> int:
        cfg = self._require_config()
        view = self.current_epoch()
        plan = self.plan(epoch=view.epoch, rank=view.rank, world_size=view.world_size, history=view.history,
                         num_workers=cfg.num_workers)  # fmt: skip
        return sum(seg.batches for seg in view.history) + plan.batches

    # -- iteration (runs in each worker, or in the main process) ------------------------------------
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        if info is None and not self._loader_starting:
            raise TypeError(THROUGH_THE_LOADER)  # outside a DataLoader nothing says how to batch or split
        cfg = self._require_config()
        view = self.current_epoch()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 0)
        if n_workers != cfg.num_workers:
            raise RuntimeError(f"the loader was configured for {cfg.num_workers} workers but runs {n_workers}")
        plan = self.plan(
            epoch=view.epoch, rank=view.rank, world_size=view.world_size, history=view.history, num_workers=n_workers
        )
        logical, worker_skip = resume_roles([len(w.batch_sizes) for w in plan.workers], view.skip)[worker]
        threads = self.decode_threads or cpu_share(n_workers)
        if self.cache and (self._cache_store is None or self._cache_owner != logical):
            self._cache_store, self._cache_owner = {}, logical  # rows of another share would never be reused
        if self._arrays_pid != os.getpid():  # a worker (or a fork of one): its own connections and buffers
            self.arrays, self._arrays_pid, self._pools = for_this_process(self.arrays), os.getpid(), Pools()
        reader = PieceReader(
            self.arrays, self.chunk_rows, threads=threads, prefetch=self.in_flight(threads), policy=self.retry,
            check_missing=self.check_chunks, cache=self._cache_store if self.cache else None, pools=self._pools,
            early=self._early, first=None if worker_skip else plan.workers[logical].pieces + self.row_offset,
            secrets=self._secrets,
        )  # fmt: skip
        if reads_early(self.arrays, cache=self.cache, lives_on=info is None or cfg.persistent_workers):
            reader.after_last = lambda submit: self._read_next_epoch_early(submit, reader, view, worker, n_workers)
        rng = buffer_rng(self.seed, view.epoch, view.rank, logical, self._row_shuffle, plan.segment)  # None: in order
        columns = self.columns
        writer = self.ring.writer(worker) if self.ring is not None and info is not None else None
        out = (
            writer.out
            if writer is not None
            else self._pools.batches(cfg.batch_size, {**INDEX_ONLY, **self.out_columns})
        )
        batches = stream_batches(
            reader, plan.workers[logical], columns, row_offset=self.row_offset, buffer_rows=self.buffer_rows,
            warmup_rows=self.chunk_rows, rng=rng, skip=worker_skip, copy_direct=self.cache, out=out, pools=self._pools,
        )  # fmt: skip
        if self.packings:
            batches = (self._decoded(batch, owned=writer is None or writer.in_slot) for batch in batches)
        if self.return_padding:
            padding = plan.padding + self.row_offset
            batches = (self._with_padding(batch, padding, writer) for batch in batches)
        if writer is not None:  # the batch is in a shared slot: send where (zarrtorch.ring)
            return (writer.send(batch, self._to_torch) for batch in batches)
        return (self._to_torch(batch) for batch in batches)

    @staticmethod
    def _with_padding(batch: dict[str, np.ndarray], padding: np.ndarray, writer) -> dict[str, np.ndarray]:
        """The batch with ``"padding"``: which of its rows this rank reads only to even out the ranks (a row
        is never both padding and data on one rank, :attr:`zarrtorch.plan.RankPlan.padding`)."""
        mask = np.isin(batch["index"], padding) if len(padding) else np.zeros(len(batch["index"]), bool)
        if writer is not None and writer.in_slot:
            writer.last_arrays["padding"][...] = mask
        batch["padding"] = mask
        return batch

    def _decoded(self, batch: dict[str, np.ndarray], owned: bool) -> dict[str, np.ndarray]:
        """The batch with its CF-packed columns decoded: in place in the batch's own arrays (gathered in the
        decoded dtype), or into copies where the batch holds views of a chunk (``owned=False``)."""
        for name, packing in self.packings.items():
            rows = batch[name]
            if not owned or rows.dtype != packing.dtype:
                rows = batch[name] = rows.astype(packing.dtype)
            packing.decode(rows)
        return batch

    def _read_next_epoch_early(self, submit, reader: PieceReader, view: EpochView, worker: int, n_workers: int):
        """Start the next epoch's first reads in ``reader``'s threads as this one ends (:mod:`zarrtorch.early`)."""
        nxt = self.plan(epoch=view.epoch + 1, rank=view.rank, world_size=view.world_size, num_workers=n_workers)
        self._early = EarlyReads(submit, reader.read_piece, nxt.workers[worker].pieces + self.row_offset,
                                 reader.prefetch)  # fmt: skip
        return self._early

    def _to_torch(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        batch = stack_columns(batch, self.stack)
        out = {name: torch.from_numpy(arr) for name, arr in batch.items() if name != "index" or self.return_index}
        if self.transform is None or (self.config is not None and self.config.transform_in_consumer):
            return out
        return self.transform(out)
