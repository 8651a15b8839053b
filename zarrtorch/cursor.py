"""A worker's position in its stream of rows, and the reads that advance it.

A worker reads its pieces (row ranges, each inside one chunk) in order. The same cursor serves two
purposes: without data it yields row ids only (to replay a schedule when resuming, or to study shuffle
quality without I/O); once :meth:`RowCursor.attach` gives it the pieces' decoded data, it yields data and
row ids together, continuing from where the id-only reads stopped.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class RowCursor:
    """Reads the next rows of ``pieces`` (``(k, 2)`` half-open global row ranges) as segments."""

    def __init__(self, pieces: np.ndarray):
        self.pieces = pieces
        self.piece = 0  # index of the piece the next row comes from
        self.offset = 0  # rows of that piece already read
        self._chunks: Iterator[dict[str, np.ndarray]] | None = None
        self._data: dict[str, np.ndarray] | None = None

    def attach(self, chunks: Iterator[dict[str, np.ndarray]]) -> None:
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
            lo, hi = (int(v) for v in self.pieces[self.piece])
            if self._chunks is not None and self._data is None:
                self._data = next(self._chunks)
            a, b = self.offset, min(hi - lo, self.offset + n)
            segment = {"index": np.arange(lo + a, lo + b, dtype=np.int64)}
            if self._data is not None:
                segment.update((name, column[a:b]) for name, column in self._data.items())
            n -= b - a
            self.offset = b
            if b == hi - lo:
                self.piece, self.offset, self._data = self.piece + 1, 0, None
            yield segment
            segment = None
