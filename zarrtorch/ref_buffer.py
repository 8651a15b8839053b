"""The shuffle buffer holding references to the decoded rows, not copies: one copy of every row fewer.

:class:`~zarrtorch.buffer.SlotBuffer` copies each row twice after decoding it: from the decoded chunk into a
buffer slot, then from the slot into the batch. Raw decoding makes no copy at all, and for the cheap codecs
(Blosc lz4, no compressor) those two passes over every byte are most of what the loader adds to the decode
(``benchmarks/README.md``, "Store layouts"). :class:`RefBuffer` runs the very same schedule steps, but its data
slots hold a one-row view of the decoded chunk each row came from, and a batch is gathered straight from those
views: the rows, their order and every batch are those of a :class:`~zarrtorch.buffer.SlotBuffer`.

A view keeps its whole decoded chunk alive (a pooled chunk goes back to its pool only when nothing references
it, :mod:`zarrtorch._util.pool`). The rule: a reference buffer is used only where every chunk holds one row
(:func:`holds_rows_alone`), so that the chunks alive are the rows in the buffer, no more than the slots a
:class:`~zarrtorch.buffer.SlotBuffer` would allocate (what ``loader_memory`` counts). With chunks of several rows a
chunk would stay alive until its last row is drawn, past the buffer's size: those are copied, as before.
A slot's reference is dropped as soon as its row is in a batch, so a chunk is freed (or reused) at once.
"""

from __future__ import annotations

import numpy as np

from zarrtorch._read.reader import PieceReader
from zarrtorch.buffer import SlotBuffer


def holds_rows_alone(reader) -> bool:
    """Whether every piece ``reader`` yields is a decoded chunk of its own holding one row, referenced by nothing
    else: a :class:`~zarrtorch._read.reader.PieceReader` of chunks of one row. Not the pieces a worker sent
    (``batch_order="rank"``), which live in a ring of few slots the workers wait on, nor rows kept in memory."""
    return isinstance(reader, PieceReader) and reader.chunk_rows == 1 and reader.cache is None


class RefBuffer(SlotBuffer):
    """A :class:`~zarrtorch.buffer.SlotBuffer` whose data columns hold references: slot ``i`` of a column is a
    one-row view of the decoded rows (an object array), the ``index`` column is the row ids as before. Batches
    are new arrays of ``columns``' dtypes, or the arrays ``out(rows)`` returns, gathered into directly."""

    def __init__(self, capacity: int, columns: dict[str, tuple[tuple[int, ...], np.dtype]]):
        slots = {name: np.empty(capacity, dtype=np.int64 if name == "index" else object) for name in columns}
        super().__init__(capacity, columns, slots)
        self._dtypes = {id(slots[name]): np.dtype(dt) for name, (_, dt) in columns.items()}  # a batch's, by column

    def _write(self, dst, segments) -> None:
        offset = 0
        for seg in segments:
            n = len(seg["index"])
            if n == 1:  # a piece of one row (every piece of one-row chunks): its slot takes the segment itself
                slot = dst[offset] if isinstance(dst, np.ndarray) else dst.start + offset
                for name, column in self.slots.items():
                    column[slot] = seg[name][0] if name == "index" else seg[name]
            else:
                where = self._slots(dst, offset, n)
                for name, column in self.slots.items():
                    column[where] = seg[name] if name == "index" else _row_views(seg[name])
            offset += n
            seg = None

    def _gather(self, column: np.ndarray, take: np.ndarray):
        if column.dtype != object:
            return column[take]
        rows = column[take].tolist()
        column[take] = None  # in the batch now: the chunk may go
        return np.concatenate(rows, dtype=self._dtypes[id(column)])

    def _take_into(self, column: np.ndarray, take: np.ndarray, out: np.ndarray) -> np.ndarray:
        if column.dtype != object:
            return super()._take_into(column, take, out)
        rows = column[take].tolist()
        column[take] = None
        return np.concatenate(rows, out=out)

    def load(self, columns: dict[str, np.ndarray]) -> None:
        n = len(columns["index"])
        for name, column in self.slots.items():
            column[:n] = columns[name] if name == "index" else _row_views(columns[name])
        self.filled = n

    def flush(self) -> None:
        super().flush()
        for column in self.slots.values():  # slots past the fill level hold no row: drop what they referenced
            if column.dtype == object:
                column[self.filled :] = None


def _row_views(rows: np.ndarray) -> np.ndarray:
    """``rows`` as an object array of one-row views of it."""
    out = np.empty(len(rows), dtype=object)
    for i in range(len(rows)):
        out[i] = rows[i : i + 1]
    return out
