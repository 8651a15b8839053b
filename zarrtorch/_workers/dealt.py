"""Pieces dealt out to the workers and gathered back in order: the reads behind ``batch_order="rank"``.

With ``batch_order="rank"`` a rank's batches come from one stream, the plan's single worker, whatever the number
of DataLoader workers: so the batches cannot depend on it. The workers only read and decode that stream's pieces:
worker ``w`` of ``W`` reads pieces ``w, w + W, w + 2W, ...`` (:func:`dealt`), and sends each one as one DataLoader
item. DataLoader hands its workers' items back in turn (``in_order=True``), worker 0 first, skipping a worker
once it has ended; the workers' counts differ by at most one, the lower workers holding the extra ones, so the
items come back as pieces 0, 1, 2, ... The training process's shuffle buffer and batches take them from
:class:`DealtPieces`, which stands in for the reader there, and checks that each piece is the one expected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from zarrtorch._util.sizes import native

PIECE = "_zarrtorch_piece"  # the key of a sent piece's [start, stop) store rows


def dealt(pieces: np.ndarray, worker: int, workers: int) -> np.ndarray:
    """Worker ``worker``'s pieces of ``pieces`` (in order), dealt out in turn to ``workers``."""
    return pieces[worker::workers]


def sent(piece: np.ndarray, data: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """A piece as a worker sends it: its rows, and each array copied into shared memory now. The reader's arrays
    come from its pools and are reused once the next piece is read, and a DataLoader worker pickles what it sends
    in a thread of its queue, later: a copy made there could already hold the next piece."""
    out = {PIECE: torch.tensor([int(piece[0]), int(piece[1])], dtype=torch.int64)}
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
    the rows a resumed shuffle buffer holds (:meth:`read_rows`)."""

    cache = None
    early = None
    started_early = None
    pieces_per_read = 1

    def __init__(self, received: Iterator[dict], arrays: dict, chunk_rows: int, rows_reader: Callable):
        self.received = received
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
        rows = got.pop(PIECE).tolist()
        if rows != [start, stop]:
            raise RuntimeError(
                f"zarrtorch internal error: a worker sent rows {rows[0]}:{rows[1]} where rows {start}:{stop} come "
                "next (batch_order='rank'); no batch was formed from them. Please report it with the loader's settings"
            )
        return {name: tensor.numpy() for name, tensor in got.items()}

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
        rows = extra[PIECE].tolist()
        raise RuntimeError(
            f"zarrtorch internal error: a worker sent rows {rows[0]}:{rows[1]} after the epoch's last piece "
            "(batch_order='rank'). Please report it with the loader's settings"
        )
