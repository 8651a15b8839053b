"""Continue an epoch on another topology: the rows not yet consumed, re-partitioned over the new ranks.

An interrupted epoch is described by its *history*: the topologies it ran on, each with the number of
batches every rank had yielded there (:class:`Segment`). Which rows those batches held is a pure function
of the epoch and the history (the same plan and buffer schedule the workers ran, simulated on row ids), so
no process reads data or talks to another to know it. The rows not yet consumed, kept in the epoch's
stream order, form the stream of the next segment, which :func:`zarrtorch.plan.epoch_plan` splits over the
new ranks and workers like any epoch: every rank gets the same number of batches.

Cost: one byte per row of the store (the consumed mask) while a resumed plan is computed, once per process
(the result is cached); a checkpoint stores only three integers per interruption.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from zarrtorch.buffer import rank_batches
from zarrtorch.plan import RankPlan, chunk_order, chunk_runs, epoch_plan
from zarrtorch.sizes import ceil_div


@dataclass(frozen=True)
class Segment:
    """Part of an epoch run on one topology: every rank yielded ``batches`` batches there."""

    world_size: int
    num_workers: int
    batches: int


@dataclass(frozen=True)
class EpochSpec:
    """What fixes an epoch's rows and their order, whatever the topology (rows counted in the row window)."""

    rows: int
    chunk_rows: int
    seed: int
    epoch: int
    batch_size: int
    drop_last: bool
    shuffle: bool = True
    buffer_chunks: int = 8

    @property
    def row_shuffle(self) -> bool:
        return self.shuffle and self.buffer_chunks > 0

    def plan(self, runs: np.ndarray, segment: int, *, world_size: int, rank: int, num_workers: int) -> RankPlan:
        return epoch_plan(
            self.rows, self.chunk_rows, seed=self.seed, epoch=self.epoch, batch_size=self.batch_size,
            drop_last=self.drop_last, world_size=world_size, rank=rank, num_workers=num_workers,
            shuffle=self.shuffle, runs=runs, segment=segment,
        )  # fmt: skip

    def batches(self, plan: RankPlan) -> list[np.ndarray]:
        """Row ids of every batch ``plan``'s rank yields, in order."""
        return rank_batches(
            plan, seed=self.seed, chunk_rows=self.chunk_rows, buffer_chunks=self.buffer_chunks,
            row_shuffle=self.row_shuffle,
        )  # fmt: skip


def drop_rows(runs: np.ndarray, consumed: np.ndarray) -> np.ndarray:
    """``runs`` (row ranges in stream order) without the rows marked in ``consumed``, order kept."""
    out = []
    for lo, hi in runs.tolist():
        keep = ~consumed[lo:hi]
        if keep.all():
            out.append((lo, hi))
        elif keep.any():
            edges = np.diff(np.concatenate([[0], keep.view(np.int8), [0]]))
            starts, stops = lo + np.nonzero(edges == 1)[0], lo + np.nonzero(edges == -1)[0]
            out.extend(zip(starts.tolist(), stops.tolist(), strict=True))
    return np.asarray(out, dtype=np.int64).reshape(-1, 2)


@lru_cache(maxsize=8)
def remaining_runs(spec: EpochSpec, history: tuple[Segment, ...]) -> np.ndarray:
    """The stream of the segment after ``history``: rows not consumed in any earlier segment."""
    runs = chunk_runs(chunk_order(ceil_div(spec.rows, spec.chunk_rows), seed=spec.seed, epoch=spec.epoch,
                                  shuffle=spec.shuffle), spec.rows, spec.chunk_rows)  # fmt: skip
    for segment, past in enumerate(history):
        consumed = np.zeros(spec.rows, dtype=bool)
        for rank in range(past.world_size):
            plan = spec.plan(runs, segment, world_size=past.world_size, rank=rank, num_workers=past.num_workers)
            if past.batches > plan.batches:
                raise ValueError(
                    f"the saved state says {past.batches} batches were yielded on {past.world_size} rank(s) x "
                    f"{past.num_workers} worker(s), but that epoch had only {plan.batches} per rank: the state "
                    "does not belong to this data or these settings"
                )
            for batch in spec.batches(plan)[: past.batches]:
                consumed[batch] = True
        runs = drop_rows(runs, consumed)
    runs.flags.writeable = False  # shared by the cache
    return runs


def resumed_plan(
    spec: EpochSpec, history: tuple[Segment, ...], *, world_size: int, rank: int, num_workers: int
) -> RankPlan:
    """The plan of ``rank`` for what is left of the epoch after ``history`` (an ordinary plan if empty)."""
    if not history:
        return spec.plan(None, 0, world_size=world_size, rank=rank, num_workers=num_workers)
    runs = remaining_runs(spec, tuple(history))
    return spec.plan(runs, len(history), world_size=world_size, rank=rank, num_workers=num_workers)
