"""One worker's epoch of windows as batches: the buffer shuffles window ids, the rows are read once per block.

The shuffle buffer runs on window ids alone (the schedule of :mod:`zarrtorch.buffer`, so batches, resume
and audit are those of rows, with window ids in their place). The rows behind the windows are held as whole
decoded chunks: the worker knows its whole schedule in advance, so it knows, before reading anything, the first
and the last batch that needs each chunk, and reads each chunk once for all the windows of a piece that
use it (:func:`chunk_reads`), in the order the batches first need them, ahead of use in the reading threads.
A chunk is dropped after the last batch that needs it; it is read again only for a piece that comes later
and reaches it: the halo of a block read by the worker holding the block before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from zarrtorch._read.reader import PieceReader
from zarrtorch.buffer import simulate
from zarrtorch.plan import WorkerPlan
from zarrtorch.windows import WindowStarts


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
) -> ChunkReads:
    """The chunks a worker reads for ``batches`` (window ids per batch, its whole schedule), from batch ``skip``.

    Each (chunk, piece) is needed from the first to the last batch holding a window of that piece that
    reaches the chunk; the spans of one chunk that overlap or touch are read once (the piece's own chunks,
    and the next block's first chunks when that block is this worker's next piece too)."""
    piece_starts = pieces[:, 0] if len(pieces) else np.zeros(0, np.int64)
    order = np.argsort(piece_starts)
    keys, batch_of = [], []
    for j, ids in enumerate(batches):
        if not len(ids):
            continue
        piece = order[np.searchsorted(piece_starts[order], ids, side="right") - 1]
        chunk = window_rows(starts, ids, offsets) // chunk_rows
        pair = np.unique(chunk * (len(pieces) + 1) + piece[:, None])
        keys.append(pair)
        batch_of.append(np.full(len(pair), j, dtype=np.int64))
    if not keys:
        empty = np.zeros(0, np.int64)
        return ChunkReads(empty, empty, empty)
    key, batch = np.concatenate(keys), np.concatenate(batch_of)
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


def worker_window_batches(share: WorkerPlan, *, buffer_rows: int, warmup_rows: int, rng) -> list[np.ndarray]:
    """The window ids of every batch of one worker: the rows' buffer schedule run on ids (as workers run it)."""
    return simulate(share.pieces, share.batch_sizes, capacity=buffer_rows, warmup_rows=warmup_rows, rng=rng)


def stream_windows(
    reader: PieceReader,
    batches: list[np.ndarray],
    reads: ChunkReads,
    starts: WindowStarts,
    *,
    offsets: np.ndarray,
    history: int,
    inputs: tuple[str, ...],
    targets: tuple[str, ...],
    static: dict[str, np.ndarray],
    out_columns: dict[str, tuple[tuple[int, ...], np.dtype]],
    rows: int,
    skip: int = 0,
    padding: np.ndarray | None = None,
    packings: dict | None = None,
    out=None,
) -> Iterator[dict[str, np.ndarray]]:
    """The batches ``batches[skip:]`` as ``{"index": start rows, name: inputs, name_target: targets, static...}``
    (and ``"padding"`` when ``padding``, the rank's padded window ids, is given). ``out(n)``, when given,
    returns the arrays each batch is gathered into (:mod:`zarrtorch._workers.ring`)."""
    chunk_rows = reader.chunk_rows
    pieces = np.stack([reads.chunks * chunk_rows, np.minimum((reads.chunks + 1) * chunk_rows, rows)], axis=1)
    data = reader.iter_pieces(pieces.reshape(-1, 2))
    held: dict[int, dict[str, np.ndarray]] = {}
    drops: dict[int, list[int]] = {}
    k = 0
    try:
        for j in range(skip, len(batches)):
            while k < len(reads.chunks) and reads.first[k] == j:
                c = int(reads.chunks[k])
                held[c] = next(data)
                drops.setdefault(int(reads.last[k]), []).append(c)
                k += 1
            ids = batches[j]
            dest = out(len(ids)) if out is not None else None
            if dest is None:
                dest = {n: np.empty((len(ids), *shape), dtype=dt) for n, (shape, dt) in out_columns.items()}
            where = window_rows(starts, ids, offsets)
            dest["index"][:] = where[:, 0]
            _gather(held, where[:, :history], chunk_rows, {n: dest[n] for n in inputs})
            if targets:
                _gather(held, where[:, history:], chunk_rows, {n: dest[n + "_target"] for n in targets})
            for name, value in static.items():
                dest[name][...] = value
            if padding is not None:
                dest["padding"][:] = np.isin(ids, padding) if len(padding) else False
            for name, packing in (packings or {}).items():  # CF-packed: gathered in the decoded dtype, decoded here
                for column in [name] * (name in inputs) + [name + "_target"] * (name in targets):
                    packing.decode(dest[column])
            for c in drops.pop(j, ()):
                del held[c]
            yield dest
    finally:
        data.close()


ROW_COPY_BYTES = 1024  # rows at least this large are copied one by one (no temporary); smaller ones per chunk


def _gather(held: dict, where: np.ndarray, chunk_rows: int, dest: dict[str, np.ndarray]) -> None:
    """``dest[name][i, s] = row where[i, s] of name``, from the held chunks. Large rows (gridded fields) are
    copied straight into place, a window's consecutive steps in one chunk as one slice; small ones with one
    fancy-indexed copy per chunk and array (which would go through a temporary of the rows)."""
    steps = where.shape[1]
    flat_rows = where.reshape(-1)
    chunk = flat_rows // chunk_rows
    local = flat_rows - chunk * chunk_rows
    runs = None
    for name, column in dest.items():
        flat = column.reshape(-1, *column.shape[2:])  # a view: batch arrays are C-contiguous
        if flat[:1].nbytes >= ROW_COPY_BYTES:
            if runs is None:
                runs = _runs(chunk, local, steps)
            for a, b, c, r in runs:
                flat[a:b] = held[c][name][r : r + b - a]
            continue
        for c in np.unique(chunk).tolist():
            sel = np.flatnonzero(chunk == c)
            flat[sel] = held[c][name][local[sel]]


def _runs(chunk: np.ndarray, local: np.ndarray, steps: int) -> list[tuple[int, int, int, int]]:
    """``(first, stop, chunk, first row)`` of each stretch of a window's steps that are consecutive rows of one
    chunk (positions counted over the batch's windows x steps)."""
    new = np.ones(len(chunk), dtype=bool)
    new[1:] = (chunk[1:] != chunk[:-1]) | (local[1:] != local[:-1] + 1)
    new[::steps] = True  # a window never continues the one before it
    first = np.flatnonzero(new)
    stop = np.append(first[1:], len(chunk))
    return list(zip(first.tolist(), stop.tolist(), chunk[first].tolist(), local[first].tolist(), strict=True))
