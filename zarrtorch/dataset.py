"""``ZarrIterableDataset``: what a loader streams, described once and never changed.

A dataset opens the store, checks its layout and settings, and says what every epoch's batches are made of:
the arrays and their columns, the rows (or window starts), the shuffle and seed, and what fixes the plan for a
given batch size (:meth:`ZarrIterableDataset.spec`). It knows nothing of a loader: a
:class:`~zarrtorch.ZarrDataLoader` builds the epochs' job from it (:mod:`zarrtorch.job`) and its processes run
them (:mod:`zarrtorch.epoch`), and nothing writes into the dataset after construction, so two loaders on one
dataset are independent. Iterated outside a ``ZarrDataLoader`` (a plain ``torch.utils.data.DataLoader``), it
refuses with the fix: nothing there says the batch size, the epoch or the rank every process must agree on.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from functools import cached_property

import numpy as np
import zarr
from torch.utils.data import IterableDataset

from zarrtorch._read.cache import WRITE_ID, check_limit_holds_a_chunk, reads_through_cache, through_cache
from zarrtorch._read.chunks import FINGERPRINT_BYTES, first_bytes
from zarrtorch._read.columns import check_stack, check_tensor_dtypes, packing, packings
from zarrtorch._read.fetch import with_retries, within
from zarrtorch._read.listing import check_listed, written_whole
from zarrtorch._read.reader import ChunkReadError
from zarrtorch._read.source import (
    Arrays,
    all_local,
    for_this_process,
    is_local,
    open_arrays,
    open_source,
    redact,
    secrets_of,
    store_label,
)
from zarrtorch._read.static import check_static, static_array
from zarrtorch._util.arguments import INT64_LIMIT, flag, names, whole_number
from zarrtorch._util.arguments import row_range as checked_row_range
from zarrtorch._util.background import BackgroundCall
from zarrtorch._util.sizes import native, row_bytes
from zarrtorch.layout import FirstAxisLayout, check_first_axis_layout, check_missing_chunks_can_be_told, restrict_rows
from zarrtorch.options import ReadOptions
from zarrtorch.plan import EpochSpec, RankPlan, Topology
from zarrtorch.resume import batches_of, resumed_plan
from zarrtorch.windows import Windows, WindowStarts, no_windows_message

THROUGH_THE_LOADER = (
    "iterate a ZarrIterableDataset through zarrtorch.ZarrDataLoader(dataset, batch_size=...), not a plain "
    "torch DataLoader: the loader decides the batch size, epoch and rank split that every worker must agree on "
    "(a plain DataLoader would have each worker read every row, and ranks unequal batches)"
)

INDEX = "index"  # a batch's row numbers (or window start rows)
PADDING = "padding"  # a batch's flags of the rows repeated only to even out the ranks


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
            changes). Memory, not disk: nothing is written. The store may be removed once its rows are kept; one
            that ``prepare_zarr`` wrote again is refused at the next epoch, as without this option.
        redeal_every: ``K``: deal each rank its share of the chunks every ``K`` epochs instead of every epoch (the
            order within a share still changes every epoch), so that a node's chunk cache (``ReadOptions(
            cache_dir=...)``) holds what the node reads next (:func:`zarrtorch.plan.placed_stream`). Trades the
            reshuffle across ranks for bytes: a rank sees the same chunks for ``K`` epochs. ``None``: every epoch.
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
        redeal_every: int | None = None,
        read: ReadOptions | None = None,
        windows: Windows | None = None,
        **settings,
    ):
        if settings:
            raise TypeError(f"ZarrIterableDataset got unexpected keyword argument(s) {sorted(settings)}")
        if read is not None and not isinstance(read, ReadOptions):
            raise TypeError(f"read must be a zarrtorch.ReadOptions(...), got {type(read).__name__}: {read!r}")
        read = read or ReadOptions()
        variables = names(variables, "variables")
        keep_in_memory = flag(keep_in_memory, "keep_in_memory")
        shuffle, return_index = flag(shuffle, "shuffle"), flag(return_index, "return_index")
        redeal_every = _redeal_every(redeal_every, shuffle, keep_in_memory)
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
        self.opened_in = os.getpid()  # another process reopens remote arrays (zarrtorch._read.source.for_this_process)
        self.static: dict[str, np.ndarray] = {}  # windows: the arrays without a time axis, read once
        self._static_fingerprints: dict[str, str] = {}  # a hash of each one's values as stored
        if windows is not None and windows.static:
            self.static = self._static_arrays(source, windows.static, read)
        check_tensor_dtypes({**self.arrays, **self.static}, chosen=variables is not None)
        self.layout = check_first_axis_layout(self.arrays)
        check_missing_chunks_can_be_told(self.arrays, read.missing_chunks)
        self.packings = packings(self.arrays, read.decode_cf, read.cf_dtype)
        self.stack = check_stack(stack, self.decoded_columns)
        self.row_offset = 0  # rows: the row window's first row; windows: the period's first row
        self.starts: WindowStarts | None = None
        self.store_chunk_rows = self.layout.chunk_rows
        self.store_rows = self.layout.rows
        if windows is not None:
            self._use_windows(windows, row_range, stack, keep_in_memory)
        elif row_range is not None:
            self.row_offset, self.layout = restrict_rows(self.layout, row_range)
        if read.missing_chunks == "error":  # listed, but arrays whose store says it holds every chunk
            whole = written_whole(source, self.arrays)
            check_listed(
                self.arrays, self.store_row_spans(), skip=whole, policy=read.retry, secrets=self.arrays.secrets
            )
        self.arrays = self._through_cache(read, source)
        self._watched_group = _group_to_watch(source, self.arrays)
        self.shuffle, self.seed, self.buffer_chunks = shuffle, seed, buffer_chunks
        self.keep_in_memory, self.return_index, self.return_padding = keep_in_memory, return_index, return_padding
        self.redeal_every = redeal_every
        self._check_batch_keys()
        self.transform = transform

    def _through_cache(self, read: ReadOptions, source) -> Arrays:
        """The arrays, each remote one reading its chunks through the node's chunk cache where the options ask
        for one (:mod:`zarrtorch._read.cache`); a local store is read as it is. Its store id holds the group's
        attributes (``prepare_zarr``'s write id) and the first bytes of its first chunk (one range request per
        array, here)."""
        cache = read.chunk_cache()
        if cache is None:
            return self.arrays
        attrs = source.attrs.asdict() if isinstance(source, zarr.Group) else {}
        cached = {}
        for n, a in self.arrays.items():
            if is_local(a):
                cached[n] = a
                continue
            head = first_bytes(a, FINGERPRINT_BYTES, read.retry)
            check_limit_holds_a_chunk(cache, n, head)
            cached[n] = through_cache(a, cache, head, attrs)
        return Arrays(cached, self.arrays.secrets)

    def check_store_unchanged(self) -> BackgroundCall | None:
        """Refuse an epoch of a store rewritten since this dataset opened it: the plan is of the old store, the
        first pieces of an epoch are read early, as the epoch before ends (from the old store), and the node's chunk
        cache, when the store reads through one, holds the old store's chunks. Told by the group's attributes
        (``prepare_zarr`` writes a new write id at every write): one metadata read per epoch, no chunk's. A store
        written by other means with the same attributes cannot be told without reading its chunks.

        The first epoch is checked too: the dataset reads the chunk files with the shape and dtype it opened, so a
        store written again before it with fewer rows or another dtype would yield rows it does not hold, or its
        bytes as the old dtype. Where every array is local (a metadata read that cannot stall) or reads through a
        cache (whose chunks, and the next epoch's early reads, are the old store's), before the epoch. Every epoch
        of a remote store read without a cache is checked beside its first chunk reads, which read nothing early
        and keep nothing: the returned call is taken before the epoch's first batch is handed out (the iterator's
        job), so no batch of a rewritten store is handed out, an epoch does not wait a round trip for the check
        before its first requests, and a server that does not answer fails at the epoch's first chunk, after that
        chunk's attempts alone (lesson 07). A store that does not answer is a :class:`ChunkReadError`, as it is for
        the epoch's chunks."""
        if self._watched_group is None:
            return None
        arrays = self.arrays if os.getpid() == self.opened_in else for_this_process(self.arrays)
        cached = [a for a in arrays.values() if reads_through_cache(a)]
        array = (cached or list(arrays.values()))[0]
        if not cached and not all_local(arrays):
            return BackgroundCall(lambda: self._refuse_if_rewritten(array, cached=False), "zarrtorch-store-check")
        self._refuse_if_rewritten(array, cached=bool(cached))
        return None

    def _refuse_if_rewritten(self, array, cached: bool) -> None:
        """Read the watched group's attributes now; a :class:`ValueError` if they are not those it was opened with."""
        path, opened_with, zarr_format = self._watched_group
        try:
            now = group_attributes(array.store_path.store, path, self.read.retry, zarr_format)
        except (OSError, RuntimeError, ValueError) as exc:
            # TimeoutError is an OSError; RetriesExhausted a RuntimeError; a document that does not parse (cut short
            # on the way, twice) a ValueError, which must not pass for the rewrite this check raises
            if self.keep_in_memory:  # the rows kept are the data: the store may be gone; a row still to be read
                return  # from it fails on its own, naming its chunk
            raise ChunkReadError(
                f"cannot read the attributes of the group of {store_label(array, self.arrays.secrets)} at the start "
                f"of an epoch (read to tell whether the store was rewritten since this dataset opened it): "
                f"{redact(f'{type(exc).__name__}: {exc}', self.arrays.secrets)}"
            ) from exc
        if now != opened_with:
            held = "the node's chunk cache holds the old store's chunks, " if cached else ""
            raise ValueError(
                f"the store {store_label(array, self.arrays.secrets)} was rewritten since this dataset opened it "
                f"(its group's attributes, prepare_zarr's write id among them, changed): {held}this dataset's plan, "
                "shapes and dtypes are of the old store, and an epoch's first pieces may have been read from it. Make "
                "a new ZarrIterableDataset (and loader) to read it"
            )

    def _check_batch_keys(self) -> None:
        """Refuse arrays whose batch key another one takes: an array named ``index`` or ``padding`` (the loader's
        own keys), or ``x_target`` beside ``x``'s targets: one would replace the other's data in every batch."""
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
        windows.check_rows(self.layout.rows)
        self.starts = WindowStarts.of(windows, self.layout.rows, row_range)
        self.row_offset = 0 if row_range is None else int(row_range[0])  # in the plan: periods differ
        if self.starts.n == 0:
            raise ValueError(no_windows_message(windows, self.layout.rows, row_range))
        self.layout = FirstAxisLayout(
            rows=self.starts.n,
            chunk_rows=windows.block_rows(self.store_chunk_rows, self.starts.n),
            sharded=self.layout.sharded,
        )

    def __repr__(self) -> str:
        stores = sorted({store_label(a, self.arrays.secrets) for a in self.arrays.values()})
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

    @property
    def batch_columns(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Row shape and dtype of every column of a batch as its process gathers it: the row numbers, the arrays
        (:attr:`out_columns`) and, with ``return_padding``, the padding flags."""
        columns = {INDEX: ((), np.dtype(np.int64)), **self.out_columns}
        if self.return_padding:
            columns[PADDING] = ((), np.dtype(bool))
        return columns

    @property
    def packed_columns(self) -> dict[str, str]:
        """Each batch column holding a CF-packed array: ``{column: array}`` (with ``windows``, ``name`` for the
        inputs and ``name_target`` for the targets)."""
        if self.windows is None:
            return {n: n for n in self.packings}
        columns = {n: n for n in self.inputs if n in self.packings}
        columns.update({n + "_target": n for n in self.targets if n in self.packings})
        return columns

    @property
    def batch_row_bytes(self) -> int:
        """Bytes of one row of every array in a batch (decoded CF-packed arrays are wider than stored)."""
        return sum(int(np.prod(shape, dtype=np.int64)) * dt.itemsize for shape, dt in self.out_columns.values())

    def store_row_spans(self) -> list[tuple[int, int]]:
        """The store rows this dataset reads, as ``[start, stop)`` spans: its rows, or with ``windows`` the rows of
        each step of the windows (not the gaps between segments, nor rows a stride steps over by whole chunks)."""
        if self.starts is None:
            return [(self.row_offset, self.row_offset + self.rows)]
        runs = zip(self.starts.first.tolist(), self.starts.counts.tolist(), strict=True)
        return [(a + o, a + n + o) for a, n in runs for o in self.windows.offsets.tolist()]

    def index_of(self, ids: np.ndarray) -> np.ndarray:
        """The store rows plan ids name: rows (the row window's first row added), or the windows' start rows."""
        return self.starts.start(ids) if self.starts is not None else ids + self.row_offset

    def worker_memory_bytes(self, decode_threads: int = 1, batch_size: int = 1) -> int:
        """Decoded data one reading process of a loader holds at most, decoding in ``decode_threads`` threads,
        batches of ``batch_size`` (:func:`zarrtorch.budget.reader_bytes`)."""
        from zarrtorch.budget import reader_bytes
        from zarrtorch.readplan import ReadPlan

        return reader_bytes(self, ReadPlan.of(self, 0, decode_threads=decode_threads), int(batch_size))

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
            redeal_every=self.redeal_every,
            row_offset=self.row_offset,
            windows=self.windows.describe() if self.windows is not None else "",
        )

    @cached_property
    def _fingerprints(self) -> dict[str, str]:
        # read through this process's own connections: a rank forked from the process that opened a URL cannot use
        # the parent's session
        arrays = self.arrays if os.getpid() == self.opened_in else for_this_process(self.arrays)
        found = {}
        for name, arr in sorted(arrays.items()):
            head = first_bytes(arr, FINGERPRINT_BYTES, None if is_local(arr) else self.read.retry)
            found[name] = _short_hash(head if head is not None else b"missing")
        found.update(sorted(self._static_fingerprints.items()))
        return found

    def data_fingerprints(self) -> dict[str, str]:
        """A short hash per array of the first bytes of its first chunk as stored (a static array: of its whole
        value as stored), read once per process: what checkpoints hold and the ranks' agreement check compares
        besides the plan, so that a state of one store is not resumed on another of the same shape, nor ranks opened
        on different stores train on both. Identical copies at other paths agree. Only the first chunk: a cheap
        check, not a proof."""
        return dict(self._fingerprints)

    def data_fingerprint(self) -> str:
        """:meth:`data_fingerprints` in one short hash."""
        return _short_hash(repr(sorted(self.data_fingerprints().items())).encode())

    def plan(
        self,
        *,
        epoch: int,
        batch_size: int,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        history: tuple = (),
    ) -> RankPlan:
        """The plan of ``epoch`` for ``rank`` of ``world_size`` in a loader of ``batch_size``, ``drop_last`` and
        ``num_workers``; ``history`` (the epoch's earlier segments on other topologies, see
        :mod:`zarrtorch.resume`) gives the plan of what is left of an interrupted epoch."""
        spec = self.spec(batch_size, drop_last)
        return resumed_plan(spec, int(epoch), tuple(history), Topology(int(rank), int(world_size), int(num_workers)))

    def batch_row_ids(
        self,
        *,
        epoch: int,
        batch_size: int,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        history: tuple = (),
    ) -> list[np.ndarray]:
        """The store rows (or window start rows) of every batch a loader of these settings yields on ``rank``, in
        order, computed without reading data (the schedule its workers run). Settings as for :meth:`plan`."""
        spec = self.spec(batch_size, drop_last)
        plan = resumed_plan(spec, int(epoch), tuple(history), Topology(int(rank), int(world_size), int(num_workers)))
        return [self.index_of(b) for b in batches_of(spec, plan)]

    # -- not a loader ------------------------------------------------------------------------------------
    def __iter__(self):
        raise TypeError(THROUGH_THE_LOADER)

    def __len__(self) -> int:
        raise TypeError(THROUGH_THE_LOADER)


def _group_to_watch(source, arrays: Arrays) -> tuple[str, dict, int] | None:
    """The path, attributes and Zarr format of the group ``source``, to tell at each epoch whether the store was
    rewritten since (:meth:`ZarrIterableDataset.check_store_unchanged`): when its arrays read through a chunk cache
    (their store id holds the attributes), or ``prepare_zarr`` wrote it (its attributes hold a write id, new at
    every write); else ``None``. With ``keep_in_memory`` too: the rows kept are read from the store in the epochs
    that first reach them, the first among them."""
    if not isinstance(source, zarr.Group):
        return None
    attrs = source.attrs.asdict()
    written = isinstance(attrs.get("zarrtorch"), dict) and WRITE_ID in attrs["zarrtorch"]
    if not written and not any(reads_through_cache(a) for a in arrays.values()):
        return None
    return source.path, attrs, source.metadata.zarr_format


def group_attributes(store, path: str, policy, zarr_format: int | None = None) -> dict:
    """The attributes of the group at ``path`` of ``store``, read from the store now (with the deadline and
    retries of ``policy``). ``zarr_format``: the group's, known when it was opened: one request for a group of
    format 3 (``zarr.json``), where a group of unknown format is looked for in four documents at once."""

    async def read() -> dict:
        group = await zarr.api.asynchronous.open_group(store=store, path=path, mode="r", zarr_format=zarr_format)
        return dict(group.attrs)

    try:
        return with_retries(lambda: within(read(), policy.timeout_s), policy)
    except ValueError:  # a document that does not parse: cut short on the way, as a chunk's body can be; once more
        return with_retries(lambda: within(read(), policy.timeout_s), policy)


def _redeal_every(value, shuffle: bool, keep_in_memory: bool) -> int:
    """``redeal_every`` as the plan's number (0: every epoch), refused by name where it cannot apply."""
    if value is None:
        return 0
    epochs = whole_number(value, "redeal_every (epochs a rank keeps its share of the chunks)", least=1)
    if not shuffle:
        raise ValueError("redeal_every applies to a shuffled dataset: without shuffle every rank keeps its share")
    if keep_in_memory:
        raise ValueError("keep_in_memory=True keeps every rank's share for good: leave redeal_every out")
    return epochs


def _short_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()
