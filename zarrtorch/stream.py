"""One worker's epoch as batches: its plan, the buffer schedule, the row cursor and the reader, put together.

The dataset decides *what* a worker reads (:mod:`zarrtorch.plan`); this module turns that share into
batches of NumPy arrays: it reads the pieces ahead in threads, pushes the rows through the bounded shuffle
buffer and, when resuming mid-epoch, replays the schedule on row ids alone to rebuild the buffer without
reading the rows already consumed.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from zarrtorch.buffer import INDEX_ONLY, SlotBuffer, buffer_capacity, schedule
from zarrtorch.cursor import RowCursor
from zarrtorch.plan import WorkerPlan
from zarrtorch.reader import PieceReader


def stream_batches(
    reader: PieceReader,
    share: WorkerPlan,
    columns: dict[str, tuple[tuple[int, ...], np.dtype]],
    *,
    row_offset: int,
    buffer_rows: int,
    warmup_rows: int,
    rng: np.random.Generator | None,
    skip: int = 0,
    copy_direct: bool = False,
    out=None,
) -> Iterator[dict[str, np.ndarray]]:
    """The batches of one worker's share (``{"index": row ids, name: rows}``), after skipping ``skip``.

    ``row_offset`` moves the plan's rows to the store's (a row window); ``rng=None`` keeps stream order.
    ``copy_direct`` copies batches that would otherwise be views of the reader's arrays (a cache reuses them).
    ``out(rows)``, when given, returns the arrays each batch is written into (:mod:`zarrtorch.ring`).
    """
    pieces, sizes = share.pieces + row_offset, share.batch_sizes
    capacity = buffer_capacity(buffer_rows, sizes, rng is not None)
    steps = schedule(sizes, share.rows, capacity=buffer_rows, warmup_rows=warmup_rows, rng=rng)
    if capacity and reader.cache is not None and all((int(a), int(b)) in reader.cache for a, b in pieces):
        yield from _from_cache(reader.cache, pieces, steps, capacity, skip, out)
        return
    buf = SlotBuffer(capacity, {**INDEX_ONLY, **columns})
    cursor = RowCursor(pieces)
    if skip:  # replay the schedule on row ids only, then load what the buffer holds at that point
        ids = SlotBuffer(capacity, INDEX_ONLY)
        for _ in range(skip):
            ids.apply(next(steps), cursor.read)
        ids.flush()  # the last step's refill is deferred: run it before reading the buffer's contents
        if ids.filled:
            held = ids.slots["index"][: ids.filled]
            buf.load({"index": held, **reader.read_rows(held)})
    cursor.attach(reader.iter_pieces(pieces[cursor.piece :]))
    try:
        for step in steps:
            batch = buf.apply(step, cursor.stream, out)  # one piece at a time into the buffer
            if copy_direct and step.direct and out is None:
                batch = {name: arr.copy() for name, arr in batch.items()}
            yield batch
    finally:
        cursor.close()


def _from_cache(cache: dict, pieces: np.ndarray, steps, capacity: int, skip: int, out) -> Iterator[dict]:
    """The same batches when every piece is in the process's cache (``cache=True`` after its first epoch):
    the buffer runs on row ids alone and each batch's rows are copied straight from the cached pieces,
    so rows are neither copied into a buffer first nor held twice."""
    ids, cursor = SlotBuffer(capacity, INDEX_ONLY), RowCursor(pieces)
    order = np.argsort(pieces[:, 0], kind="stable")
    starts, cached = pieces[order, 0], [cache[int(a), int(b)] for a, b in pieces[order]]
    for k, step in enumerate(steps):
        index = ids.apply(step, cursor.read)["index"]
        if k < skip:
            continue
        piece = np.searchsorted(starts, index, side="right") - 1
        where = list(zip(piece.tolist(), (index - starts[piece]).tolist(), strict=True))
        dest = out(len(index)) if out is not None else None
        if dest is None:
            dest = {n: np.empty((len(index), *a.shape[1:]), dtype=a.dtype) for n, a in cached[0].items()}
            dest["index"] = np.empty(len(index), dtype=np.int64)
        dest["index"][:] = index
        for name in cached[0]:
            column = dest[name]
            for row, (p, r) in enumerate(where):
                column[row] = cached[p][name][r]
        yield dest
