"""How well a stream of batches is shuffled, measured on row numbers alone.

Two numbers, both computable from :meth:`ZarrIterableDataset.batch_row_ids` without reading data:

- ``chunk_diversity``: the mean number of distinct chunks a batch draws from, divided by what a
  perfect shuffle (rows drawn uniformly from the whole epoch) would give. 1 is perfect; ``1/E`` means
  every batch comes from a single chunk.
- ``order_correlation``: the rank correlation between a row's position in the stream and its row
  number. 1 for an unshuffled stream, about 0 for a perfect shuffle. It sees drift: a stream that walks
  through the data in time order, whatever happens inside a batch, scores high.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zarrtorch._util.sizes import ceil_div


def expected_distinct_chunks(rows: int, chunk_rows: int, batch_size: int) -> float:
    """Mean number of distinct chunks hit by ``batch_size`` rows drawn without replacement from ``rows``."""
    lengths = np.full(ceil_div(rows, chunk_rows), chunk_rows, dtype=np.float64)
    lengths[-1] = rows - chunk_rows * (len(lengths) - 1)
    i = np.arange(batch_size, dtype=np.float64)
    # P(a chunk of length L is missed) = prod_i (rows - L - i) / (rows - i)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.clip((rows - lengths[:, None] - i[None, :]) / (rows - i[None, :]), 0.0, 1.0)
    return float(np.sum(1.0 - np.prod(ratios, axis=1)))


def chunk_diversity(batches: list[np.ndarray], rows: int, chunk_rows: int) -> float:
    """Mean distinct chunks per batch relative to a perfect shuffle (1.0 = as good as perfect)."""
    full = [b for b in batches if len(b) == len(batches[0])]
    distinct = np.mean([len(np.unique(np.asarray(b) // chunk_rows)) for b in full])
    return float(distinct / expected_distinct_chunks(rows, chunk_rows, len(full[0])))


def order_correlation(batches: list[np.ndarray]) -> float:
    """Spearman correlation of stream position with row number (1 = in order, ~0 = shuffled)."""
    stream = np.concatenate([np.asarray(b) for b in batches])
    if len(stream) < 2:
        return float("nan")
    ranks = np.empty(len(stream), dtype=np.float64)
    ranks[np.argsort(stream, kind="stable")] = np.arange(len(stream))
    return float(np.corrcoef(np.arange(len(stream), dtype=np.float64), ranks)[0, 1])


@dataclass(frozen=True)
class ShuffleQuality:
    chunk_diversity: float
    order_correlation: float


def shuffle_quality(batches: list[np.ndarray], rows: int, chunk_rows: int) -> ShuffleQuality:
    """Both measures for one epoch's batches (row numbers) of one rank."""
    return ShuffleQuality(chunk_diversity(batches, rows, chunk_rows), order_correlation(batches))


def perfect_shuffle_batches(rows: int, batch_size: int, seed: int = 0) -> list[np.ndarray]:
    """The reference point: one uniform permutation of all rows cut into batches."""
    perm = np.random.default_rng(seed).permutation(rows)
    return [perm[i : i + batch_size] for i in range(0, rows - batch_size + 1, batch_size)]
