"""Pieces dealt out to the workers and gathered back in order: the reads behind ``batch_order="rank"``.

With ``batch_order="rank"`` a rank's batches come from one stream, the plan's single worker, whatever the number
of DataLoader workers: so the batches cannot depend on it. The workers only read and decode that stream's pieces:
the stream's pieces are grouped ``PIECES_PER_ITEM`` consecutive ones at a time, and worker ``w`` of ``W`` reads
groups ``w, w + W, w + 2W, ...`` (:func:`dealt`) and sends each group as one DataLoader item (:func:`items`), each
piece's rows written into a slot of a ring reused every epoch (:func:`piece_ring`) and only the slot's number
sent. DataLoader hands its workers' items back in turn (``in_order=True``), worker 0 first, skipping a worker
once it has ended; the workers' counts differ by at most one, the lower workers holding the extra ones, so the
items come back as groups 0, 1, 2, ... and their pieces (:func:`pieces_of`) as pieces 0, 1, 2, ... The training
process's shuffle buffer and batches take them from :class:`DealtPieces`, which stands in for the reader there,
and checks that each piece is the one expected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from zarrtorch._util.sizes import native
from zarrtorch._workers.ring import REF, BatchRing, RingShape, RingWriter

PIECE = "_zarrtorch_piece"  # the key of a sent piece's [start, stop) store rows (with REF: its slot)
PIECES = "_zarrtorch_pieces"  # the key of an item's list of sent pieces
# Pieces per DataLoader item: each item costs the training process a fixed time (DataLoader's queues, its
# bookkeeping, a thread wake-up) in series with the batches it forms; fewer, larger items cost less of it
# (docs/batch-order.md, "Measured"), each one more ring slot per worker (piece_slots).
PIECES_PER_ITEM = 4


def dealt(pieces: np.ndarray, worker: int, workers: int, per_item: int = PIECES_PER_ITEM) -> np.ndarray:
    """Worker ``worker``'s pieces of ``pieces`` (in order): groups of ``per_item`` consecutive pieces, dealt out
    in turn to ``workers`` (the last group may be shorter)."""
    group = np.arange(len(pieces)) // per_item
    return pieces[group % workers == worker]


def items(sent_pieces: Iterator[dict], per_item: int = PIECES_PER_ITEM) -> Iterator[dict]:
    """The DataLoader items a worker sends: its sent pieces, ``per_item`` at a time, as :func:`dealt` grouped
    them (the last item may hold fewer)."""
    group: list[dict] = []
    for piece in sent_pieces:
        group.append(piece)
        if len(group) == per_item:
            yield {PIECES: group}
            group = []
    if group:
        yield {PIECES: group}


def pieces_of(received: Iterator[dict]) -> Iterator[dict]:
    """The sent pieces of the items received from the workers, in order."""
    for item in received:
        yield from item[PIECES]


def piece_ring(data, num_workers: int, prefetch_factor: int, transport: str | None) -> BatchRing | None:
    """The ring of piece slots the workers send their pieces through (``None``: with ``transport="queue"``, each
    piece travels in a new shared-memory segment of DataLoader's queue). A slot holds a chunk's rows of every
    array; a worker has :func:`piece_slots` of them, allocated once and reused every epoch."""
    if transport == "queue" or num_workers == 0:
        return None
    rows = max(data.chunk_rows, data.store_chunk_rows)
    columns = tuple((name, shape, str(dtype)) for name, (shape, dtype) in data.columns.items())
    return BatchRing(RingShape(num_workers, piece_slots(prefetch_factor), rows, columns))


def piece_slots(prefetch_factor: int) -> int:
    """Slots per worker so that a worker seldom finds none free: the pieces of the ``prefetch_factor`` items
    DataLoader lets it have in flight (the one being written included), those of the item the training process
    takes pieces from, the piece it received before (freed as the next arrives), and one spare. A worker that
    finds none free sends the piece through the queue instead: it never waits and never writes into a slot
    still held."""
    return (prefetch_factor + 1) * PIECES_PER_ITEM + 2


def sent(piece: np.ndarray, data: dict[str, np.ndarray], writer: RingWriter | None) -> dict:
    """A piece as a worker sends it: its rows, and its arrays copied into a free slot of ``writer``'s ring (then
    only the slot's number travels), or into new shared memory (no ring, or no slot free). Copied now either way:
    the reader's arrays come from its pools and are reused once the next piece is read, and a DataLoader worker
    pickles what it sends in a thread of its queue, later: a copy made there could already hold the next piece."""
    out: dict = {PIECE: [int(piece[0]), int(piece[1])]}  # plain ints: pickled by value, no segment of their own
    slot = writer.out(int(piece[1]) - int(piece[0])) if writer is not None else None
    if slot is not None:
        for name, array in data.items():
            slot[name][...] = array
        out[REF] = writer.reference
        return out
    for name, array in data.items():
        array = np.asarray(array, dtype=native(array.dtype))
        shared = torch.empty(array.shape, dtype=torch.from_numpy(array[:0]).dtype).share_memory_()
        shared.numpy()[...] = array
        out[name] = shared
    return out


@dataclass(frozen=True)
class NothingAhead:
    """The requests in flight of :class:`DealtPieces`, as :func:`zarrtorch.window_stream.stream_windows` counts
    them: none, each piece is copied where it goes as it is taken."""

    most_held: int = 0


class DealtPieces:
    """The reader of the training process with ``batch_order="rank"`` (in place of a
    :class:`~zarrtorch._read.reader.PieceReader` for :func:`zarrtorch.stream.stream_batches` and
    :func:`zarrtorch.window_stream.stream_windows`): its pieces are those ``received`` from the workers, in
    order. ``arrays`` and ``chunk_rows``: the store's; ``rows_reader()``: a reader of this process, made only for
    the rows a resumed shuffle buffer holds (:meth:`read_rows`); ``ring``: the piece slots the workers write
    into (:func:`piece_ring`), each held from its piece's arrival until nothing references its rows any more (the
    buffer or the batch has copied them)."""

    cache = None
    early = None
    started_early = None
    pieces_per_read = 1

    def __init__(
        self,
        received: Iterator[dict],
        arrays: dict,
        chunk_rows: int,
        rows_reader: Callable,
        ring: BatchRing | None = None,
    ):
        self.received = received
        self.ring = ring
        self.arrays = arrays
        self.chunk_rows = chunk_rows
        self.in_flight = NothingAhead()
        self._rows_reader = rows_reader
        self._taken: dict[str, np.ndarray] | None = None

    def iter_pieces(self, pieces: np.ndarray, ready=None, read: Callable | None = None) -> Iterator[dict]:
        """The data of ``pieces``, in order, as the workers sent them; ``read(start, stop)`` (a slot of held
        chunks): what is yielded instead, given the piece through :meth:`read_piece`."""
        for start, stop in np.asarray(pieces).tolist():
            data = self._next(start, stop)
            if read is None:
                yield data
            else:
                self._taken = data
                yield read(start, stop)

    def _next(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """The next piece received, checked to be rows ``[start, stop)``."""
        try:
            got = next(self.received)
        except StopIteration:
            raise RuntimeError(
                f"zarrtorch internal error: the workers sent no piece for rows {start}:{stop} and ended (batch_order="
                "'rank'); no batch was formed without it. Please report it with the loader's settings"
            ) from None
        rows = got.pop(PIECE)
        if rows != [start, stop]:
            raise RuntimeError(
                f"zarrtorch internal error: a worker sent rows {rows[0]}:{rows[1]} where rows {start}:{stop} come "
                "next (batch_order='rank'); no batch was formed from them. Please report it with the loader's settings"
            )
        ref = got.pop(REF, None)
        if ref is not None:
            return self._slot(ref, start, stop)
        return {name: tensor.numpy() for name, tensor in got.items()}

    def _slot(self, ref: list[int], start: int, stop: int) -> dict[str, np.ndarray]:
        """The rows ``[start, stop)`` a worker wrote into the ring slot ``ref`` (worker, slot, rows), held until
        the last view of them is freed."""
        worker, slot, rows = ref
        if self.ring is None or rows != stop - start:
            raise RuntimeError(
                f"zarrtorch internal error: a worker sent rows {start}:{stop} in ring slot {slot} of worker {worker} "
                f"({rows} rows), which this process cannot take (batch_order='rank'); no batch was formed from them. "
                "Please report it with the loader's settings"
            )
        return self.ring.held(worker, slot, rows, self.ring.data)

    def read_piece(self, start: int, stop: int, into: dict | None = None, **_) -> dict[str, np.ndarray]:
        """The piece just received (rows ``[start, stop)``), copied into ``into`` when given."""
        data, self._taken = self._taken, None
        if into is None:
            return data
        for name, column in into.items():
            column[: stop - start] = data[name]
        return into

    def read_rows(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Rows a resumed shuffle buffer holds, read in this process (once per resume)."""
        return self._rows_reader().read_rows(rows)


def ended(received: Iterator[dict]) -> None:
    """Check that the workers sent nothing past the pieces taken, draining DataLoader's iterator to its end."""
    for extra in received:
        rows = extra[PIECE]
        raise RuntimeError(
            f"zarrtorch internal error: a worker sent rows {rows[0]}:{rows[1]} after the epoch's last piece "
            "(batch_order='rank'). Please report it with the loader's settings"
        )
