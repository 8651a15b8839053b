"""One worker's epoch as batches: its plan, the buffer schedule, the row cursor and the reader, put together.

The dataset decides *what* a worker reads (:mod:`zarrtorch.plan`); this module turns that share into
batches of NumPy arrays: it reads the pieces ahead in threads, pushes the rows through the bounded shuffle
buffer and, when resuming mid-epoch, replays the schedule on row ids alone to rebuild the buffer without
reading the rows already consumed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from zarrtorch._read.early import staged_pieces
from zarrtorch._read.reader import PieceReader
from zarrtorch._util.pool import Pools
from zarrtorch._util.sizes import native
from zarrtorch.buffer import INDEX_ONLY, RowCursor, SlotBuffer, buffer_capacity, schedule
from zarrtorch.plan import WorkerPlan
from zarrtorch.ref_buffer import RefBuffer, holds_rows_alone


@dataclass(frozen=True, kw_only=True)
class RowGather:
    """How a worker's rows reach its batches: the buffer's ``columns`` (row shape and stored dtype of each
    array), ``row_offset`` from the plan's rows to the store's (a row window), the buffer's ``buffer_rows`` and
    ``warmup_rows``, and ``copy_direct``: batches that would be views of the reader's arrays are copied (rows kept in
    memory are reused)."""

    columns: dict[str, tuple[tuple[int, ...], np.dtype]]
    row_offset: int
    buffer_rows: int
    warmup_rows: int
    copy_direct: bool = False


def stream_batches(
    reader: PieceReader,
    share: WorkerPlan,
    gather: RowGather,
    rng: np.random.Generator | None,
    *,
    skip: int = 0,
    out=None,
    pools: Pools | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """The batches of one worker's share (``{"index": row ids, name: rows}``), after skipping ``skip``.

    ``rng=None`` keeps stream order. ``out(rows)``, when given, returns the arrays each batch is written into
    (:mod:`zarrtorch._workers.ring`). ``pools``: the process's (:mod:`zarrtorch._util.pool`), where the shuffle
    buffer's arrays are kept between epochs.
    """
    columns, copy_direct, buffer_rows = gather.columns, gather.copy_direct, gather.buffer_rows
    pieces, sizes = share.pieces + gather.row_offset, share.batch_sizes
    capacity = buffer_capacity(buffer_rows, sizes, rng is not None)
    steps = schedule(sizes, share.rows, capacity=buffer_rows, warmup_rows=gather.warmup_rows, rng=rng)
    if capacity and reader.cache is not None:
        yield from _cached(reader, pieces, steps, capacity, skip, out)
        return
    buf_columns = {**INDEX_ONLY, **columns}
    by_ref = bool(capacity) and holds_rows_alone(reader)  # one copy fewer (zarrtorch/ref_buffer.py)
    slots, early = _staged(
        reader, pieces if capacity and not skip and not by_ref else pieces[:0], capacity, buf_columns
    )
    if slots is None and pools and capacity and not by_ref:
        slots = pools.slots(capacity, buf_columns)
    buf = RefBuffer(capacity, buf_columns) if by_ref else SlotBuffer(capacity, buf_columns, slots)
    ids, cursor = replayed(steps, pieces, capacity, skip)
    if ids.filled:  # load what the buffer holds at the resume point
        held = ids.slots["index"][: ids.filled]
        buf.load({"index": held, **reader.read_rows(held)})
    cursor.feed(reader.iter_pieces(pieces[cursor.piece :], ready=early))
    early = None
    try:
        for step in steps:
            batch = buf.apply(step, cursor.stream, out)  # one piece at a time into the buffer
            if copy_direct and step.direct and out is None:
                batch = {name: arr.copy() for name, arr in batch.items()}
            yield batch
            if capacity and not by_ref and reader.started_early is not None:  # the last piece is in: the buffer drains
                buf.flush()
                reader.started_early.stage(buf.slots, capacity - buf.filled - cursor.rows_left())
    finally:
        cursor.close()


def replayed(steps, pieces: np.ndarray, capacity: int, skip: int) -> tuple[SlotBuffer, RowCursor]:
    """The buffer (row ids only) and the row cursor after the first ``skip`` of ``steps``: the schedule replayed
    without reading a row, to resume mid-epoch."""
    ids, cursor = SlotBuffer(capacity, INDEX_ONLY), RowCursor(pieces)
    if skip:
        for _ in range(skip):
            ids.apply(next(steps), cursor.read)
        ids.flush()  # the last step's refill is deferred: run it before reading the buffer's contents
    return ids, cursor


def pieces_read(share: WorkerPlan, gather: RowGather, rng: np.random.Generator | None, skip: int = 0) -> np.ndarray:
    """The pieces (store rows) :func:`stream_batches` reads whole, in order, for the batches of ``share`` after
    ``skip``: what the workers read for the training process with ``batch_order="rank"``. The rows a resumed
    buffer holds are read apart (:meth:`~zarrtorch._read.reader.PieceReader.read_rows`)."""
    pieces, sizes = share.pieces + gather.row_offset, share.batch_sizes
    capacity = buffer_capacity(gather.buffer_rows, sizes, rng is not None)
    steps = schedule(sizes, share.rows, capacity=gather.buffer_rows, warmup_rows=gather.warmup_rows, rng=rng)
    return pieces[replayed(steps, pieces, capacity, skip)[1].piece :]


def _staged(reader: PieceReader, pieces: np.ndarray, capacity: int, columns: dict) -> tuple[dict | None, list]:
    """The buffer arrays holding this epoch's first pieces, copied there as the last epoch ended, and
    those pieces' data as views of them (:mod:`zarrtorch._read.early`); ``(None, [])`` if there are none."""
    if reader.early is None:
        return None, []
    slots, k = reader.early.take_staged(pieces)
    fits = (
        slots is not None
        and slots.keys() == columns.keys()
        and all(slots[n].shape == (capacity, *shape) and slots[n].dtype == dt for n, (shape, dt) in columns.items())
    )
    if not fits:
        return None, []
    return slots, staged_pieces(slots, pieces[:k], [n for n in columns if n != "index"])


def _cached(reader: PieceReader, pieces: np.ndarray, steps, capacity: int, skip: int, out) -> Iterator[dict]:
    """The same batches with ``cache=True``, where every piece read stays in the process anyway: the
    buffer runs on row ids alone and each batch's rows are copied straight from the pieces, so rows are
    neither copied into a buffer first nor held twice. A resumed epoch reads its pieces from the start
    (they are cached for the next epochs) and skips the batches already consumed."""
    by_start = np.argsort(pieces[:, 0])  # piece numbers by first row, to find a row's piece
    starts, data = pieces[by_start, 0], [None] * len(pieces)  # each piece's arrays, once read
    read = reader.iter_pieces(pieces)

    def recorded():
        for i, piece in enumerate(read):
            data[i] = piece
            yield piece

    ids, cursor = SlotBuffer(capacity, INDEX_ONLY), RowCursor(pieces)
    cursor.feed(recorded())
    try:
        for k, step in enumerate(steps):
            index = ids.apply(step, cursor.stream)["index"]
            if k < skip:
                continue
            piece = by_start[np.searchsorted(starts, index, side="right") - 1]
            rows = list(zip(piece.tolist(), (index - pieces[piece, 0]).tolist(), strict=True))
            dest = out(len(index)) if out is not None else None
            if dest is None:
                columns = {"index": index, **data[rows[0][0]]}
                dest = {n: np.empty((len(index), *a.shape[1:]), dtype=native(a.dtype)) for n, a in columns.items()}
            dest["index"][:] = index
            for name in data[rows[0][0]]:  # the stored arrays; the batch's other columns are filled later
                column = dest[name]
                for row, (p, r) in enumerate(rows):  # one copy per row (rows are large)
                    column[row] = data[p][name][r]
            yield dest
    finally:
        read.close()
