"""``ZarrIterableDataset``: each DataLoader worker streams whole batches of its share of an epoch.

Every process (rank, worker) evaluates the same pure plan (:mod:`zarrtorch.plan`) and reads only its own
pieces; batches are assembled inside the worker through the bounded shuffle buffer
(:mod:`zarrtorch.buffer`), so whole batches, not samples, cross the process boundary. What fixes the plan
comes from the loader as one :class:`zarrtorch.plan.EpochSpec`; the epoch, the resume point and the rank /
world size come in a small shared-memory tensor (:class:`zarrtorch._workers.shared.EpochState`), which
reaches workers whatever their start method, persistent or not.
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from functools import partial

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from zarrtorch._read.chunks import FINGERPRINT_BYTES, first_bytes
from zarrtorch._read.columns import (
    BatchDecoder,
    check_stack,
    check_tensor_dtypes,
    decode_block_bytes,
    packing,
    packings,
    stack_columns,
)
from zarrtorch._read.early import EarlyReads, reads_early
from zarrtorch._read.inflight import HOLD, InFlight
from zarrtorch._read.listing import check_listed, written_whole
from zarrtorch._read.reader import PieceReader
from zarrtorch._read.source import (
    Arrays,
    all_local,
    for_this_process,
    is_local,
    open_arrays,
    open_source,
    secrets_of,
    store_label,
)
from zarrtorch._read.static import check_static, static_array
from zarrtorch._util.arguments import INT64_LIMIT, flag, names, whole_number
from zarrtorch._util.arguments import row_range as checked_row_range
from zarrtorch._util.pool import Pools
from zarrtorch._util.process import cpu_share
from zarrtorch._util.sizes import held_chunks, native, pieces_per_read, row_bytes
from zarrtorch._workers.ring import BatchRing
from zarrtorch._workers.shared import EpochState, EpochView, LoaderConfig, epoch_view
from zarrtorch.buffer import INDEX_ONLY, buffer_rng
from zarrtorch.layout import FirstAxisLayout, check_first_axis_layout, restrict_rows
from zarrtorch.options import ReadOptions, deprecated_dataset_arguments
from zarrtorch.plan import EpochSpec, RankPlan, Topology, resume_roles, shuffles_rows
from zarrtorch.resume import batches_of, resumed_plan
from zarrtorch.stream import stream_batches
from zarrtorch.window_stream import chunk_reads, held_chunks_bound, stream_windows, worker_window_batches
from zarrtorch.windows import Windows, WindowStarts, check_rows, no_windows_message

REMOTE_IN_FLIGHT = 8  # requests in flight a remote store keeps at least
REMOTE_START = 32  # and starts with (a first epoch at 100 ms spent a third of its time growing from 8)
IN_FLIGHT_BYTES = 256 * 2**20  # decoded chunks the adaptive requests in flight may hold, per process
MOST_IN_FLIGHT = 256  # and never more requests on the wire than this (benchmarks/README.md)

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
        variables: names of the arrays to load (default: all data arrays).
        shuffle: shuffle the chunk order every epoch (shared seed) and rows in the buffer.
        seed: the seed every process shares; together with the epoch it fixes the whole epoch's order.
        buffer_chunks: shuffle-buffer size per worker, in chunks; memory per worker is about
            ``(buffer_chunks + requests_in_flight + 1) x chunk bytes`` (see ``worker_memory_bytes``).
            ``0``: chunk order only (with ``shuffle`` the chunk order still changes every epoch, but each
            worker streams its rows in order and holds no buffer). Without ``shuffle`` no buffer is used.
        row_range: ``(start, stop)``: use only these rows, e.g. a training period and a validation
            period of one store, without copying. ``start`` must fall on a chunk boundary, and so must
            ``stop`` unless it is the end. Row numbers (``return_index``) stay those of the store.
        stack: ``{name: [array names]}``: yield those arrays as one ``name`` with a channel axis 1 (one
            array per variable, as in ERA5-like stores, becomes one input tensor).
        transform: a picklable callable applied to each batch dict (in the workers; with ``num_workers=0``
            in the consumer's thread, so that its random draws interleave with the training step's).
        return_index: add ``"index"``, the global row numbers of the batch.
        return_padding: add ``"padding"``, a bool per row, True for the rows repeated only to give every rank
            the same number of batches (``drop_last=False``): leave them out of a metric's mean.
        keep_in_memory: keep the rows a process reads in RAM for later epochs (data that fits the cluster's
            memory); the chunk-to-rank assignment is then frozen at epoch 0's (the order in each process still
            changes). Memory, not disk: nothing is written.
        read: how the store is read (:class:`zarrtorch.ReadOptions`: decode threads, requests in flight,
            storage options, retries, missing chunks, shards, CF decoding). A store not written by ``prepare_zarr``
            (which writes every chunk) is listed once per array here, where it can list, and refused naming its
            missing chunks unless ``ReadOptions(missing_chunks='fill')``.
        windows: make each sample a window of consecutive time steps (:class:`zarrtorch.windows.Windows`:
            input and target steps, stride, arrays by role, static arrays, gaps). Every guarantee then holds
            for window starts: each valid start once per epoch, equal batches per rank, resume, ``audit``.
            ``rows`` and ``chunk_rows`` then count window ids and blocks; ``row_range`` need not fall on chunk
            boundaries, and keeps every step of every window inside it.
    """

    def __init__(
        self,
        source,
        *,
        variables: Sequence[str] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        buffer_chunks: int = 8,
        row_range: tuple[int, int] | None = None,
        stack: dict[str, Sequence[str]] | None = None,
        transform: Callable[[dict], dict] | None = None,
        return_index: bool = False,
        return_padding: bool = False,
        keep_in_memory: bool = False,
        read: ReadOptions | None = None,
        windows: Windows | None = None,
        **deprecated,
    ):
        read, renamed = deprecated_dataset_arguments(read, deprecated)
        variables = names(renamed.get("variables", variables), "variables")
        keep_in_memory = flag(renamed.get("keep_in_memory", keep_in_memory), "keep_in_memory")
        shuffle, return_index = flag(shuffle, "shuffle"), flag(return_index, "return_index")
        return_padding = flag(return_padding, "return_padding")
        seed = whole_number(seed, "seed (shared by every process)", least=0, below=INT64_LIMIT)
        buffer_chunks = whole_number(buffer_chunks, "buffer_chunks (0: chunk order only, no row buffer)", least=0)
        row_range = checked_row_range(row_range)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be a function batch dict -> batch dict (picklable), got {transform!r}")
        self.read = read
        self.windows = windows
        source = open_source(source, read.storage_options, read.retry)
        self.arrays = Arrays(open_arrays(source, variables, retry=read.retry), secrets_of(read.storage_options))
        self.static: dict[str, np.ndarray] = {}  # windows: the arrays without a time axis, read once
        self._static_fingerprints: dict[str, str] = {}  # a hash of each one's values as stored
        if windows is not None and windows.static:
            self.static = self._static_arrays(source, windows.static, read)
        self._secrets = secrets_of(read.storage_options)  # never shown in a message (zarrtorch._read.source.redact)
        check_tensor_dtypes({**self.arrays, **self.static}, chosen=variables is not None)
        self.layout = check_first_axis_layout(self.arrays, allow_shards=read.allow_shards)
        self.packings = packings(self.arrays, read.decode_cf, read.cf_dtype)
        self.stack = check_stack(stack, self.decoded_columns)
        self.row_offset = 0
        self.starts: WindowStarts | None = None
        self.store_chunk_rows = self.layout.chunk_rows
        if windows is not None:
            self._use_windows(windows, row_range, stack, keep_in_memory)
        elif row_range is not None:
            self.row_offset, self.layout = restrict_rows(self.layout, row_range)
        if read.missing_chunks == "error":  # listed, but arrays whose store says it holds every chunk
            whole = written_whole(source, self.arrays)
            check_listed(self.arrays, self.store_row_spans(), skip=whole, policy=read.retry, secrets=self._secrets)
        self.shuffle, self.seed, self.buffer_chunks = bool(shuffle), int(seed), int(buffer_chunks)
        self.keep_in_memory, self.return_index = bool(keep_in_memory), bool(return_index)
        self.return_padding = bool(return_padding)
        self._check_batch_keys()
        self.transform = transform
        self._data_fingerprints: dict[str, str] | None = None  # data_fingerprints(), once computed
        self._arrays_pid = os.getpid()  # the process the arrays were opened in: see __iter__
        self._start_epochs()

    def _start_epochs(self) -> None:
        """No epoch run yet: the state a loader's epochs build up in its dataset (a loader iterates its own copy,
        :meth:`for_loader`)."""
        self.config: LoaderConfig | None = None  # set by the ZarrDataLoader that iterates this dataset
        self.epoch_state: EpochState | None = None
        self.ring: BatchRing | None = None  # the loader's shared batch slots, when its workers use them
        self._pools = Pools()  # per process: see __iter__
        self._in_flight: InFlight | None = None  # per process too
        self._kept: dict | None = None  # keep_in_memory: the pieces this process read, by row range
        self._kept_for: int | None = None  # the (logical) worker whose share they are
        self._early: EarlyReads | None = None  # the next epoch's first reads, started as this one ends
        self._loader_starting = False  # True while a ZarrDataLoader starts an epoch in this process

    def for_loader(self) -> ZarrIterableDataset:
        """The copy of this dataset a :class:`~zarrtorch.ZarrDataLoader` iterates: the opened arrays and every
        setting shared, none of the state its epochs build up (the next epoch's early reads, rows kept in
        memory, buffers, the batch slots). Two loaders on one dataset then run their epochs apart: one's reads
        for its next epoch, taken by the other, wrote into the buffer it was still draining."""
        own = copy.copy(self)
        own._start_epochs()
        return own

    def _check_batch_keys(self) -> None:
        """Refuse arrays whose batch key another one takes: an array named ``index`` or ``padding`` (the loader's
        own keys), or ``x_target`` beside ``x``'s targets; one silently replaced the other's data (found by a
        break-test)."""
        if self.windows is None:
            keys = [(n, f"array {n!r}") for n in self.arrays]
        else:
            keys = [(n, f"input array {n!r}") for n in self.inputs]
            keys += [(n + "_target", f"the targets of {n!r}") for n in self.targets]
            keys += [(n, f"static array {n!r}") for n in self.static]
        keys.append(("index", "the loader's window starts or row numbers"))
        if self.return_padding:
            keys.append(("padding", "the loader's padding flags (return_padding=True)"))
        owners: dict[str, list[str]] = {}
        for key, owner in keys:
            owners.setdefault(key, []).append(owner)
        clashes = {k: v for k, v in owners.items() if len(v) > 1}
        if clashes:
            said = "; ".join(f"{k!r} would hold {' and '.join(v)}" for k, v in clashes.items())
            raise ValueError(f"two things share one key of a batch: {said}. Rename the array (prepare_zarr)")

    def _static_arrays(self, source, names, read: ReadOptions) -> dict[str, np.ndarray]:
        """The static arrays, whole and CF-decoded as the time arrays are: taken out of the time arrays if opened
        with them. Their fingerprints hash the values as stored, as the time arrays' do: how they are decoded
        (``cf_dtype``, ``decode_cf``) is not the data."""
        arrays = {n: self.arrays.pop(n) for n in names if n in self.arrays}
        rest = [n for n in names if n not in arrays]
        if rest:
            arrays.update(open_arrays(source, rest, retry=read.retry))
        secrets, check_missing = secrets_of(read.storage_options), read.missing_chunks == "error"
        static = {}
        for n, a in arrays.items():
            check_static(n, a, self.arrays)
            values = static_array(n, a, retry=read.retry, check_missing=check_missing, secrets=secrets)
            self._static_fingerprints[n] = _short_hash(np.ascontiguousarray(values).tobytes())
            packed = packing(n, a, read.cf_dtype) if read.decode_cf else None
            static[n] = packed.decoded(values) if packed is not None else values
        return static

    def _use_windows(self, windows: Windows, row_range, stack, keep_in_memory: bool) -> None:
        """Plan window ids in blocks instead of rows in chunks (:mod:`zarrtorch.windows`)."""
        if stack:
            raise ValueError("stack= is not available with windows=: stack the variables when preparing the store")
        if keep_in_memory:
            raise ValueError("keep_in_memory=True is not available with windows=")
        self.inputs, self.targets = windows.roles(list(self.arrays))
        check_rows(windows, self.layout.rows)
        self.starts = WindowStarts.of(windows, self.layout.rows, row_range)
        # the period's first row, in the plan's fingerprint: a state of another period of as many windows was
        # taken for this one (found by a break-test: 32 of the new period's windows never yielded)
        self._period_from = 0 if row_range is None else int(row_range[0])
        if self.starts.n == 0:
            raise ValueError(no_windows_message(windows, self.layout.rows, row_range))
        self.layout = FirstAxisLayout(
            rows=self.starts.n,
            chunk_rows=windows.block_rows(self.store_chunk_rows, self.starts.n),
            sharded=self.layout.sharded,
        )
        self._store_rows = next(iter(self.arrays.values())).shape[0]

    def bind(self, config: LoaderConfig, epoch_state: EpochState, ring: BatchRing | None = None) -> None:
        """Called by :class:`zarrtorch.ZarrDataLoader` each time it starts an epoch, before its workers copy
        the dataset: two loaders may share one dataset (say with other batch sizes), each epoch then
        runs with the configuration of the loader that iterates it."""
        if config != self.config:
            self._kept = None
        self.config, self.epoch_state, self.ring = config, epoch_state, ring

    def __repr__(self) -> str:
        stores = sorted({store_label(a, self._secrets) for a in self.arrays.values()})
        return (
            f"ZarrIterableDataset({', '.join(stores)}, variables={list(self.arrays)}, rows={self.rows}, "
            f"chunk_rows={self.chunk_rows}, shuffle={self.shuffle}, seed={self.seed}, "
            f"buffer_chunks={self.buffer_chunks})"
        )

    # -- what the store holds ------------------------------------------------------------------------
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
        """Row shape and dtype of each array as stored, in this machine's byte order (a tensor has no other;
        Zarr v2 arrays may be stored big-endian): the shuffle buffer's columns."""
        return {n: (tuple(a.shape[1:]), native(a.dtype)) for n, a in self.arrays.items()}

    @property
    def decoded_columns(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Row shape and dtype of each array once decoded (CF-packed arrays, :mod:`zarrtorch._read.columns`)."""
        return {
            name: (shape, self.packings[name].dtype if name in self.packings else dtype)
            for name, (shape, dtype) in self.columns.items()
        }

    @property
    def out_columns(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Row shape and dtype of each array in a batch (CF-packed arrays decoded, :mod:`zarrtorch._read.columns`);
        with ``windows``, each input array ``(history, *row)``, each target ``name_target`` ``(lead, *row)`` and
        each static array its own shape."""
        decoded = self.decoded_columns
        if self.windows is None:
            return decoded
        w = self.windows
        out = {n: ((w.history, *decoded[n][0]), decoded[n][1]) for n in self.inputs}
        out.update({n + "_target": ((w.lead, *decoded[n][0]), decoded[n][1]) for n in self.targets})
        out.update({n: (a.shape, native(a.dtype)) for n, a in self.static.items()})
        return out

    def _packed_out_columns(self) -> dict[str, str]:
        """Each batch column holding a CF-packed array: ``{column: array}`` (with ``windows``, ``name`` for the
        inputs and ``name_target`` for the targets)."""
        if self.windows is None:
            return {n: n for n in self.packings}
        columns = {n: n for n in self.inputs if n in self.packings}
        columns.update({n + "_target": n for n in self.targets if n in self.packings})
        return columns

    def _packed_columns(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Row shape and stored dtype of each batch column holding a CF-packed array: what its rows are gathered
        into before they are decoded (:class:`~zarrtorch._read.columns.BatchDecoder`)."""
        out, stored = self.out_columns, self.columns
        return {c: (out[c][0], stored[n][1]) for c, n in self._packed_out_columns().items()}

    def decode_bytes(self) -> int:
        """Bytes a reading process holds to decode CF-packed columns: one batch of them gathered as stored, and
        the float64 block the decode computes in (:func:`~zarrtorch._read.columns.decode_block_bytes`)."""
        packed = self._packed_columns()
        if not packed:
            return 0
        batch = self.config.batch_size if self.config is not None else 1
        values = {c: int(np.prod(shape, dtype=np.int64)) for c, (shape, _) in packed.items()}
        gathered = batch * sum(values[c] * dt.itemsize for c, (_, dt) in packed.items())
        return gathered + max(decode_block_bytes(v, batch) for v in values.values())

    @property
    def batch_row_bytes(self) -> int:
        """Bytes of one row of every array in a batch (decoded CF-packed arrays are wider than stored)."""
        return sum(int(np.prod(shape, dtype=np.int64)) * dt.itemsize for shape, dt in self.out_columns.values())

    # -- memory --------------------------------------------------------------------------------------
    def in_flight_range(self, decode_threads: int) -> tuple[int, int]:
        """(first, most) chunk reads one process decoding in ``decode_threads`` threads keeps in flight: the
        value set, or ``decode_threads + 1`` for a local store (fixed); for a remote one from 32 (at least 8),
        grown while the consumer waits for data and it pays (:mod:`zarrtorch._read.inflight`), up to what
        ``IN_FLIGHT_BYTES`` of decoded chunks hold (8 to ``MOST_IN_FLIGHT`` requests)."""
        if self.read.requests_in_flight:
            return self.read.requests_in_flight, self.read.requests_in_flight
        if all_local(self.arrays):
            return decode_threads + 1, decode_threads + 1
        chunk_bytes = max(1, self.store_chunk_rows * self.row_bytes)
        return REMOTE_IN_FLIGHT, max(REMOTE_IN_FLIGHT, min(MOST_IN_FLIGHT, IN_FLIGHT_BYTES // chunk_bytes))

    def pieces_ahead_most(self, decode_threads: int) -> int:
        """Pieces one process may hold read ahead, on the wire or finished and waiting their turn: the fixed
        number, or for an adapted one ``HOLD`` x its most (:attr:`~zarrtorch._read.inflight.InFlight.held`)
        within what ``IN_FLIGHT_BYTES`` of decoded chunks hold."""
        first, most = self.in_flight_range(decode_threads)
        if first == most:
            return most
        chunk_bytes = max(1, self.store_chunk_rows * self.row_bytes)
        return max(most, min(HOLD * MOST_IN_FLIGHT, IN_FLIGHT_BYTES // chunk_bytes))

    def in_flight_start(self, decode_threads: int) -> int:
        """Requests in flight a process starts its first epoch with (later epochs start where the last left off):
        ``REMOTE_START`` within :meth:`in_flight_range` when adapted, else the fixed number."""
        first, most = self.in_flight_range(decode_threads)
        return first if first == most else min(most, max(first, REMOTE_START))

    def in_flight(self, decode_threads: int) -> int:
        """Chunks one process keeps read ahead at most (its reads in flight and those waiting their turn,
        :meth:`pieces_per_read` chunks each): what the memory budget counts."""
        return self.pieces_ahead_most(decode_threads) * self.pieces_per_read()

    def pieces_per_read(self) -> int:
        """Consecutive pieces (one chunk each) a reading thread reads per task: 1, or for a local store
        whose chunks are small, up to 256 KiB of them (:func:`zarrtorch._util.sizes.pieces_per_read`); a remote
        store's requests, and reads in flight that were set, stay one chunk each."""
        if self.read.requests_in_flight or not all_local(self.arrays):
            return 1
        return pieces_per_read(self.store_chunk_rows * self.row_bytes)

    def decode_threads(self, num_workers: int) -> int:
        """Threads decoding in each reading process of a loader with ``num_workers`` workers."""
        return self.read.decode_threads or cpu_share(num_workers)

    def worker_memory_bytes(self, decode_threads: int = 1) -> int:
        """Decoded data one worker holds at most (:func:`zarrtorch._util.sizes.held_chunks` chunks; no buffer
        without ``shuffle`` or with ``buffer_chunks=0``), and what it decodes CF-packed columns in."""
        row_shuffle = shuffles_rows(self.shuffle, self.buffer_chunks)
        if self.windows is not None:
            held = self._window_chunks_held(decode_threads, row_shuffle)
            return held * self.store_chunk_rows * self.row_bytes + self.decode_bytes()
        held = held_chunks(
            buffer_chunks=self.buffer_chunks, in_flight=self.in_flight(decode_threads), row_shuffle=row_shuffle
        )
        # a buffer smaller than a batch grows to hold the batch (zarrtorch.buffer.buffer_capacity): batches of
        # 8,192 rows from a buffer of 1,024 once held 64 MiB per worker more than was counted
        batch = self.config.batch_size if self.config is not None else 0
        grown = max(0, batch - self.buffer_rows) if row_shuffle else 0
        return (held * self.chunk_rows + grown) * self.row_bytes + self.decode_bytes()

    def _window_chunks_held(self, decode_threads: int, row_shuffle: bool) -> int:
        """Store chunks one worker holds at most with ``windows`` (:mod:`zarrtorch.window_stream`): those its window
        batches draw from (:func:`~zarrtorch.window_stream.held_chunks_bound`, which the worker keeps to) and its
        reads in flight."""
        return self._window_chunks_for_batches(row_shuffle) + self.in_flight(decode_threads)

    def _window_chunks_for_batches(self, row_shuffle: bool | None = None) -> int:
        """The chunks of :meth:`_window_chunks_held` that window batches draw from (not those in flight)."""
        if row_shuffle is None:
            row_shuffle = shuffles_rows(self.shuffle, self.buffer_chunks)
        batch = self.config.batch_size if self.config is not None else 1
        return held_chunks_bound(
            self.windows,
            block_rows=self.chunk_rows,
            chunk_rows=self.store_chunk_rows,
            buffer_rows=self.buffer_rows if row_shuffle else 0,
            batch_size=batch,
            runs=self.starts.most_runs(self.chunk_rows),
        )

    def store_row_spans(self) -> list[tuple[int, int]]:
        """The store rows this dataset reads, as ``[start, stop)`` spans: its rows, or with ``windows`` the rows of
        each step of the windows (not the gaps between segments, nor rows a stride steps over by whole chunks)."""
        if self.starts is None:
            return [(self.row_offset, self.row_offset + self.rows)]
        runs = zip(self.starts.first.tolist(), self.starts.counts.tolist(), strict=True)
        return [(a + o, a + n + o) for a, n in runs for o in self.windows.offsets.tolist()]

    # -- the plan ------------------------------------------------------------------------------------
    def spec(self, batch_size: int, drop_last: bool) -> EpochSpec:
        """What fixes every epoch's batches of this dataset in a loader of ``batch_size`` and ``drop_last``. Without
        ``shuffle`` neither the seed nor the buffer changes a batch: both are left out (0), so that a state saved
        with other values of them resumes."""
        return EpochSpec(
            rows=self.rows,
            chunk_rows=self.chunk_rows,
            batch_size=int(batch_size),
            drop_last=bool(drop_last),
            seed=self.seed if self.shuffle else 0,
            shuffle=self.shuffle,
            buffer_chunks=self.buffer_chunks if self.shuffle else 0,
            freeze_partition=self.keep_in_memory,
            row_offset=self.row_offset if self.windows is None else self._period_from,
            windows=self.windows.describe() if self.windows is not None else "",
        )

    def data_fingerprints(self) -> dict[str, str]:
        """A short hash per array of the first bytes of its first chunk as stored (a static array: of its whole
        value as stored), read once per process: what checkpoints hold and the ranks' agreement check compares
        besides the plan, so that a state of one store is not resumed on another of the same shape, nor ranks opened
        on different stores train on both. Identical copies at other paths agree. Only the first chunk: a cheap
        check, not a proof."""
        if self._data_fingerprints is None:
            found = {}
            for name, arr in sorted(self._arrays_of_this_process().items()):
                head = first_bytes(arr, FINGERPRINT_BYTES, None if is_local(arr) else self.read.retry)
                found[name] = _short_hash(head if head is not None else b"missing")
            found.update(sorted(self._static_fingerprints.items()))
            self._data_fingerprints = found
        return dict(self._data_fingerprints)

    def data_fingerprint(self) -> str:
        """:meth:`data_fingerprints` in one short hash."""
        return _short_hash(repr(sorted(self.data_fingerprints().items())).encode())

    def fingerprint(self, batch_size: int, drop_last: bool) -> str:
        """:meth:`zarrtorch.plan.EpochSpec.fingerprint` of :meth:`spec`: for checkpoints and the ranks' agreement."""
        return self.spec(batch_size, drop_last).fingerprint()

    def _loader_spec(self, batch_size: int | None, drop_last: bool | None) -> EpochSpec:
        """:meth:`spec` with the batch size and ``drop_last`` given, else those of the loader iterating this."""
        cfg = self.config
        if cfg is None and (batch_size is None or drop_last is None):
            raise TypeError(THROUGH_THE_LOADER + " (or pass batch_size= and drop_last=)")
        return self.spec(
            cfg.batch_size if batch_size is None else batch_size, cfg.drop_last if drop_last is None else drop_last
        )

    def plan(
        self,
        *,
        epoch: int,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int | None = None,
        batch_size: int | None = None,
        drop_last: bool | None = None,
        history: tuple = (),
    ) -> RankPlan:
        """The epoch's plan for one rank. ``num_workers``, ``batch_size`` and ``drop_last`` default to those of
        the loader iterating this dataset; ``history`` (the epoch's earlier segments on other topologies, see
        :mod:`zarrtorch.resume`) gives the plan of what is left of an interrupted epoch."""
        spec = self._loader_spec(batch_size, drop_last)
        workers = (self.config.num_workers if self.config else 0) if num_workers is None else num_workers
        return resumed_plan(spec, epoch, tuple(history), Topology(rank, world_size, workers))

    def batch_row_ids(
        self,
        *,
        epoch: int,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int | None = None,
        batch_size: int | None = None,
        drop_last: bool | None = None,
        history: tuple = (),
    ) -> list[np.ndarray]:
        """The global row numbers of every batch the loader yields on ``rank``, in order, computed without
        reading data (the same schedule the workers run). Settings as for :meth:`plan`."""
        spec = self._loader_spec(batch_size, drop_last)
        plan = self.plan(
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            num_workers=num_workers,
            batch_size=spec.batch_size,
            drop_last=spec.drop_last,
            history=history,
        )
        return [self._index_of(b) for b in batches_of(spec, plan)]

    def _index_of(self, ids: np.ndarray) -> np.ndarray:
        """The store rows plan ids name: rows (``row_offset`` added), or windows' start rows."""
        return self.starts.start(ids) if self.starts is not None else ids + self.row_offset

    def _require_config(self) -> LoaderConfig:
        if self.config is None:
            raise TypeError(THROUGH_THE_LOADER)
        return self.config

    def current_epoch(self) -> EpochView:
        """Epoch, batches to skip, rank and world size as published by the loader, else from torch.distributed."""
        return epoch_view(self.epoch_state)

    def __len__(self) -> int:
        cfg = self._require_config()
        view = self.current_epoch()
        plan = resumed_plan(cfg.spec, view.epoch, view.history, Topology(view.rank, view.world_size, cfg.num_workers))
        return sum(seg[2] for seg in view.history) + plan.batches

    # -- iteration (runs in each worker, or in the main process) ------------------------------------
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        if info is None and not self._loader_starting:
            raise TypeError(THROUGH_THE_LOADER)  # outside a DataLoader nothing says how to batch or split
        cfg = self._require_config()
        spec = cfg.spec
        view = self.current_epoch()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 0)
        if n_workers != cfg.num_workers:
            raise RuntimeError(f"the loader was configured for {cfg.num_workers} workers but runs {n_workers}")
        plan = resumed_plan(spec, view.epoch, view.history, Topology(view.rank, view.world_size, n_workers))
        logical, worker_skip = resume_roles([len(w.batch_sizes) for w in plan.workers], view.skip)[worker]
        threads = self.decode_threads(n_workers)
        if self.keep_in_memory and (self._kept is None or self._kept_for != logical):
            self._kept, self._kept_for = {}, logical  # rows of another share would never be reused
        self._arrays_of_this_process()
        first, most = self.in_flight_range(threads)
        if self._in_flight is None or (self._in_flight.first, self._in_flight.most) != (first, most):
            shared = self.epoch_state  # kept across epochs: the level found carries over, in workers too
            found = shared.level(worker) if shared is not None else 0
            self._in_flight = InFlight(
                first,
                most,
                most_held=self.pieces_ahead_most(threads),
                start=found or self.in_flight_start(threads),
                on_change=partial(shared.remember_level, worker) if shared is not None else None,
            )
        if self.windows is not None:
            return self._iter_windows(spec, plan, view, logical, worker, worker_skip, threads, info)
        reader = self._reader(
            self.chunk_rows,
            threads,
            cache=self._kept if self.keep_in_memory else None,
            early=self._early,
            first=None if worker_skip else plan.workers[logical].pieces + self.row_offset,
        )
        if reads_early(self.arrays, cache=self.keep_in_memory, lives_on=info is None or cfg.persistent_workers):
            reader.after_last = lambda submit: self._read_next_epoch_early(submit, reader, view, worker, n_workers)
        rng = buffer_rng(spec.seed, view.epoch, view.rank, logical, spec.row_shuffle, plan.segment)  # None: in order
        writer = self._writer(worker, info)
        batch_columns = {**INDEX_ONLY, **self.out_columns}
        out = writer.out if writer is not None else self._pools.batches(spec.batch_size, batch_columns)
        decoder = None
        if self.packings:  # packed columns gathered as stored, decoded into the batch
            decoder = BatchDecoder(self.packings, out, self._pools.batches(spec.batch_size, self._packed_columns()))
            out = decoder.out
        batches = stream_batches(
            reader,
            plan.workers[logical],
            self.columns,
            row_offset=self.row_offset,
            buffer_rows=spec.buffer_rows,
            warmup_rows=self.chunk_rows,
            rng=rng,
            skip=worker_skip,
            copy_direct=self.keep_in_memory,
            out=out,
            pools=self._pools,
        )
        if decoder is not None:
            batches = (decoder.decoded(batch) for batch in batches)
        if self.return_padding:
            padding = plan.padding + self.row_offset
            batches = (self._with_padding(batch, padding, writer) for batch in batches)
        return self._delivered(batches, writer)

    def _arrays_of_this_process(self) -> Arrays:
        """The arrays, reopened first in a process other than the one that opened them (a worker, a rank forked from
        a notebook, or a fork of one): its own connections and buffers, as a parent's session does not work there."""
        if self._arrays_pid != os.getpid():
            self.arrays, self._arrays_pid, self._pools = for_this_process(self.arrays), os.getpid(), Pools()
            self._in_flight = None
        return self.arrays

    def _reader(self, chunk_rows: int, threads: int, **options) -> PieceReader:
        """This process's chunk reader for one epoch (its requests in flight, retries, checks and pools)."""
        return PieceReader(
            self.arrays,
            chunk_rows,
            threads=threads,
            in_flight=self._in_flight,
            policy=self.read.retry,
            check_missing=self.read.missing_chunks == "error",
            pools=self._pools,
            secrets=self._secrets,
            pieces_per_read=self.pieces_per_read(),
            **options,
        )

    def _writer(self, worker: int, info):
        """The ring's writer for this worker's batches, or ``None`` (no ring, or the main process reads)."""
        return self.ring.writer(worker) if self.ring is not None and info is not None else None

    def _delivered(self, batches, writer):
        """Batches as the DataLoader passes them on: where a shared slot holds one, only where it is
        (:mod:`zarrtorch._workers.ring`); otherwise as tensors."""
        if writer is not None:
            return (writer.send(batch, self._to_torch) for batch in batches)
        return (self._to_torch(batch) for batch in batches)

    def _iter_windows(self, spec, plan, view, logical, worker, skip, threads, info):
        """:meth:`__iter__` with ``windows``: the buffer runs on window ids, the rows are read in chunks
        (:mod:`zarrtorch.window_stream`)."""
        share = plan.workers[logical]
        rng = buffer_rng(spec.seed, view.epoch, view.rank, logical, spec.row_shuffle, plan.segment)
        batches = worker_window_batches(share, buffer_rows=spec.buffer_rows, warmup_rows=spec.chunk_rows, rng=rng)
        offsets = self.windows.offsets
        most_held = self._window_chunks_for_batches()
        reads = chunk_reads(
            batches, share.pieces, self.starts, offsets, self.store_chunk_rows, skip=skip, most_held=most_held
        )
        self.last_chunk_reads = reads  # this process's chunk reads for the epoch: lesson 08 counts its decodes
        reader = self._reader(self.store_chunk_rows, threads)
        writer = self._writer(worker, info)
        columns = {**INDEX_ONLY, **self.out_columns}
        if self.return_padding:
            columns["padding"] = ((), np.dtype(bool))
        batches_out = stream_windows(
            reader,
            batches,
            reads,
            self.starts,
            offsets=offsets,
            history=self.windows.history,
            inputs=self.inputs,
            targets=self.targets,
            static=self.static,
            out_columns=columns,
            rows=self._store_rows,
            skip=skip,
            padding=plan.padding if self.return_padding else None,
            packings={c: self.packings[n] for c, n in self._packed_out_columns().items()},
            scratch=self._pools.batches(spec.batch_size, self._packed_columns()) if self.packings else None,
            out=writer.out if writer is not None else self._pools.batches(spec.batch_size, columns),
            held_slots=most_held,
            held_arrays=self._pools.held,
        )
        return self._delivered(batches_out, writer)

    @staticmethod
    def _with_padding(batch: dict[str, np.ndarray], padding: np.ndarray, writer) -> dict[str, np.ndarray]:
        """The batch with ``"padding"``: which of its rows this rank reads only to even out the ranks (a row
        is never both padding and data on one rank, :attr:`zarrtorch.plan.RankPlan.padding`)."""
        mask = np.isin(batch["index"], padding) if len(padding) else np.zeros(len(batch["index"]), bool)
        if writer is not None and writer.in_slot:
            writer.last_arrays["padding"][...] = mask
        batch["padding"] = mask
        return batch

    def _read_next_epoch_early(self, submit, reader: PieceReader, view: EpochView, worker: int, n_workers: int):
        """Start the next epoch's first reads in ``reader``'s threads as this one ends
        (:mod:`zarrtorch._read.early`)."""
        topology = Topology(view.rank, view.world_size, n_workers)
        following = self._require_config().spec.plan(view.epoch + 1, topology)
        pieces = following.workers[worker].pieces + self.row_offset
        self._early = EarlyReads(submit, reader.read_piece, pieces, reader.prefetch)
        return self._early

    def _to_torch(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        batch = stack_columns(batch, self.stack)
        out = {name: torch.from_numpy(arr) for name, arr in batch.items() if name != "index" or self.return_index}
        if self.transform is None or (self.config is not None and self.config.transform_in_consumer):
            return out
        return self.transform(out)


def _short_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()
