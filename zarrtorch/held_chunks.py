"""The decoded chunks a worker's window batches are gathered from, held in one array per store array.

A window batch copies every step of every window from the chunk that holds it: with one time step per chunk
and windows of six steps, 192 copies of one step for a batch of 32, each a Python call holding the GIL that
the reading threads need between their decodes. Holding the chunks in slots of one array per store array
turns a batch into one gather per array (``numpy.take`` of rows as bytes: a single call that releases the GIL
and copies each row with ``memcpy``, in the calling thread only, so that no intra-op threads compete with the
reading threads for the cores). The reading threads decode each chunk straight into a free slot: a copy of it
in the consumer's thread would release and retake the GIL once more per chunk, and each time the consumer waits
for a reading thread to let go of it (measured in ``benchmarks/README.md``). Slots freed by a dropped chunk are
reused first, so the pages touched stay those of the most chunks held and read at once.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Columns = dict[str, tuple[tuple[int, ...], np.dtype]]


class HeldChunks:
    """``slots`` chunks of ``chunk_rows`` rows of each array in ``columns`` (row shape, dtype), as rows of one
    array per name (``make(rows, columns)`` makes them: a process's pool keeps them across epochs). A reading
    thread takes a free slot and decodes a chunk into it (:meth:`reading`); the consumer then holds it as that
    chunk until it drops it."""

    def __init__(
        self, columns: Columns, chunk_rows: int, slots: int, make: Callable[[int, Columns], dict] | None = None
    ):
        self.chunk_rows = int(chunk_rows)
        self.slots = max(1, int(slots))
        rows = self.slots * self.chunk_rows
        if make is None:
            self.data = {n: np.empty((rows, *shape), dtype=dt) for n, (shape, dt) in columns.items()}
        else:
            self.data = make(rows, columns)
        self._free = list(range(self.slots - 1, -1, -1))  # a stack (atomic pop/append): the lowest slots first
        self._slot: dict[int, int] = {}
        self._bytes = {n: _as_bytes(a) for n, a in self.data.items()}  # rows as bytes, for the gather

    def __len__(self) -> int:
        return len(self._slot)

    def take_slot(self) -> int:
        """A free slot, for a chunk about to be decoded (any thread)."""
        try:
            return self._free.pop()
        except IndexError:
            raise RuntimeError(
                f"zarrtorch internal error: all {self.slots} slots of the chunks held for window batches are in use, "
                "more than the worker's schedule and reads in flight allow. Please report it with the loader's "
                "settings"
            ) from None

    def slot(self, slot: int) -> dict[str, np.ndarray]:
        """The arrays' rows of ``slot``: where a chunk is decoded."""
        at = slot * self.chunk_rows
        return {name: column[at : at + self.chunk_rows] for name, column in self.data.items()}

    def reading(self, read_piece: Callable[..., dict]) -> Callable[[int, int], int]:
        """``read(start, stop)``: takes a slot, decodes the chunk of rows ``[start, stop)`` into it with
        ``read_piece(start, stop, into=...)`` (:meth:`zarrtorch._read.reader.PieceReader.read_piece`) and returns
        the slot; a slot whose read failed is free again."""

        def read(start: int, stop: int, **options) -> int:
            slot = self.take_slot()
            try:
                read_piece(start, stop, into=self.slot(slot), **options)
            except BaseException:
                self._free.append(slot)
                raise
            return slot

        return read

    def hold(self, chunk: int, slot: int) -> None:
        """Slot ``slot`` holds chunk ``chunk`` until :meth:`drop`."""
        self._slot[int(chunk)] = slot

    def drop(self, chunk: int) -> None:
        """Chunk ``chunk`` is needed no more: its slot is the next one filled."""
        self._free.append(self._slot.pop(int(chunk)))

    def rows_of(self, store_rows: np.ndarray) -> np.ndarray:
        """The rows of :attr:`data` holding ``store_rows`` (flat int64), each in a chunk held now."""
        cr = self.chunk_rows
        chunk = store_rows // cr
        unique, inverse = np.unique(chunk, return_inverse=True)
        try:
            slots = np.array([self._slot[c] for c in unique.tolist()], dtype=np.int64)
        except KeyError as missing:
            raise RuntimeError(
                f"zarrtorch internal error: a window batch needs chunk {missing} of the store, which is not held "
                "(read too late or dropped too early); nothing was returned. Please report it with the loader's "
                "settings"
            ) from None
        return slots[inverse.reshape(-1)] * cr + (store_rows - chunk * cr)

    def gather(self, name: str, rows: np.ndarray, out: np.ndarray) -> None:
        """``out`` (rows x steps of windows) ``= data[name][rows]``: one ``take`` of bytes where ``out`` has the
        held dtype and is contiguous, else a numpy gather (which converts another dtype: CF-packed columns are
        gathered as stored, then decoded, :mod:`zarrtorch._read.columns`)."""
        source = self._bytes[name]
        if source is None or out.dtype != self.data[name].dtype or not out.flags.c_contiguous or len(rows) == 0:
            out[...] = self.data[name][rows].reshape(out.shape)
            return
        if rows.min() < 0 or rows.max() >= len(source):  # mode="clip" below would repeat an edge row silently
            raise RuntimeError(
                f"zarrtorch internal error: a window batch needs rows {rows.min()}..{rows.max()} of {len(source)} "
                "held; nothing was returned. Please report it with the loader's settings"
            )
        # mode="clip": "raise" would gather into a temporary and copy it into ``out`` (twice the memory traffic)
        np.take(source, rows, axis=0, out=out.reshape(len(rows), -1).view(np.uint8), mode="clip")


def _as_bytes(array: np.ndarray) -> np.ndarray | None:
    """``array``'s rows as a 2-D uint8 array sharing its memory, or ``None`` where rows hold no bytes."""
    if array.ndim == 0 or array.dtype.itemsize * int(np.prod(array.shape[1:])) == 0 or not array.flags.c_contiguous:
        return None
    return array.reshape(array.shape[0], -1).view(np.uint8)
