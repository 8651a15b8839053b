"""One worker's epoch of windows as batches: the buffer shuffles window ids, the rows are read once per block.

The shuffle buffer runs on window ids alone (the schedule of :mod:`zarrtorch.buffer`, so batches, resume
and audit are those of rows, with window ids in their place). The rows behind the windows are held as whole
decoded chunks: the worker knows its whole schedule in advance, so it knows, before reading anything, the first
and the last batch that needs each chunk, and reads each chunk once for all the windows of a piece that
use it (:func:`chunk_reads`), in the order the batches first need them, ahead of use in the reading threads.
A chunk is dropped after the last batch that needs it; it is read again only for a piece that comes later
and reaches it: the halo of a block read by the worker holding the block before it.

The buffer draws its windows at random, so a block's chunks stay until the last window that reads each of
them is drawn: a chunk read by ``fan`` windows stays about ``H(fan) <= 1 + ln(fan)`` turnovers of the buffer
(the expected largest of ``fan`` waiting times), not one. :func:`held_chunks_bound` counts that, and
:func:`chunk_reads` keeps to it whatever the draws: where the schedule would hold more, it drops the chunks
needed again the latest and reads them again then (Belady's rule: the fewest reads for that memory).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from zarrtorch._read.reader import PieceReader
from zarrtorch._util.sizes import ceil_div, native
from zarrtorch.buffer import simulate
from zarrtorch.held_chunks import HeldChunks
from zarrtorch.plan import WorkerPlan, shuffles_rows
from zarrtorch.windows import Windows, WindowStarts


@dataclass(frozen=True)
class ChunkReads:
    """Chunk ``chunks[k]`` is read once and held from batch ``first[k]`` to batch ``last[k]`` (both included);
    the reads in the order they are made."""

    chunks: np.ndarray
    first: np.ndarray
    last: np.ndarray

    @property
    def most_held(self) -> int:
        """Chunks held at once at most (after a batch's reads, before its drops)."""
        if not len(self.chunks):
            return 0
        span = int(self.last.max()) + 2
        change = np.zeros(span, dtype=np.int64)
        np.add.at(change, self.first, 1)
        np.add.at(change, self.last + 1, -1)
        return int(np.cumsum(change).max())


def held_chunks_bound(
    windows: Windows, *, block_rows: int, chunk_rows: int, buffer_rows: int, batch_size: int, runs: int = 1
) -> int:
    """The most store chunks a worker holds at once for its window batches (its reads in flight not counted):
    the pieces with windows in the buffer (or the batch, when larger), each kept ``1 + ln(fan)`` turnovers of
    the buffer, where ``fan`` windows read one chunk, and two pieces partly emitted; at least one batch's
    chunks. A piece needs its block's chunks and, for each of its ``runs`` runs of consecutive starts, the halo
    and a chunk boundary at each end. :func:`chunk_reads` keeps to it."""
    block, chunk = int(block_rows), int(chunk_rows)
    halo = windows.halo_chunks(chunk)
    per_piece = min(block * windows.steps, ceil_div(block, chunk) + int(runs) * (halo + 2))
    fan = min(windows.steps * chunk, windows.span + chunk - 1)  # window starts whose steps reach one chunk
    pieces = ceil_div(max(int(buffer_rows), int(batch_size)), block) * (1 + math.log(fan))
    per_window = min(windows.steps, halo + 1)  # chunks one window reads
    return max(math.ceil((pieces + 2) * per_piece), int(batch_size) * per_window)


def window_chunks_for_batches(data, batch_size: int) -> int:
    """The store chunks a reading process holds at most for the window batches of ``data`` (a
    :class:`~zarrtorch.ZarrIterableDataset` with ``windows``) in batches of ``batch_size``, its reads ahead not
    counted: :func:`held_chunks_bound` of its windows, blocks, buffer and runs of starts, and no more than the
    chunks its windows reach, first to last (:meth:`~zarrtorch.windows.WindowStarts.chunks_reached`): a chunk is
    held once at a time, so no worker makes more slots than that (:func:`stream_windows`), and a short period's
    blocks, however long, are not counted past it."""
    row_shuffle = shuffles_rows(data.shuffle, data.buffer_chunks)
    bound = held_chunks_bound(
        data.windows,
        block_rows=data.chunk_rows,
        chunk_rows=data.store_chunk_rows,
        buffer_rows=data.buffer_rows if row_shuffle else 0,
        batch_size=int(batch_size),
        runs=data.starts.most_runs(data.chunk_rows),
    )
    return min(bound, data.starts.chunks_reached(data.windows.span, data.store_chunk_rows))


def window_rows(starts: WindowStarts, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``(len(ids), steps)``: the store row of each step of each window."""
    return starts.start(ids)[:, None] + offsets[None, :]


def chunk_reads(
    batches: list[np.ndarray],
    pieces: np.ndarray,
    starts: WindowStarts,
    offsets: np.ndarray,
    chunk_rows: int,
    skip: int = 0,
    most_held: int | None = None,
) -> ChunkReads:
    """The chunks a worker reads for ``batches`` (window ids per batch, its whole schedule), from batch ``skip``,
    holding at most ``most_held`` at once (:func:`held_chunks_bound`; ``None``: no limit).

    Each (chunk, piece) is needed from the first to the last batch holding a window of that piece that
    reaches the chunk; the spans of one chunk that overlap or touch are read once (the piece's own chunks,
    and the next block's first chunks when that block is this worker's next piece too). Where these spans
    would hold more than ``most_held`` chunks at once, the reads are those of :func:`_reads_within`."""
    reads = _spans_by_piece(batches, pieces, starts, offsets, chunk_rows, skip)
    if most_held is None or reads.most_held <= most_held:
        return reads
    return _reads_within(batches, starts, offsets, chunk_rows, skip, int(most_held))


def _uses(batches: list[np.ndarray], first: int, keys_of) -> tuple[np.ndarray, np.ndarray] | None:
    """``(key, batch)`` for the distinct keys ``keys_of(ids)`` each batch from ``first`` needs, in batch order;
    ``None`` when no batch has a window."""
    keys, batch_of = [], []
    for j in range(first, len(batches)):
        if len(batches[j]):
            k = keys_of(batches[j])
            keys.append(k)
            batch_of.append(np.full(len(k), j, dtype=np.int64))
    return (np.concatenate(keys), np.concatenate(batch_of)) if keys else None


NO_READS = ChunkReads(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))


def _spans_by_piece(batches, pieces, starts, offsets, chunk_rows, skip) -> ChunkReads:
    piece_starts = pieces[:, 0] if len(pieces) else np.zeros(0, np.int64)
    order = np.argsort(piece_starts)

    def chunk_and_piece(ids: np.ndarray) -> np.ndarray:
        piece = order[np.searchsorted(piece_starts[order], ids, side="right") - 1]
        chunk = window_rows(starts, ids, offsets) // chunk_rows
        return np.unique(chunk * (len(pieces) + 1) + piece[:, None])

    uses = _uses(batches, 0, chunk_and_piece)
    if uses is None:
        return NO_READS
    key, batch = uses
    by_key = np.lexsort((batch, key))
    key, batch = key[by_key], batch[by_key]
    new = np.concatenate([[True], key[1:] != key[:-1]])
    head = np.flatnonzero(new)
    tail = np.concatenate([head[1:], [len(key)]]) - 1
    chunk = key[head] // (len(pieces) + 1)
    first, last = batch[head], batch[tail]
    by_chunk = np.lexsort((first, chunk))  # merge the spans of one chunk that overlap or touch
    chunk, first, last = chunk[by_chunk], first[by_chunk], last[by_chunk]
    out_c, out_f, out_l = [], [], []
    for c, f, la in zip(chunk.tolist(), first.tolist(), last.tolist(), strict=True):
        if out_c and out_c[-1] == c and f <= out_l[-1] + 1:
            out_l[-1] = max(out_l[-1], la)
        else:
            out_c.append(c)
            out_f.append(f)
            out_l.append(la)
    c, f, la = (np.array(v, dtype=np.int64) for v in (out_c, out_f, out_l))
    keep = la >= skip
    c, f, la = c[keep], np.maximum(f[keep], skip), la[keep]
    when = np.lexsort((c, f))
    return ChunkReads(c[when], f[when], la[when])


def _reads_within(batches, starts, offsets, chunk_rows: int, skip: int, most_held: int) -> ChunkReads:
    """Reads holding at most ``most_held`` chunks at once: a chunk is held from a batch that needs it and does
    not hold it, to the last batch that needs it before it is dropped; when the chunks a batch needs do not fit,
    those held that are needed again the latest are dropped (Belady's rule), each after its last use so far."""
    uses = _uses(batches, skip, lambda ids: np.unique(window_rows(starts, ids, offsets) // chunk_rows))
    if uses is None:
        return NO_READS
    chunk, batch = uses
    by_chunk = np.lexsort((batch, chunk))
    after = np.full(len(chunk), np.iinfo(np.int64).max)  # the next batch needing the same chunk
    same = chunk[by_chunk][1:] == chunk[by_chunk][:-1]
    after[by_chunk[:-1][same]] = batch[by_chunk][1:][same]
    # uses are in batch order already (built batch by batch)
    never = int(np.iinfo(np.int64).max)
    held: dict[int, list[int]] = {}  # chunk -> [next use, its read's index]
    latest: list[tuple[int, int]] = []  # (-next use, chunk): a heap, stale entries skipped
    out_c, out_f, out_l = [], [], []
    bounds = np.flatnonzero(np.diff(batch)) + 1
    for group in np.split(np.arange(len(batch)), bounds):
        j = int(batch[group[0]])
        need, nxt = chunk[group].tolist(), after[group].tolist()
        if len(need) > most_held:
            raise RuntimeError(
                f"zarrtorch internal error: batch {j} of a worker needs {len(need)} chunks, more than the "
                f"{most_held} it may hold. Please report it with the loader's settings"
            )
        needed = set(need)
        missing = [c for c in need if c not in held]
        over = len(held) + len(missing) - most_held
        while over > 0:
            neg_next, c = heapq.heappop(latest)
            if c in held and held[c][0] == -neg_next and c not in needed:
                del held[c]  # its read ended at its last use, set when it was used
                over -= 1
        for c, u in zip(need, nxt, strict=True):
            if c in held:
                held[c][0] = u
                out_l[held[c][1]] = j
            else:
                held[c] = [u, len(out_c)]
                out_c.append(c)
                out_f.append(j)
                out_l.append(j)
            if u == never:
                del held[c]
            else:
                heapq.heappush(latest, (-u, c))
    c, f, la = (np.array(v, dtype=np.int64) for v in (out_c, out_f, out_l))
    when = np.lexsort((c, f))
    return ChunkReads(c[when], f[when], la[when])


def worker_window_batches(share: WorkerPlan, *, buffer_rows: int, warmup_rows: int, rng) -> list[np.ndarray]:
    """The window ids of every batch of one worker: the rows' buffer schedule run on ids (as workers run it)."""
    return simulate(share.pieces, share.batch_sizes, capacity=buffer_rows, warmup_rows=warmup_rows, rng=rng)


@dataclass(frozen=True, kw_only=True)
class WindowGather:
    """How a worker's windows are gathered into batches: the valid ``starts``, each step's ``offsets`` from its
    window's start, the first ``history`` steps as inputs of the ``inputs`` arrays and the rest as targets of the
    ``targets`` arrays, the ``static`` arrays repeated in every batch, the ``columns`` of a batch made afresh, and the
    store's ``rows``."""

    starts: WindowStarts
    offsets: np.ndarray
    history: int
    inputs: tuple[str, ...]
    targets: tuple[str, ...]
    static: dict[str, np.ndarray]
    columns: dict[str, tuple[tuple[int, ...], np.dtype]]
    rows: int


def read_pieces(reads: ChunkReads, chunk_rows: int, rows: int) -> np.ndarray:
    """The store rows ``[start, stop)`` of each chunk ``reads`` reads, in the order read (``rows``: the store's)."""
    return np.stack([reads.chunks * chunk_rows, np.minimum((reads.chunks + 1) * chunk_rows, rows)], axis=1)


def stream_windows(
    reader: PieceReader,
    batches: list[np.ndarray],
    reads: ChunkReads,
    gather: WindowGather,
    *,
    skip: int = 0,
    out=None,
    held_slots: int = 0,
    held_arrays=None,
) -> Iterator[dict[str, np.ndarray]]:
    """The batches ``batches[skip:]`` as ``{"index": start rows, name: inputs, name_target: targets, static...}``.
    ``out(n)``, when given, returns the arrays each batch is gathered into (:mod:`zarrtorch._workers.ring`, pooled
    arrays), else new ones of ``gather.columns`` are made. Each column is gathered as the chunks hold it (CF-packed
    ones are decoded after, :mod:`zarrtorch.epoch`). The chunks are held in
    :class:`~zarrtorch.held_chunks.HeldChunks` of at least ``held_slots`` chunks, made by ``held_arrays``."""
    starts, offsets, history, rows = gather.starts, gather.offsets, gather.history, gather.rows
    inputs, targets, static, columns = gather.inputs, gather.targets, gather.static, gather.columns
    chunk_rows = reader.chunk_rows
    pieces = read_pieces(reads, chunk_rows, rows)
    # in this machine's byte order: a big-endian array is decoded (and byte-swapped) straight into its slot
    chunk_columns = {n: (tuple(a.shape[1:]), native(a.dtype)) for n, a in reader.arrays.items()}
    in_flight = reader.in_flight.most_held * reader.pieces_per_read  # taken by reads not yet handed over
    held_most = min(max(reads.most_held, held_slots), starts.chunks_reached(int(offsets[-1]) + 1, chunk_rows))
    slots = held_most + in_flight + reader.pieces_per_read  # one chunk is held in one slot at a time
    held = HeldChunks(chunk_columns, chunk_rows, slots, make=held_arrays)
    data = reader.iter_pieces(pieces.reshape(-1, 2), read=held.reading(reader.read_piece))
    drops: dict[int, list[int]] = {}
    k = 0
    try:
        for j in range(skip, len(batches)):
            while k < len(reads.chunks) and reads.first[k] == j:
                c = int(reads.chunks[k])
                held.hold(c, next(data))
                drops.setdefault(int(reads.last[k]), []).append(c)
                k += 1
            ids = batches[j]
            dest = out(len(ids)) if out is not None else None
            if dest is None:
                dest = {n: np.empty((len(ids), *shape), dtype=dt) for n, (shape, dt) in columns.items()}
            where = window_rows(starts, ids, offsets)
            dest["index"][:] = where[:, 0]
            at = held.rows_of(where.reshape(-1)).reshape(where.shape)
            inputs_at = np.ascontiguousarray(at[:, :history]).reshape(-1)
            for name in inputs:
                held.gather(name, inputs_at, dest[name])
            if targets:
                targets_at = np.ascontiguousarray(at[:, history:]).reshape(-1)
                for name in targets:
                    held.gather(name, targets_at, dest[name + "_target"])
            for name, value in static.items():
                dest[name][...] = value
            for c in drops.pop(j, ()):
                held.drop(c)
            yield dest
    finally:
        data.close()
