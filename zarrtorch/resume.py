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

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from zarrtorch._util.sizes import ceil_div
from zarrtorch.buffer import rank_batches
from zarrtorch.plan import EpochSpec, RankPlan, Segment, Topology, chunk_order, chunk_runs


def batches_of(spec: EpochSpec, plan: RankPlan) -> list[np.ndarray]:
    """Row ids (counted in the row window) of every batch ``plan``'s rank yields, in order."""
    return rank_batches(
        plan, seed=spec.seed, chunk_rows=spec.chunk_rows, buffer_chunks=spec.buffer_chunks, row_shuffle=spec.row_shuffle
    )


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
def remaining_runs(spec: EpochSpec, epoch: int, history: tuple[Segment, ...]) -> np.ndarray:
    """The stream of the segment of ``epoch`` after ``history``: rows not consumed in any earlier segment."""
    order = chunk_order(ceil_div(spec.rows, spec.chunk_rows), seed=spec.seed, epoch=epoch, shuffle=spec.shuffle)
    runs = chunk_runs(order, spec.rows, spec.chunk_rows)
    for segment, past in enumerate(history):
        consumed = np.zeros(spec.rows, dtype=bool)
        for rank in range(past.world_size):
            plan = spec.plan(epoch, Topology(rank, past.world_size, past.num_workers), runs=runs, segment=segment)
            if past.batches > plan.batches:
                raise ValueError(
                    f"the saved state says {past.batches} batches were yielded on {past.world_size} rank(s) x "
                    f"{past.num_workers} worker(s), but that epoch had only {plan.batches} per rank: the state "
                    "does not belong to this data or these settings"
                )
            for batch in batches_of(spec, plan)[: past.batches]:
                consumed[batch] = True
        runs = drop_rows(runs, consumed)
    runs.flags.writeable = False  # shared by the cache
    return runs


def resumed_plan(spec: EpochSpec, epoch: int, history: tuple[Segment, ...], topology: Topology) -> RankPlan:
    """The plan of ``topology``'s rank for what is left of ``epoch`` after ``history`` (the plain plan if
    there is none)."""
    history = tuple(Segment(*seg) for seg in history)
    if not history:
        return spec.plan(epoch, topology)
    if spec.freeze_partition:
        raise ValueError(
            "keep_in_memory=True freezes the partition on one topology: it cannot continue an epoch "
            "on another; resume on the saved topology or start the epoch afresh"
        )
    return spec.plan(epoch, topology, runs=remaining_runs(spec, epoch, history), segment=len(history))


# -- what state_dict saves --------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoaderCheckpoint:
    """Where one rank's loader is in its epoch, and the set-up that position is only valid for."""

    epoch: int
    batches_seen: int
    rank: int
    world_size: int
    num_workers: int
    batch_size: int
    drop_last: bool
    seed: int
    shuffle: bool
    buffer_chunks: int
    row_offset: int
    rows: int
    chunk_rows: int
    keep_in_memory: bool
    plan_version: int
    fingerprint: str  # zarrtorch.plan.plan_fingerprint of the set-up: equal exactly when the batches are
    history: tuple[tuple[int, int, int], ...] = ()  # (world_size, num_workers, batches) of earlier segments

    # where the rank is and on which topology; every other field must match to resume
    POSITION = ("epoch", "batches_seen", "rank", "world_size", "num_workers", "history")

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["history"] = [list(seg) for seg in self.history]
        return out

    @classmethod
    def from_dict(cls, state: dict) -> LoaderCheckpoint:
        if not isinstance(state, dict):
            raise TypeError(f"a ZarrDataLoader state is a dict (from state_dict()), got {type(state).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in state]
        if missing and set(missing) <= {"plan_version", "fingerprint"}:
            raise ValueError(
                "this loader state was saved by a zarrtorch whose plan (plan version 1) gives other batches than "
                "this one's: the position cannot be carried over. Start the epoch afresh with "
                "loader.set_epoch(epoch) (Lightning: resume the weights only, or start the next epoch)"
            )
        if missing:
            raise ValueError(
                f"not a ZarrDataLoader state: keys {missing} are missing (saved by "
                "ZarrDataLoader.state_dict() of zarrtorch >= 0.1?)"
            )
        values = {n: state[n] for n in names}
        values["history"] = tuple(tuple(int(v) for v in seg) for seg in values["history"])
        return cls(**values)

    @property
    def segments(self) -> tuple[Segment, ...]:
        return tuple(Segment(*seg) for seg in self.history)

    @property
    def segment_batches(self) -> int:
        """Batches yielded on the saved topology (``batches_seen`` counts the earlier segments too)."""
        return self.batches_seen - sum(seg.batches for seg in self.segments)

    def setup_differences(self, other: LoaderCheckpoint) -> list[str]:
        """``"field: saved X, now Y"`` for every set-up field that differs."""
        out = []
        for f in dataclasses.fields(self):
            if f.name not in self.POSITION and getattr(self, f.name) != getattr(other, f.name):
                out.append(f"{f.name}: saved {getattr(self, f.name)!r}, now {getattr(other, f.name)!r}")
        if out == [f"fingerprint: saved {self.fingerprint!r}, now {other.fingerprint!r}"]:
            out = [
                f"fingerprint: saved {self.fingerprint!r}, now {other.fingerprint!r} with the same settings: the "
                "state was saved by another zarrtorch or NumPy whose plan or random numbers differ"
            ]
        return out
