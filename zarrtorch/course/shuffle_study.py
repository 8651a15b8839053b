"""Study shuffling without reading data: simulated batches for any store shape, one more quality measure,
and a sweep helper (lesson 03).

- :func:`simulate_batches` gives the row numbers of every batch a rank's loader would yield, for any number
  of rows and chunk length, from the pure plan and buffer schedule; for a real store it equals
  :meth:`zarrtorch.ZarrIterableDataset.batch_row_ids`. So chunk lengths can be compared without writing a
  store for each.
- :func:`batch_mean_spread` looks at the *values*: how much a per-row quantity (say, the mean temperature of a
  time step) varies between batch means, relative to a perfect shuffle. A stream that follows the seasons
  gives batch means that follow the seasons too, a large spread; a perfect shuffle gives batch means that
  differ only by sampling noise, a ratio of 1.
- :func:`sweep` evaluates :mod:`zarrtorch.quality`'s measures (and the memory a setting costs) over a grid
  of buffer sizes and chunk lengths.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from zarrtorch._util.sizes import held_chunks, pieces_per_read
from zarrtorch.buffer import rank_batches
from zarrtorch.plan import epoch_plan, shuffles_rows
from zarrtorch.quality import chunk_diversity, order_correlation

__all__ = ["simulate_batches", "expected_batch_mean_std", "batch_mean_spread", "buffer_memory_bytes", "sweep"]


def simulate_batches(
    rows: int,
    chunk_rows: int,
    *,
    batch_size: int,
    buffer_chunks: int = 8,
    seed: int = 0,
    epoch: int = 0,
    world_size: int = 1,
    rank: int = 0,
    num_workers: int = 0,
    shuffle: bool = True,
    drop_last: bool = True,
) -> list[np.ndarray]:
    """Row numbers of every batch ``rank`` yields in ``epoch``, in the DataLoader's order, for a store of
    ``rows`` rows chunked by ``chunk_rows``, read with zarrtorch's settings (no store needed);
    ``buffer_chunks=0``: chunk order only (rows in stream order)."""
    plan = epoch_plan(
        rows,
        chunk_rows,
        seed=seed,
        epoch=epoch,
        batch_size=batch_size,
        drop_last=drop_last,
        world_size=world_size,
        rank=rank,
        num_workers=num_workers,
        shuffle=shuffle,
    )
    row_shuffle = shuffles_rows(shuffle, buffer_chunks)
    return rank_batches(plan, seed=seed, chunk_rows=chunk_rows, buffer_chunks=buffer_chunks, row_shuffle=row_shuffle)


def expected_batch_mean_std(values: np.ndarray, batch_size: int) -> float:
    """Standard deviation of the mean of ``batch_size`` values drawn without replacement from ``values``
    (what a perfect shuffle gives)."""
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    if n < 2:
        return float("nan")
    return float(values.std() / np.sqrt(batch_size) * np.sqrt(max(n - batch_size, 0) / (n - 1)))


def batch_mean_spread(batches: Sequence[np.ndarray], values: np.ndarray) -> float:
    """Standard deviation of the batch means of ``values[row]``, divided by a perfect shuffle's: about 1 when
    batches are as mixed as random draws, much more when the stream follows a drift (seasons, trends).
    Only full batches (the first batch's size) count."""
    values = np.asarray(values, dtype=np.float64)
    size = len(batches[0])
    means = np.array([values[np.asarray(b)].mean() for b in batches if len(b) == size])
    return float(means.std() / expected_batch_mean_std(values, size))


def buffer_memory_bytes(
    chunk_rows: int, row_bytes: int, *, buffer_chunks: int, decode_threads: int = 1, shuffle: bool = True
) -> int:
    """Decoded data one worker holds at most, as ``ZarrIterableDataset.worker_memory_bytes`` counts it:
    the buffer, the chunks decoded ahead (``decode_threads + 1`` reads of a local store, each of
    :func:`~zarrtorch._util.sizes.pieces_per_read` chunks) and one chunk being consumed."""
    in_flight = (decode_threads + 1) * pieces_per_read(chunk_rows * row_bytes)
    held = held_chunks(buffer_chunks=buffer_chunks, in_flight=in_flight, row_shuffle=shuffle)
    return held * chunk_rows * row_bytes


def fitting_buffers(rows: int, chunk_rows: int, buffer_chunks: Iterable[int]) -> list[int]:
    """The buffer sizes (in chunks) whose rows fit in a store of ``rows`` rows: a larger buffer can never
    fill, so it only costs memory, and a sweep that includes it shows a plateau that is an artefact."""
    return [int(k) for k in buffer_chunks if int(k) >= 1 and int(k) * int(chunk_rows) <= int(rows)]


def sweep(
    rows: int,
    *,
    chunk_rows: Iterable[int],
    buffer_chunks: Iterable[int] | None = None,
    buffer_rows: Iterable[int] | None = None,
    batch_size: int,
    row_bytes: int = 0,
    seed: int = 0,
    epochs: Sequence[int] = (0,),
    values: np.ndarray | None = None,
) -> list[dict]:
    """One record per (chunk length, buffer size) with the mean over ``epochs`` of ``chunk_diversity``,
    ``order_correlation`` (and ``batch_mean_spread`` when ``values`` is given), plus ``memory_bytes``.

    Give the buffer either in chunks (``buffer_chunks``) or in rows (``buffer_rows``, rounded down to whole
    chunks, at least one).
    """
    if (buffer_chunks is None) == (buffer_rows is None):
        raise ValueError("give exactly one of buffer_chunks or buffer_rows")
    records = []
    for c in chunk_rows:
        c = int(c)
        sizes = (
            [int(k) for k in buffer_chunks] if buffer_chunks is not None else [max(1, int(r) // c) for r in buffer_rows]
        )
        for k in sizes:
            div, corr, spread = [], [], []
            for e in epochs:
                b = simulate_batches(rows, c, batch_size=batch_size, buffer_chunks=k, seed=seed, epoch=e)
                div.append(chunk_diversity(b, rows, c))
                corr.append(order_correlation(b))
                if values is not None:
                    spread.append(batch_mean_spread(b, values))
            rec = {
                "chunk_rows": c,
                "buffer_chunks": k,
                "buffer_rows": k * c,
                "chunk_diversity": float(np.mean(div)),
                "order_correlation": float(np.mean(corr)),
                "memory_bytes": buffer_memory_bytes(c, row_bytes, buffer_chunks=k),
            }
            if values is not None:
                rec["batch_mean_spread"] = float(np.mean(spread))
            records.append(rec)
    return records
