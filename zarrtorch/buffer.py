"""The bounded shuffle buffer, as a schedule of slot operations.

A worker reads its rows as a stream (its pieces, in order). The buffer holds at most ``capacity`` rows
(``buffer_chunks`` chunks). Each batch takes rows from random slots; the freed slots are refilled with the
next rows of the stream, so memory never grows past the buffer plus the chunk being consumed.

To start quickly, the buffer does not wait to be full: before batch ``j`` it is filled to
``min(capacity, warmup_rows * 2**j)`` rows (``warmup_rows`` is one chunk), so the first batch needs one
chunk read and the buffer is full after a few batches. When the stream runs out, the buffer drains.

The schedule depends only on the batch sizes, the stream length and the random generator, never on the
data. :func:`simulate` applies it to row ids alone (no I/O): the loader uses that to resume mid-epoch, and
the course uses it to measure shuffle quality without reading a byte. :class:`SlotBuffer` applies the same
steps to arrays.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from zarrtorch._util.random_streams import SHUFFLE_BUFFER
from zarrtorch.plan import RankPlan, rng_for, round_robin_order


@dataclass(frozen=True)
class Step:
    """One batch: append ``append`` stream rows at the buffer's end, emit the rows in ``take`` slots,
    write the next ``refill`` stream rows into ``take[:refill]``, then move ``move_src`` slots into
    ``move_dst`` slots (closing the holes when the stream has run out). Without shuffling, ``direct``
    rows are emitted straight from the stream instead."""

    append: int = 0
    take: np.ndarray | None = None
    refill: int = 0
    move_src: np.ndarray | None = None
    move_dst: np.ndarray | None = None
    direct: int = 0


def schedule(
    batch_sizes: np.ndarray, stream_rows: int, *, capacity: int, warmup_rows: int, rng: np.random.Generator | None
) -> Iterator[Step]:
    """The buffer steps for one worker's epoch; ``rng=None`` means no shuffling (rows in stream order)."""
    if int(np.sum(batch_sizes)) != stream_rows:
        raise ValueError(f"batch sizes add up to {int(np.sum(batch_sizes))} rows, the stream has {stream_rows}")
    if rng is None:
        for b in batch_sizes:
            yield Step(direct=int(b))
        return
    capacity = max(int(capacity), int(max(batch_sizes, default=1)))
    warmup_rows = max(1, int(warmup_rows))
    filled, remaining = 0, stream_rows
    for j, b in enumerate(int(x) for x in batch_sizes):
        target = max(b, min(capacity, warmup_rows << min(j, 62)))
        append = min(max(0, target - filled), remaining)
        filled += append
        remaining -= append
        take = rng.choice(filled, size=b, replace=False)
        refill = min(b, remaining)
        remaining -= refill
        holes = take[refill:]
        move_src = move_dst = None
        if len(holes):
            new_filled = filled - len(holes)
            is_hole = np.zeros(filled, dtype=bool)
            is_hole[holes] = True
            move_dst = np.sort(holes[holes < new_filled])
            tail = np.arange(new_filled, filled)
            move_src = tail[~is_hole[new_filled:]]
            filled = new_filled
        yield Step(append=append, take=take, refill=refill, move_src=move_src, move_dst=move_dst)


class SlotBuffer:
    """Applies schedule steps to named columns (the row ids always, the data arrays when reading), and
    keeps its own fill level (``filled``: slots ``[0, filled)`` hold rows).

    ``slots``: the arrays to use (one per column, ``capacity`` rows; :meth:`zarrtorch._util.pool.Pools.slots`),
    instead of new ones. ``read(n)`` must return the next ``n`` stream rows as an iterable of dicts column ->
    array, consumed in order (:meth:`zarrtorch.buffer.RowCursor.read`).
    """

    def __init__(self, capacity: int, columns: dict[str, tuple[tuple[int, ...], np.dtype]], slots: dict | None = None):
        self.capacity = capacity
        self.slots = slots or {name: np.empty((capacity, *shape), dtype=dt) for name, (shape, dt) in columns.items()}
        self.filled = 0
        self._pending = None  # the refill and moves of the last step, run at the start of the next

    @staticmethod
    def _slots(dst, offset: int, n: int):
        """The ``n`` slots from ``offset`` on of ``dst`` (an array of slots, or a range of them)."""
        if isinstance(dst, np.ndarray):
            return dst[offset : offset + n]
        return slice(dst.start + offset, dst.start + offset + n)

    def _write(self, dst, segments) -> None:
        offset = 0
        for seg in segments:
            n = len(seg["index"])
            where = self._slots(dst, offset, n)
            for name, column in self.slots.items():
                if not isinstance(where, slice):
                    column[where] = seg[name]
                elif not _same_rows(target := column[where], seg[name]):  # rows read early are in place already
                    target[...] = seg[name]
            offset += n
            seg = None  # let its chunk go before the next segment is read (one more decoded chunk otherwise)

    def _gather(self, column: np.ndarray, take: np.ndarray):
        """A batch's rows of one column, as a fresh array (the benchmark's transport prototypes override
        this one method)."""
        return column[take]

    def _take_into(self, column: np.ndarray, take: np.ndarray, out: np.ndarray) -> np.ndarray:
        """A batch's rows of one column, written into ``out`` (:func:`_take_into`)."""
        return _take_into(column, take, out)

    def load(self, columns: dict[str, np.ndarray]) -> None:
        """Fill the first slots with given rows (rebuilding the buffer when resuming mid-epoch)."""
        n = len(columns["index"])
        for name, column in self.slots.items():
            column[:n] = columns[name]
        self.filled = n

    def flush(self) -> None:
        """Run the refill and moves deferred from the last step (before looking at the slots directly)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        take, refill, move_src, move_dst, read = pending
        if refill:
            self._write(take[:refill], read(refill))
        if move_dst is not None:
            for column in self.slots.values():
                column[move_dst] = column[move_src]

    def apply(self, step: Step, read, out=None) -> dict[str, np.ndarray]:
        """Run one step and return its batch (fresh arrays, or the arrays ``out(rows)`` returns, gathered
        into directly, unless it returns ``None``: :mod:`zarrtorch._workers.ring`).

        Refilling the slots a batch freed is deferred to the start of the next step: the batch is already
        a copy and the stream is read in the same order, so every batch is identical, but a batch never
        waits for the rows that will replace it (the first batch needs one chunk read, not two)."""
        self.flush()
        if step.direct:
            segments = list(read(step.direct))
            dest = out(step.direct) if out is not None else None
            if dest is not None:
                return {name: np.concatenate([s[name] for s in segments], out=dest[name]) for name in segments[0]}
            if len(segments) == 1:
                return dict(segments[0])
            return {name: np.concatenate([s[name] for s in segments]) for name in segments[0]}
        if step.append:
            self._write(slice(self.filled, self.filled + step.append), read(step.append))
            self.filled += step.append
        dest = out(len(step.take)) if out is not None else None
        if dest is not None:
            batch = {n: self._take_into(c, step.take, dest[n]) for n, c in self.slots.items()}
        else:
            batch = {name: self._gather(column, step.take) for name, column in self.slots.items()}
        if step.refill or step.move_dst is not None:
            self._pending = (step.take, step.refill, step.move_src, step.move_dst, read)
            if step.move_dst is not None:
                self.filled -= len(step.take) - step.refill
        return batch


def _take_into(column: np.ndarray, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``column[rows]`` written into ``out``. ``np.take`` copies a column read the other way round
    (:mod:`zarrtorch._read.early`) whole before taking from it: such a column is taken from as it is stored."""
    if column.strides[0] < 0:
        column, rows = column[::-1], len(column) - 1 - rows
    return np.take(column, rows, axis=0, out=out, mode="clip")


def _same_rows(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` are views of the very same memory, row for row (on every write into the
    buffer: the cheap bounds check first)."""
    if not np.may_share_memory(a, b):
        return False
    return (
        a.shape == b.shape and a.strides == b.strides and a.__array_interface__["data"] == b.__array_interface__["data"]
    )


INDEX_ONLY = {"index": ((), np.dtype(np.int64))}


def buffer_capacity(buffer_rows: int, batch_sizes: np.ndarray, row_shuffle: bool) -> int:
    """Slots a worker's buffer needs: the buffer, or a whole batch if that is larger; none without shuffling."""
    return max(int(buffer_rows), int(max(batch_sizes, default=1))) if row_shuffle else 0


def simulate(
    pieces: np.ndarray, batch_sizes: np.ndarray, *, capacity: int, warmup_rows: int, rng: np.random.Generator | None
) -> list[np.ndarray]:
    """The row ids of every batch one worker yields, computed without reading any data."""
    rows = int((pieces[:, 1] - pieces[:, 0]).sum()) if len(pieces) else 0
    buf = SlotBuffer(buffer_capacity(capacity, batch_sizes, rng is not None), INDEX_ONLY)
    cursor = RowCursor(pieces)
    steps = schedule(batch_sizes, rows, capacity=capacity, warmup_rows=warmup_rows, rng=rng)
    return [buf.apply(step, cursor.read)["index"] for step in steps]


def consumed_after(
    pieces: np.ndarray, batch_sizes: np.ndarray, batches: int, *, capacity: int, warmup_rows: int, rng
) -> tuple[np.ndarray, int]:
    """The row ids of one worker's first ``batches`` batches, and how many rows of its stream (``pieces``) it
    had read by then: :func:`simulate` stopped early (the rest of its stream is untouched)."""
    rows = int((pieces[:, 1] - pieces[:, 0]).sum()) if len(pieces) else 0
    if rng is None:  # in stream order: the first rows are the ones yielded
        read = int(np.sum(batch_sizes[:batches]))
        return np.concatenate([s["index"] for s in RowCursor(pieces).read(read)] or [np.zeros(0, np.int64)]), read
    buf = SlotBuffer(buffer_capacity(capacity, batch_sizes, True), INDEX_ONLY)
    cursor = RowCursor(pieces)
    steps = schedule(batch_sizes, rows, capacity=capacity, warmup_rows=warmup_rows, rng=rng)
    out = [buf.apply(next(steps), cursor.read)["index"] for _ in range(batches)]
    return np.concatenate(out or [np.zeros(0, np.int64)]).astype(np.int64), rows - cursor.rows_left()


def buffer_rng(
    seed: int, epoch: int, rank: int, worker: int, row_shuffle: bool, segment: int = 0
) -> np.random.Generator | None:
    """The shuffle buffer's generator for one worker (``None``: rows in stream order); a resumed segment
    of an epoch (``segment >= 1``) draws from a generator of its own."""
    if not row_shuffle:
        return None
    return rng_for(seed, epoch, SHUFFLE_BUFFER, rank, worker, *((segment,) if segment else ()))


def rank_batches(
    plan: RankPlan, *, seed: int, chunk_rows: int, buffer_chunks: int, row_shuffle: bool
) -> list[np.ndarray]:
    """Row ids of every batch a rank yields, in the DataLoader's round-robin order: each worker's
    schedule run on ids alone, exactly as the workers run it on data."""
    per_worker = [
        simulate(
            w.pieces,
            w.batch_sizes,
            capacity=buffer_chunks * chunk_rows,
            warmup_rows=chunk_rows,
            rng=buffer_rng(seed, plan.epoch, plan.rank, w.worker, row_shuffle, plan.segment),
        )
        for w in plan.workers
    ]
    taken = [0] * len(per_worker)
    out = []
    for w in round_robin_order([len(b) for b in per_worker]):
        out.append(per_worker[w][taken[w]])
        taken[w] += 1
    return out


# -- a worker's position in its rows (the stream the buffer reads) -------------------------------------------
class RowCursor:
    """Reads the next rows of ``pieces`` (``(k, 2)`` half-open global row ranges) as segments."""

    def __init__(self, pieces: np.ndarray):
        self.pieces = pieces
        self.piece = 0  # index of the piece the next row comes from
        self.offset = 0  # rows of that piece already read
        self._chunks: Iterator[dict[str, np.ndarray]] | None = None
        self._data: dict[str, np.ndarray] | None = None

    def feed(self, chunks: Iterator[dict[str, np.ndarray]]) -> None:
        """From now on also return data: ``chunks`` yields the data of ``pieces[self.piece:]``, in order."""
        self._chunks = chunks

    def close(self) -> None:
        if self._chunks is not None and hasattr(self._chunks, "close"):
            self._chunks.close()

    def rows_left(self) -> int:
        """Rows of the pieces not read yet."""
        rest = self.pieces[self.piece :]
        return int((rest[:, 1] - rest[:, 0]).sum()) - self.offset

    def read(self, n: int) -> list[dict[str, np.ndarray]]:
        """The next ``n`` rows, as one segment per piece touched: ``{"index": row ids, name: rows...}``."""
        return list(self.stream(n))

    def stream(self, n: int) -> Iterator[dict[str, np.ndarray]]:
        """:meth:`read`, one segment at a time: a consumer that copies each segment before asking for the
        next one holds one piece's decoded chunk, not all those ``n`` rows touch (the warm-up of a
        shuffle buffer asks for several chunks at once). Consume it fully before the next read."""
        while n > 0:
            lo, hi = self.pieces[self.piece].tolist()
            if self._chunks is not None and self._data is None:
                self._data = next(self._chunks)
            a, b = self.offset, min(hi - lo, self.offset + n)
            segment = {"index": np.arange(lo + a, lo + b, dtype=np.int64)}
            if self._data is not None and b - a == hi - lo:  # the whole piece: its rows as they were read
                segment.update(self._data)
            elif self._data is not None:
                segment.update((name, column[a:b]) for name, column in self._data.items())
            n -= b - a
            self.offset = b
            if b == hi - lo:
                self.piece, self.offset, self._data = self.piece + 1, 0, None
            yield segment
            segment = None
