"""The partitioning algorithm: which rows each DDP rank and DataLoader worker reads in an epoch.

Pure NumPy and no I/O: every process evaluates the same function with the same arguments and gets a
bit-identical answer, so no process ever has to tell another what it reads.

1. **Chunk order.** A permutation of the chunks keyed by ``(seed, epoch)``: new every epoch, the same
   in every process, and computed one position at a time (:mod:`zarrtorch.order`), so a rank evaluates
   only the stretch of it that it reads. The chunks end to end in that order are the epoch's *stream*.
2. **Row budget per rank.** Training (``drop_last=True``): every rank gets ``rows // (world*batch)``
   whole batches; the stream's tail is left out: fewer than ``world*batch`` rows, and other rows every
   epoch since the chunk order changes. Evaluation (``drop_last=False``): every row is read; the stream is
   padded by repeating its first ``padding`` rows (< world size) so that every rank has
   ``ceil(rows/world)`` rows and the same number of batches (the last one may be partial).
3. **Contiguous slices.** Rank ``r`` takes the ``r``-th slice of the stream, so it reads whole chunks
   except at most one at each end. Inside a rank, the batches are split into contiguous runs, one per
   DataLoader worker (higher workers take one more when they do not divide evenly, so that the partial
   batch comes last), and the DataLoader collects them round-robin.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from functools import lru_cache, partial
from typing import NamedTuple

import numpy as np
from numpy.random import SeedSequence, default_rng  # numpy loads its random module lazily

from zarrtorch._util.random_streams import CACHED_PIECES, PLACED_PIECES, SHUFFLE_BUFFER
from zarrtorch._util.sizes import ceil_div
from zarrtorch.order import ChunkOrder

# raise whenever the same inputs would give other batches (a checkpoint then is refused); 4: window blocks counted
# in chunks (Windows.block_rows), so the same windows over the same store give other blocks
PLAN_VERSION = 4


def shuffles_rows(shuffle: bool, buffer_chunks: int) -> bool:
    """Whether rows go through the shuffle buffer: ``shuffle``, and a buffer of at least one chunk."""
    return bool(shuffle) and int(buffer_chunks) > 0


@dataclass(frozen=True)
class Topology:
    """Where one loader runs: rank ``rank`` of ``world_size`` ranks, with ``num_workers`` DataLoader workers."""

    rank: int = 0
    world_size: int = 1
    num_workers: int = 0


@dataclass(frozen=True)
class EpochSpec:
    """What fixes every epoch's batches, whatever the epoch and the rank: made once per loader (its dataset's
    rows and shuffle, its batch size and ``drop_last``) and handed down to its workers as it is. Its
    :meth:`fingerprint` goes into checkpoints and is compared between ranks."""

    rows: int  # of the row window read (``row_range``), counted from ``row_offset``
    chunk_rows: int
    batch_size: int
    drop_last: bool
    seed: int = 0
    shuffle: bool = True
    buffer_chunks: int = 8
    freeze_partition: bool = False  # keep_in_memory: epoch 0's chunk-to-rank assignment in every epoch
    row_offset: int = 0  # the row window's first row in the store
    windows: str = ""  # samples are windows of time steps (zarrtorch.windows): their settings; rows are window ids
    redeal_every: int = 0  # K >= 1: each rank's share dealt every K epochs (placed_stream); 0: every epoch

    @property
    def row_shuffle(self) -> bool:
        return shuffles_rows(self.shuffle, self.buffer_chunks)

    @property
    def buffer_rows(self) -> int:
        return self.buffer_chunks * self.chunk_rows

    def fingerprint(self) -> str:
        inputs = {f.name: getattr(self, f.name) for f in fields(self)}
        if not self.windows:  # rows as samples: the fingerprint of plans from before windows, for the same version
            del inputs["windows"]
        if not self.redeal_every:  # shares dealt every epoch: the fingerprint of plans from before placement
            del inputs["redeal_every"]
        return plan_fingerprint(**inputs)

    def stream(self, epoch: int, world_size: int):
        """The stream of ``epoch`` whose first segment runs on ``world_size`` ranks: the chunks in the epoch's
        order, or (``redeal_every``) the shares placed on the ranks (:func:`placed_stream`)."""
        if self.redeal_every:
            return placed_stream(self, epoch, world_size)
        dealt = 0 if self.freeze_partition else epoch
        return epoch_stream(self.rows, self.chunk_rows, seed=self.seed, epoch=dealt, shuffle=self.shuffle)

    def plan(self, epoch: int, topology: Topology, *, stream=None, segment: int = 0) -> RankPlan:
        """:func:`epoch_plan` of this spec for ``epoch`` on ``topology`` (``stream``/``segment``: see there).
        A whole epoch's plan is computed once per process and kept (the last few)."""
        if stream is None and not segment:
            return _cached_plan(self, int(epoch), topology)
        return epoch_plan(
            self.rows,
            self.chunk_rows,
            seed=self.seed,
            epoch=epoch,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            world_size=topology.world_size,
            rank=topology.rank,
            num_workers=topology.num_workers,
            shuffle=self.shuffle,
            freeze_partition=self.freeze_partition,
            stream=stream,
            segment=segment,
        )


@lru_cache(maxsize=8)
def _cached_plan(spec: EpochSpec, epoch: int, topology: Topology) -> RankPlan:
    return spec.plan(epoch, topology, stream=spec.stream(epoch, topology.world_size))


def plan_fingerprint(**inputs) -> str:
    """A short digest of what fixes every epoch's batches: the plan's inputs (passed by name), the algorithm's
    version, and a sample of the chunk order and of NumPy's generator output (a NumPy whose seeding or
    generator draws other numbers would give other plans from the same inputs). Equal on every rank of one
    job, and in a checkpoint and the run that resumes it, exactly when they compute the same batches."""
    seed = int(inputs.get("seed", 0))
    drawn = rng_for(seed, 0, SHUFFLE_BUFFER, 0, 0).choice(1000, 16, replace=False)
    probe = np.concatenate([ChunkOrder(257, seed=seed, epoch=0).to_array(), drawn])
    text = repr((PLAN_VERSION, sorted(inputs.items()), probe.astype(np.int64).tolist()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def rng_for(seed: int, epoch: int, *stream: int) -> np.random.Generator:
    """A generator that depends only on (seed, epoch, stream...): identical in every process."""
    return default_rng(SeedSequence([int(seed), int(epoch), *map(int, stream)]))


def chunk_order(n_chunks: int, *, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The epoch's whole chunk order (a permutation of ``range(n_chunks)``); the plan itself only ever
    evaluates the positions a rank reads (:class:`zarrtorch.order.ChunkOrder`)."""
    return ChunkOrder(n_chunks, seed=seed, epoch=epoch, shuffle=shuffle).to_array()


class Segment(NamedTuple):
    """Part of an epoch run on one topology (:mod:`zarrtorch.resume`): every rank yielded ``batches`` there."""

    world_size: int
    num_workers: int
    batches: int


@dataclass(frozen=True)
class RowBudget:
    """How many rows and batches every rank gets; identical on all ranks by construction."""

    rows_per_rank: int
    batches_per_rank: int
    last_batch_size: int
    dropped_rows: int  # rows left out of the epoch (drop_last=True), < world_size * batch_size
    padding_rows: int  # rows read twice to even out ranks (drop_last=False), < world_size


def row_budget(rows: int, *, world_size: int, batch_size: int, drop_last: bool) -> RowBudget:
    """Rows and batches per rank; raises (identically on every rank) when a rank would get no batch."""
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if rows < 1:
        raise ValueError("there are no rows to distribute")
    if drop_last:
        batches = rows // (world_size * batch_size)
        if batches == 0:
            raise ValueError(
                f"{rows} rows cannot give every one of {world_size} rank(s) a full batch of {batch_size} "
                f"(needs {world_size * batch_size} rows with drop_last=True): use a smaller batch_size, "
                "fewer ranks, or drop_last=False"
            )
        per_rank = batches * batch_size
        return RowBudget(per_rank, batches, batch_size, rows - world_size * per_rank, 0)
    per_rank = ceil_div(rows, world_size)
    batches = ceil_div(per_rank, batch_size)
    return RowBudget(per_rank, batches, per_rank - (batches - 1) * batch_size, 0, world_size * per_rank - rows)


def stream_budget(stream_rows: int, *, world_size: int, batch_size: int, drop_last: bool, segment: int) -> RowBudget:
    """:func:`row_budget` of a stream; the rest of a resumed epoch (``segment >= 1``) that cannot give every
    rank a batch gives every rank none instead of refusing."""
    if segment and stream_rows < (world_size * batch_size if drop_last else 1):
        return RowBudget(0, 0, 0, stream_rows, 0)
    return row_budget(stream_rows, world_size=world_size, batch_size=batch_size, drop_last=drop_last)


def worker_spans(budget: RowBudget, batch_size: int, num_workers: int) -> list[tuple[int, int, int, np.ndarray]]:
    """Per worker of any rank: (first, stop) positions in the rank's slice, its first batch's index among
    the rank's, and its batch sizes (the partial batch, if any, is the last worker's last)."""
    out = []
    for b0, b1 in worker_batch_ranges(budget.batches_per_rank, num_workers):
        sizes = np.full(b1 - b0, batch_size, dtype=np.int64)
        if b1 == budget.batches_per_rank and b1 > b0:
            sizes[-1] = budget.last_batch_size
        out.append((b0 * batch_size, min(b1 * batch_size, budget.rows_per_rank), b0, sizes))
    return out


def worker_batch_ranges(n_batches: int, num_workers: int) -> list[tuple[int, int]]:
    """Split a rank's batches into contiguous runs, one per worker; higher workers take the extra ones.
    The DataLoader's round-robin then yields the last worker's last batch last, so a partial batch (the
    stream's end, drop_last=False) is the rank's last batch, as with any DataLoader."""
    streams = max(1, num_workers)
    base, extra = divmod(n_batches, streams)
    bounds = np.cumsum([0] + [base + (w >= streams - extra) for w in range(streams)])
    return [(int(bounds[w]), int(bounds[w + 1])) for w in range(streams)]


def round_robin_order(counts: list[int]) -> np.ndarray:
    """The worker index of each batch in the order a DataLoader yields them: one batch from each worker
    still holding some, worker 0 first, round after round."""
    counts = np.asarray(counts, dtype=np.int64)
    rounds = int(counts.max(initial=0))
    grid = np.arange(rounds)[:, None] < counts[None, :]  # [round, worker] -> worker has a batch this round
    return np.nonzero(grid)[1]


def batches_consumed_per_worker(counts: list[int], consumed: int) -> list[int]:
    """How many batches each worker had produced when the loader had yielded ``consumed`` batches."""
    order = round_robin_order(counts)[:consumed]
    return np.bincount(order, minlength=len(counts)).astype(int).tolist()


def resume_roles(counts: list[int], skip: int) -> list[tuple[int, int]]:
    """For each DataLoader worker resuming after ``skip`` batches: (the plan's worker it plays, batches
    of that worker to skip). The resumed DataLoader asks worker 0 first again, so mid-round worker ``w``
    plays worker ``w + rotate``, the one whose batch came next in the uninterrupted run."""
    order = round_robin_order(counts)
    streams = len(counts)
    rotate = int(order[skip - 1] + 1) % streams if skip else 0
    roles = [(w + rotate) % streams for w in range(streams)]
    return [(role, int(np.sum(order[:skip] == role))) for role in roles]


# -- the stream: an epoch's rows in order, of which a rank asks for one stretch ------------------------------
class ChunkStream:
    """The chunks laid end to end in a :class:`ChunkOrder`: the rows at positions ``[start, stop)`` from
    arithmetic on the chunks those positions cover. Every chunk holds ``chunk_rows`` rows except the
    store's last one, which may be short; where that one lies in the stream is the order's inverse."""

    def __init__(self, rows: int, chunk_rows: int, order: ChunkOrder):
        self.length, self.chunk_rows, self.order = int(rows), int(chunk_rows), order
        n = len(order)
        self._short = rows - (n - 1) * chunk_rows if n else chunk_rows  # rows of the store's last chunk
        self._short_at = int(order.position_of(n - 1)) if n and self._short < chunk_rows else n

    def _first_row(self, i: int) -> int:
        """Stream position of the first row of the ``i``-th chunk in the order."""
        return i * self.chunk_rows - (self.chunk_rows - self._short) * (i > self._short_at)

    def _index(self, p: int) -> int:
        """Index (in the order) of the chunk holding stream position ``p``."""
        L = self.chunk_rows
        return p // L if p < self._short_at * L + self._short else (p + L - self._short) // L

    def pieces(self, start: int, stop: int) -> np.ndarray:
        """Rows at stream positions ``[start, stop)`` (``0 <= start <= stop <= length``) as ``(k, 2)`` row ranges."""
        if start >= stop:
            return np.zeros((0, 2), dtype=np.int64)
        first, last = self._index(start), self._index(stop - 1)
        lo = self.order[np.arange(first, last + 1, dtype=np.int64)] * self.chunk_rows
        out = np.stack([lo, np.minimum(lo + self.chunk_rows, self.length)], axis=1)
        out[0, 0] += start - self._first_row(first)
        out[-1, 1] = lo[-1] + stop - self._first_row(last)
        return out


class RunStream:
    """A stream given as row ranges in order (``(m, 2)``); positions found by binary search."""

    def __init__(self, runs: np.ndarray):
        self.runs = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
        lengths = self.runs[:, 1] - self.runs[:, 0]
        self._ends = np.cumsum(lengths)
        self._begins = self._ends - lengths
        self.length = int(self._ends[-1]) if len(lengths) else 0

    def pieces(self, start: int, stop: int) -> np.ndarray:
        """Rows at positions ``[start, stop)`` (``0 <= start <= stop <= length``) as ``(k, 2)`` row ranges."""
        if start >= stop:
            return np.zeros((0, 2), dtype=np.int64)
        sel = slice(int(np.searchsorted(self._ends, start, side="right")), int(np.searchsorted(self._begins, stop)))
        begins, runs = self._begins[sel], self.runs[sel]
        lo = np.maximum(begins, start) - begins + runs[:, 0]
        hi = np.minimum(self._ends[sel], stop) - begins + runs[:, 0]
        return np.stack([lo, hi], axis=1)


def stream_slice(stream, start: int, stop: int) -> np.ndarray:
    """Stream positions ``[start, stop)`` as ``(k, 2)`` row ranges; positions past the stream's length wrap
    around to its start (evaluation padding)."""
    total, pieces = stream.length, []
    while start < stop:
        end = min(stop, (start // total + 1) * total)  # stay within one pass over the stream
        base = (start // total) * total
        pieces.append(stream.pieces(start - base, end - base))
        start = end
    if not pieces:
        return np.zeros((0, 2), dtype=np.int64)
    return np.concatenate(pieces).astype(np.int64)


def epoch_stream(rows: int, chunk_rows: int, *, seed: int, epoch: int, shuffle: bool = True) -> ChunkStream:
    """An epoch's stream: the store's chunks in the epoch's order."""
    return ChunkStream(
        rows, chunk_rows, ChunkOrder(ceil_div(rows, chunk_rows), seed=seed, epoch=epoch, shuffle=shuffle)
    )


def placed_stream(spec: EpochSpec, epoch: int, world_size: int) -> RunStream:
    """The stream of ``epoch`` with each rank's share kept for ``spec.redeal_every`` epochs (a node then reads from
    its chunk cache what it fetched before, :mod:`zarrtorch._read.cache`): the rank slices of the stream of the
    epoch the shares were last dealt at (every ``redeal_every``-th), the pieces of each slice in an order drawn for
    this epoch and rank. The slices are the plain plan's (the row budget of ``world_size`` ranks), so every rank
    keeps its batches, every row is read once, and the rows a ``drop_last`` epoch leaves out are the same ones until
    the next deal. A resume on another topology takes what is left of this stream (:mod:`zarrtorch.resume`).
    Costs the whole epoch's pieces in every process (not only the rank's stretch, as the plain plan does)."""
    dealt = epoch - epoch % spec.redeal_every
    base = epoch_stream(spec.rows, spec.chunk_rows, seed=spec.seed, epoch=dealt, shuffle=spec.shuffle)
    per_rank = row_budget(
        base.length, world_size=world_size, batch_size=spec.batch_size, drop_last=spec.drop_last
    ).rows_per_rank
    parts = []
    for rank in range(world_size):
        pieces = base.pieces(min(rank * per_rank, base.length), min((rank + 1) * per_rank, base.length))
        if spec.shuffle and len(pieces):
            pieces = pieces[rng_for(spec.seed, epoch, PLACED_PIECES, rank).permutation(len(pieces))]
        parts.append(pieces)
    parts.append(base.pieces(min(world_size * per_rank, base.length), base.length))  # left out (drop_last)
    return RunStream(np.concatenate(parts))


def stretch(stream, start: int, stop: int, shuffle_key: tuple[int, ...] | None = None) -> np.ndarray:
    """Stream positions ``[start, stop)`` as row ranges; with ``shuffle_key``, the ranges in an order drawn
    from it (the cached mode's pieces)."""
    pieces = stream_slice(stream, start, stop)
    if shuffle_key is not None and len(pieces):
        pieces = pieces[rng_for(*shuffle_key).permutation(len(pieces))]
    return pieces


@dataclass(frozen=True)
class WorkerPlan:
    """One worker's share of a rank's epoch: the row ranges it reads, in order, and its batch sizes. The
    ranges are computed when first asked for: a process that only counts batches never computes them."""

    worker: int
    first_batch: int  # index of its first batch among the rank's batches
    batch_sizes: np.ndarray = field(repr=False)
    source: partial = field(repr=False, compare=False)  # computes the pieces

    @property
    def pieces(self) -> np.ndarray:
        """``(k, 2)`` [start, stop) global rows, in the order read."""
        return computed_once(self, "_pieces", self.source)

    @property
    def rows(self) -> int:
        return int(self.batch_sizes.sum())


@dataclass(frozen=True)
class RankPlan:
    """Everything one rank reads in one epoch, split by DataLoader worker."""

    epoch: int
    rank: int
    world_size: int
    batch_size: int
    budget: RowBudget
    workers: list[WorkerPlan]
    segment: int = 0  # 0: a whole epoch; k: the k-th resumption of it on another topology
    padded: partial = field(default=partial(np.zeros, (0, 2), np.int64), repr=False, compare=False)

    @property
    def batches(self) -> int:
        return self.budget.batches_per_rank

    @property
    def padding(self) -> np.ndarray:
        """Rows read again by this rank only to even out the ranks (drop_last=False): never rows it also
        reads once otherwise."""
        return computed_once(self, "_padding", self._padding_rows)

    def _padding_rows(self) -> np.ndarray:
        return np.concatenate([np.arange(a, b) for a, b in self.padded().tolist()] or [np.zeros(0, np.int64)])


def computed_once(plan, name: str, compute) -> np.ndarray:
    """``compute()`` kept on ``plan`` (a frozen dataclass) as ``name`` after the first call. Not
    ``functools.cached_property``: on Python 3.11 it holds one lock per class while it computes, and a process
    forked meanwhile (a DataLoader worker started while another thread plans) inherits it held by a thread it
    does not have. Two threads may both compute: the plan is a pure function, so either answer is the same."""
    found = plan.__dict__.get(name)
    if found is None:
        found = compute()
        object.__setattr__(plan, name, found)
    return found


def epoch_plan(
    rows: int,
    chunk_rows: int,
    *,
    seed: int,
    epoch: int,
    batch_size: int,
    drop_last: bool,
    world_size: int = 1,
    rank: int = 0,
    num_workers: int = 0,
    shuffle: bool = True,
    freeze_partition: bool = False,
    stream=None,
    segment: int = 0,
) -> RankPlan:
    """The plan of ``rank`` for ``epoch``: a pure function of its arguments.

    ``freeze_partition`` (the cached mode) keeps epoch 0's chunk-to-rank assignment in every epoch, so a
    process can keep the rows it read in memory; the order of its pieces still changes every epoch.
    ``stream`` replaces the epoch's stream (default: the chunks in the epoch's order), e.g. by the rows not
    yet consumed when an epoch resumes on another topology (:mod:`zarrtorch.resume`); such a remainder may
    be too short for a batch per rank, and then every rank gets none. Only the stretches of the stream
    this rank reads are computed: the cost is what the rank reads, whatever the store's size or the ranks.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if stream is None:
        stream = epoch_stream(rows, chunk_rows, seed=seed, epoch=0 if freeze_partition else epoch, shuffle=shuffle)
    budget = stream_budget(
        stream.length, world_size=world_size, batch_size=batch_size, drop_last=drop_last, segment=segment
    )
    stream_rows = stream.length
    rank_start = rank * budget.rows_per_rank
    workers = []
    for w, (start, stop, first, sizes) in enumerate(worker_spans(budget, batch_size, num_workers)):
        key = (seed, epoch, CACHED_PIECES, rank, w) if freeze_partition and shuffle else None
        source = partial(stretch, stream, rank_start + start, rank_start + stop, key)
        workers.append(WorkerPlan(worker=w, first_batch=first, batch_sizes=sizes, source=source))
    rank_stop = rank_start + budget.rows_per_rank
    padded = partial(stretch, stream, max(rank_start, stream_rows), max(rank_stop, stream_rows))
    return RankPlan(
        epoch=epoch,
        rank=rank,
        world_size=world_size,
        batch_size=batch_size,
        budget=budget,
        workers=workers,
        segment=segment,
        padded=padded,
    )
