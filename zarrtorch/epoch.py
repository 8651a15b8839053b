"""One epoch in one process: the plan, the reads, the buffer, then the same stages for rows and windows.

:func:`run_epoch` is the one function every reading process runs (a DataLoader worker, or the training process
with ``num_workers=0``): it reads the epoch the loader published, computes this process's share of the plan, and
chains the stages a batch crosses on its way from the store to the rank:

1. **gather**: the share's pieces are read ahead in threads (:class:`~zarrtorch._read.reader.PieceReader`) and
   the rows reach a batch through the bounded shuffle buffer (:func:`zarrtorch.stream.stream_batches`), or, with
   windows, each window's steps are gathered from the chunks held for them
   (:func:`zarrtorch.window_stream.stream_windows`); CF-packed columns are gathered as stored;
2. **decode**: CF-packed columns decoded into the batch (:class:`~zarrtorch._read.columns.BatchDecoder`);
3. **padding**: the flags of the rows repeated only to even out the ranks (``return_padding``);
4. **deliver**: a batch written into a shared slot is sent as a reference to it, any other as tensors (stacked
   columns, the row numbers dropped unless asked for, the dataset's transform).

With ``batch_order="rank"`` and workers the stages are split: a worker's epoch is only its turn of the pieces
the rank's one stream reads (:mod:`zarrtorch._workers.dealt`), and the training process runs the same four stages
on the pieces it receives (:func:`assemble_epoch`).

What a process keeps from one epoch to the next lives in its :class:`ProcessState`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from zarrtorch._read.columns import BatchDecoder, stack_columns
from zarrtorch._read.early import EarlyReads, reads_early
from zarrtorch._read.inflight import InFlight
from zarrtorch._read.reader import PieceReader
from zarrtorch._read.source import for_this_process
from zarrtorch._util.pool import Pools
from zarrtorch._workers.dealt import DealtPieces, dealt, ended, items, pieces_of, sent
from zarrtorch._workers.shared import EpochView, epoch_view
from zarrtorch.buffer import buffer_rng
from zarrtorch.dataset import INDEX, PADDING
from zarrtorch.plan import RankPlan, Topology, resume_roles
from zarrtorch.resume import resumed_plan
from zarrtorch.stream import RowGather, pieces_read, stream_batches
from zarrtorch.window_stream import (
    ChunkReads,
    WindowGather,
    chunk_reads,
    read_pieces,
    stream_windows,
    window_chunks_for_batches,
    worker_window_batches,
)

Batch = dict[str, np.ndarray]


class ProcessState:
    """What one process of a loader keeps across its epochs: the arrays opened in this process (its own
    connections), its pooled buffers, its requests in flight (the level found carries over), the next epoch's first
    reads started as the last one ended, and, with ``keep_in_memory``, the rows it read."""

    def __init__(self, job):
        self.pid = os.getpid()
        data = job.data
        self.arrays = data.arrays if self.pid == data.opened_in else for_this_process(data.arrays)
        self.pools = Pools()
        self.in_flight: InFlight | None = None
        self.early: EarlyReads | None = None
        self.kept: dict | None = None  # keep_in_memory: the pieces read, by row range
        self.kept_for: int | None = None  # the (logical) worker whose share they are

    def requests_in_flight(self, job, worker: int) -> InFlight:
        """This process's requests in flight, made once: the level the last epoch's worker of the same number
        found, when the loader kept one (non-persistent workers are new processes every epoch)."""
        if self.in_flight is None:
            plan, shared = job.read_plan, job.epochs
            found = shared.level(worker)
            self.in_flight = InFlight(
                plan.first_in_flight,
                plan.most_in_flight,
                most_held=plan.pieces_ahead,
                start=found or plan.start_in_flight,
                on_change=partial(shared.remember_level, worker),
            )
        return self.in_flight

    def kept_rows(self, logical: int) -> dict:
        """The rows kept in memory for worker share ``logical`` (a share of another worker: none reusable)."""
        if self.kept is None or self.kept_for != logical:
            self.kept, self.kept_for = {}, logical
        return self.kept


def run_epoch(job, local: ProcessState, info) -> Iterator[dict[str, torch.Tensor]]:
    """The batches of this process's share of the epoch the loader published (``info``: DataLoader's worker info,
    ``None`` in the training process)."""
    worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 0)
    if n_workers != job.num_workers:
        raise RuntimeError(f"the loader was configured for {job.num_workers} workers but runs {n_workers}")
    view = epoch_view(job.epochs)
    if job.deals_pieces:
        return _dealt_reads(_rank_share(job, local, view), worker, n_workers)
    plan = resumed_plan(job.spec, view.epoch, view.history, Topology(view.rank, view.world_size, n_workers))
    logical, skip = resume_roles([len(w.batch_sizes) for w in plan.workers], view.skip)[worker]
    share = Share(job, local, plan, view, worker, logical, skip, lives_on=info is None or job.persistent)
    writer = job.ring.writer(worker) if job.ring is not None and info is not None else None
    return _batches(share, writer)


def assemble_epoch(job, local: ProcessState, received: Iterator[dict]) -> Iterator[dict[str, torch.Tensor]]:
    """The rank's batches with ``batch_order="rank"`` and workers, formed in the training process from the pieces
    its workers read (``received``: DataLoader's iterator over them, :mod:`zarrtorch._workers.dealt`), by the
    same stages as with no worker: the batches are the plan's single worker's, whatever the workers."""
    received = pieces_of(received)
    share = dataclasses.replace(_rank_share(job, local, epoch_view(job.epochs)), received=received)
    yield from _batches(share, None)
    ended(received)


def _rank_share(job, local: ProcessState, view: EpochView) -> Share:
    """The rank's one stream of the published epoch (``batch_order="rank"``): the plan's single worker, from the
    resume point."""
    plan = resumed_plan(job.spec, view.epoch, view.history, Topology(view.rank, view.world_size, 0))
    return Share(job, local, plan, view, worker=0, logical=0, skip=view.skip, lives_on=False)


def _dealt_reads(epoch: Share, worker: int, workers: int) -> Iterator[dict[str, torch.Tensor]]:
    """What DataLoader worker ``worker`` of ``workers`` sends with ``batch_order="rank"``: its turn of the pieces
    the rank's stream reads (:func:`zarrtorch._workers.dealt.dealt`), decoded and sent a group per item."""
    job, local = epoch.job, epoch.local
    mine = _dealt_pieces(epoch, worker, workers)
    early, local.early = local.early, None  # taken by this epoch's reader where they match, else dropped
    reader = _reader(job, local, worker, early=early, first=mine)
    if reads_early(local.arrays, cache=False, lives_on=job.persistent):
        # the reader is passed when called, not held: a reader holding itself would outlive its loader
        reader.after_last = partial(_read_next_dealt_early, epoch, worker, workers)
    writer = job.ring.writer(worker) if job.ring is not None else None
    return items(sent(piece, data, writer) for piece, data in zip(mine, reader.iter_pieces(mine), strict=True))


def _dealt_pieces(epoch: Share, worker: int, workers: int) -> np.ndarray:
    """DataLoader worker ``worker``'s turn of the pieces the rank's stream reads in ``epoch``."""
    pieces = _window_pieces(epoch) if epoch.job.data.windows is not None else _row_pieces(epoch)
    return dealt(pieces, worker, workers)


def _read_next_dealt_early(epoch: Share, worker: int, workers: int, reader: PieceReader, submit) -> EarlyReads:
    """Start worker ``worker``'s first reads of the next epoch as this one ends, as a worker of the default order
    does (:func:`_read_next_epoch_early`): its turn of the pieces of the next epoch started afresh on the same
    ranks. Only a guess: the next epoch takes the reads that match its pieces and drops the others."""
    view = epoch.view
    following = _rank_share(epoch.job, epoch.local, EpochView(view.epoch + 1, 0, view.rank, view.world_size))
    pieces, read = reader.early_reads(_dealt_pieces(following, worker, workers))
    epoch.local.early = EarlyReads(submit, read, pieces, reader.prefetch)
    return epoch.local.early


def _batches(share: Share, writer) -> Iterator:
    """The batches of ``share``, through every stage from the gather to the delivery (``writer``: its ring
    slots' writer, or ``None``)."""
    job, local, plan = share.job, share.local, share.plan
    dest = Destination(_batch_memory(job, local, writer))
    out, decoder = dest, None
    if job.data.packings:  # packed columns gathered as stored, decoded into the batch
        scratch = local.pools.batches(job.spec.batch_size, gathered_packed_columns(job.data))
        decoder = BatchDecoder(packings_by_column(job.data), dest, scratch)
        out = decoder.out
    gather = _gather_windows if job.data.windows is not None else _gather_rows
    batches = gather(share, out)
    if decoder is not None:
        batches = (decoder.decoded(batch) for batch in batches)
    if job.data.return_padding:
        padding = job.data.index_of(plan.padding)
        batches = (with_padding(batch, padding, dest.last) for batch in batches)
    return _delivered(job, batches, writer)


class Destination:
    """Where each batch is gathered: the arrays ``out(rows)`` gives (a shared slot, pooled arrays; ``None``: fresh
    arrays), the last of them remembered for the stages after the gather."""

    def __init__(self, out: Callable[[int], Batch | None]):
        self._out = out
        self.last: Batch | None = None

    def __call__(self, rows: int) -> Batch | None:
        self.last = self._out(rows)
        return self.last


def _batch_memory(job, local: ProcessState, writer) -> Callable[[int], Batch]:
    """``out(rows)``: where each batch is gathered. A worker's shared slot; with ``pin_memory=True``, no workers and
    CUDA, a page-locked slot (:mod:`zarrtorch._workers.pinned`), or the pooled arrays while the consumer holds every
    slot (the loader never waits for a slot); else the process's pooled arrays."""
    if writer is not None:
        return writer.out
    pooled = local.pools.batches(job.spec.batch_size, job.data.batch_columns)
    if job.pinned is None:
        return pooled
    pinned = job.pinned.out

    def out(rows: int) -> Batch:
        slot = pinned(rows)
        return slot if slot is not None else pooled(rows)

    return out


def _reader(job, local: ProcessState, worker: int, **options) -> PieceReader:
    """This process's chunk reader for one epoch: its requests in flight, retries, checks and pools."""
    data, plan = job.data, job.read_plan
    return PieceReader(
        local.arrays,
        data.store_chunk_rows,
        threads=plan.decode_threads,
        in_flight=local.requests_in_flight(job, worker),
        policy=data.read.retry,
        check_missing=data.read.missing_chunks == "error",
        pools=local.pools,
        secrets=data.arrays.secrets,
        pieces_per_read=plan.pieces_per_read,
        **options,
    )


@dataclass(frozen=True)
class Share:
    """This process's share of one epoch: the loader's ``job``, the process's ``local`` state, the rank's ``plan``
    and the published ``view``; this is DataLoader worker ``worker`` running the plan's worker ``logical`` (they
    differ in a resumed epoch), from its batch ``skip``; ``lives_on``: the process goes on into the next epoch;
    ``received``: the pieces to gather from, when the workers read them (``batch_order="rank"``)."""

    job: object
    local: ProcessState
    plan: RankPlan
    view: EpochView
    worker: int
    logical: int
    skip: int
    lives_on: bool
    received: Iterator[dict] | None = None  # batch_order="rank": the pieces the workers read, in order

    def buffer_rng(self):
        """The shuffle buffer's draws for this share (``None``: rows in stream order)."""
        spec, view = self.job.spec, self.view
        return buffer_rng(spec.seed, view.epoch, view.rank, self.logical, spec.row_shuffle, self.plan.segment)


def _gather_rows(epoch: Share, out) -> Iterator[Batch]:
    """Rows through the shuffle buffer (:func:`zarrtorch.stream.stream_batches`)."""
    job, local, worker, logical, skip = epoch.job, epoch.local, epoch.worker, epoch.logical, epoch.skip
    data = job.data
    share = epoch.plan.workers[logical]
    if epoch.received is not None:
        reader = _dealt_reader(epoch)
    else:
        reader = _reader(
            job,
            local,
            worker,
            cache=local.kept_rows(logical) if data.keep_in_memory else None,
            early=local.early,
            first=None if skip else share.pieces + data.row_offset,
        )
    if epoch.received is None and reads_early(local.arrays, cache=data.keep_in_memory, lives_on=epoch.lives_on):
        # the reader is passed when called, not held: a reader holding itself would outlive its loader
        reader.after_last = partial(_read_next_epoch_early, job, local, epoch.view, worker)
    return stream_batches(reader, share, _row_gather(job), epoch.buffer_rng(), skip=skip, out=out, pools=local.pools)


def _row_gather(job) -> RowGather:
    """How the loader's rows reach its batches (:class:`~zarrtorch.stream.RowGather`)."""
    data = job.data
    return RowGather(
        columns=data.columns,
        row_offset=data.row_offset,
        buffer_rows=job.spec.buffer_rows,
        warmup_rows=data.chunk_rows,
        copy_direct=data.keep_in_memory,
    )


def _row_pieces(epoch: Share) -> np.ndarray:
    """The pieces (store rows) the rows of ``epoch`` are gathered from, in order
    (:func:`~zarrtorch.stream.pieces_read`)."""
    share = epoch.plan.workers[epoch.logical]
    return pieces_read(share, _row_gather(epoch.job), epoch.buffer_rng(), skip=epoch.skip)


def _dealt_reader(epoch: Share) -> DealtPieces:
    """The training process's stand-in reader over the pieces its workers send (``batch_order="rank"``)."""
    local = epoch.local
    rows_reader = partial(_reader, epoch.job, local, 0)
    return DealtPieces(epoch.received, local.arrays, epoch.job.data.store_chunk_rows, rows_reader, epoch.job.ring)


def _gather_windows(epoch: Share, out) -> Iterator[Batch]:
    """Windows gathered from the chunks held for them (:mod:`zarrtorch.window_stream`): the buffer runs on
    window ids, each chunk is read once for all the windows of a block that use it."""
    job, local, worker, skip = epoch.job, epoch.local, epoch.worker, epoch.skip
    data = job.data
    batches, reads, most_held = _window_reads(epoch)
    offsets = data.windows.offsets
    gather = WindowGather(
        starts=data.starts,
        offsets=offsets,
        history=data.windows.history,
        inputs=data.inputs,
        targets=data.targets,
        static=data.static,
        columns=gathered_columns(data),
        rows=data.store_rows,
    )
    reader = _dealt_reader(epoch) if epoch.received is not None else _reader(job, local, worker)
    return stream_windows(
        reader, batches, reads, gather, skip=skip, out=out, held_slots=most_held, held_arrays=local.pools.held
    )


def _window_reads(epoch: Share) -> tuple[list[np.ndarray], ChunkReads, int]:
    """The window ids of every batch of ``epoch``'s share, the chunk reads behind them from its batch ``skip``,
    and the most chunks held at once (:func:`zarrtorch.window_stream.chunk_reads`)."""
    data, spec = epoch.job.data, epoch.job.spec
    share = epoch.plan.workers[epoch.logical]
    rng = epoch.buffer_rng()
    batches = worker_window_batches(share, buffer_rows=spec.buffer_rows, warmup_rows=spec.chunk_rows, rng=rng)
    most_held = window_chunks_for_batches(data, spec.batch_size)
    reads = chunk_reads(
        batches,
        share.pieces,
        data.starts,
        data.windows.offsets,
        data.store_chunk_rows,
        skip=epoch.skip,
        most_held=most_held,
    )
    return batches, reads, most_held


def _window_pieces(epoch: Share) -> np.ndarray:
    """The chunks (store rows) the windows of ``epoch`` are gathered from, in the order they are read."""
    data = epoch.job.data
    return read_pieces(_window_reads(epoch)[1], data.store_chunk_rows, data.store_rows)


def _read_next_epoch_early(job, local: ProcessState, view: EpochView, worker: int, reader: PieceReader, submit):
    """Start the next epoch's first reads in ``reader``'s threads as this one ends (:mod:`zarrtorch._read.early`)."""
    topology = Topology(view.rank, view.world_size, job.num_workers)
    following = job.spec.plan(view.epoch + 1, topology)
    pieces, read = reader.early_reads(following.workers[worker].pieces + job.data.row_offset)
    local.early = EarlyReads(submit, read, pieces, reader.prefetch)
    return local.early


# -- the stages after the gather, shared by rows and windows --------------------------------------------------
def packings_by_column(data) -> dict:
    """The CF packing of each batch column that holds a packed array."""
    return {column: data.packings[name] for column, name in data.packed_columns.items()}


def gathered_packed_columns(data) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Row shape and stored dtype of each batch column holding a CF-packed array: what its rows are gathered into
    before they are decoded."""
    out, stored = data.out_columns, data.columns
    return {column: (out[column][0], stored[name][1]) for column, name in data.packed_columns.items()}


def gathered_columns(data) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The columns a batch is gathered into when no pooled arrays or slot are given: packed ones as stored."""
    columns = {INDEX: ((), np.dtype(np.int64)), **data.out_columns}
    columns.update(gathered_packed_columns(data))
    return columns


def with_padding(batch: Batch, padding: np.ndarray, dest: Batch | None) -> Batch:
    """The batch with ``"padding"``: True for the rows (or windows) this rank reads only to even out the ranks
    (``padding``: their store rows, or window start rows; a row is never both padding and data on one rank,
    :attr:`zarrtorch.plan.RankPlan.padding`), written into the padding column of the arrays it was gathered into
    (``dest``, a shared slot's travels with it) when they have one."""
    mask = np.isin(batch[INDEX], padding) if len(padding) else np.zeros(len(batch[INDEX]), bool)
    if dest is not None and PADDING in dest:
        dest[PADDING][...] = mask
        mask = dest[PADDING]
    batch[PADDING] = mask
    return batch


def _delivered(job, batches: Iterator[Batch], writer) -> Iterator:
    """Batches as DataLoader passes them on: a batch in a shared slot as a reference to it
    (:mod:`zarrtorch._workers.ring`), any other as tensors."""
    to_torch = partial(as_tensors, job)
    if writer is not None:
        return (writer.send(batch, to_torch) for batch in batches)
    return (to_torch(batch) for batch in batches)


def as_tensors(job, batch: Batch) -> dict[str, torch.Tensor]:
    """A batch's arrays as tensors: stacked columns, the row numbers only if asked for, then the dataset's
    transform unless the training process applies it."""
    data = job.data
    batch = stack_columns(batch, data.stack)
    out = {name: torch.from_numpy(arr) for name, arr in batch.items() if name != INDEX or data.return_index}
    transform: Callable | None = data.transform
    if transform is None or job.transform_in_consumer:
        return out
    return transform(out)
