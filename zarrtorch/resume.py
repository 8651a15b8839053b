"""Continue an epoch on another topology: the rows not yet consumed, re-partitioned over the new ranks.

An interrupted epoch is described by its *history*: the topologies it ran on, each with the number of
batches every rank had yielded there (:class:`Segment`). Which rows those batches held is a pure function
of the epoch and the history (the same plan and buffer schedule the workers ran, simulated on row ids), so
no process reads data or talks to another to know it. The rows not yet consumed, kept in the epoch's
stream order, form the stream of the next segment (:class:`RemainderStream`), which
:func:`zarrtorch.plan.epoch_plan` splits over the new ranks and workers like any epoch: every rank gets
the same number of batches.

Cost: what the resuming rank reads. How many rows each saved worker left is arithmetic (its batch count
and batch sizes); which rows, only for the saved workers whose leftovers this rank takes, by running
that worker's buffer schedule up to where it stopped. A checkpoint stores three integers per interruption.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from zarrtorch.buffer import buffer_rng, consumed_after, rank_batches
from zarrtorch.plan import (
    EpochSpec,
    RankPlan,
    RunStream,
    Segment,
    Topology,
    batches_consumed_per_worker,
    stream_budget,
    stream_slice,
    worker_spans,
)


def batches_of(spec: EpochSpec, plan: RankPlan) -> list[np.ndarray]:
    """Row ids (counted in the row window) of every batch ``plan``'s rank yields, in order."""
    return rank_batches(
        plan, seed=spec.seed, chunk_rows=spec.chunk_rows, buffer_chunks=spec.buffer_chunks, row_shuffle=spec.row_shuffle
    )


def rows_to_runs(rows: np.ndarray, chunk_rows: int) -> np.ndarray:
    """Row ids in order as ``(k, 2)`` half-open ranges of consecutive ids, each inside one chunk of
    ``chunk_rows``: a piece is read from one chunk (:mod:`zarrtorch._read.reader`), and leftovers of two chunks
    that follow each other in the stream can be consecutive ids across their boundary."""
    if not len(rows):
        return np.zeros((0, 2), dtype=np.int64)
    breaks = np.nonzero((np.diff(rows) != 1) | (rows[1:] % chunk_rows == 0))[0] + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [len(rows)]])
    return np.stack([rows[starts], rows[stops - 1] + 1], axis=1).astype(np.int64)


def expand(pieces: np.ndarray) -> np.ndarray:
    """The row ids of ``(k, 2)`` ranges, in order."""
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in pieces.tolist()] or [np.zeros(0, np.int64)])


class RemainderStream:
    """The rows of ``parent`` (a stream) that no rank consumed in one segment of ``epoch``: ``past`` (its
    topology and batches per rank), the ``segment``-th of the epoch. Kept in stream order, saved worker after
    saved worker (the stream's order); the rows left out of that segment (``drop_last``) come last.

    A row read twice in that segment (its own rank's copy and another rank's padding) counts as consumed when its
    own copy was yielded: a padding copy is flagged (``return_padding``) and left out of a metric, so a row whose
    only yielded copy was padding would never have counted. It may be yielded once more after the resume."""

    def __init__(self, spec: EpochSpec, epoch: int, parent, segment: int, past: Segment):
        self.spec, self.epoch, self.parent, self.segment, self.past = spec, epoch, parent, segment, past
        n, world, batch = parent.length, past.world_size, spec.batch_size
        budget = stream_budget(n, world_size=world, batch_size=batch, drop_last=spec.drop_last, segment=segment)
        if past.batches > budget.batches_per_rank:
            raise ValueError(
                f"the saved state says {past.batches} batches were yielded on {world} rank(s) x "
                f"{past.num_workers} worker(s), but that epoch had only {budget.batches_per_rank} per rank: the "
                "state does not belong to this data or these settings"
            )
        spans = worker_spans(budget, batch, past.num_workers)
        taken = batches_consumed_per_worker([len(sizes) for *_, sizes in spans], past.batches)
        self._workers = []  # (rank, worker, first position, stop position, batch sizes, batches consumed)
        for rank in range(world if budget.batches_per_rank else 0):
            base = rank * budget.rows_per_rank
            for w, (start, stop, _, sizes) in enumerate(spans):
                self._workers.append((rank, w, base + start, base + stop, sizes, taken[w]))
        pad = min(world * budget.rows_per_rank - n, n) if budget.batches_per_rank else 0
        self._pad = max(pad, 0)  # stream positions [0, pad) were also read past the end, as padding
        self._cache: dict[int, np.ndarray] = {}
        lengths = [self._length(i) for i in range(len(self._workers))]
        tail = n - world * budget.rows_per_rank if budget.batches_per_rank else n
        self._tail_start = n - max(tail, 0)
        self._ends = np.cumsum(lengths + [max(tail, 0)]).astype(np.int64)
        self.length = int(self._ends[-1]) if len(self._ends) else 0

    def _involved(self, i: int) -> bool:
        """Whether saved worker ``i`` holds rows that were also read as padding, or read padding."""
        _, _, start, stop, _, _ = self._workers[i]
        return start < self._pad or stop > self.parent.length

    def _length(self, i: int) -> int:
        _, _, start, stop, sizes, taken = self._workers[i]
        if self._involved(i):
            runs = self._rows_left(i)
            return int((runs[:, 1] - runs[:, 0]).sum())
        return stop - start - int(sizes[:taken].sum())

    def _simulated(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows saved worker ``i`` had read from its stream when it stopped (in stream order), and which of
        them it had yielded: its buffer schedule run on stream positions, up to its last batch."""
        rank, w, start, stop, sizes, taken = self._workers[i]
        spec = self.spec
        positions, read = consumed_after(
            np.array([[0, stop - start]], dtype=np.int64),
            sizes,
            taken,
            capacity=spec.buffer_rows,
            warmup_rows=spec.chunk_rows,
            rng=buffer_rng(spec.seed, self.epoch, rank, w, spec.row_shuffle, self.segment),
        )
        yielded = np.zeros(read, dtype=bool)
        yielded[positions] = True
        return expand(stream_slice(self.parent, start, start + read)), yielded

    def _rows_left(self, i: int) -> np.ndarray:
        """Saved worker ``i``'s leftovers as ``(k, 2)`` row ranges, in stream order (computed once)."""
        if i not in self._cache:
            _, _, start, stop, _, _ = self._workers[i]
            stop_in = min(stop, self.parent.length)  # positions past it were padding
            rows_read, yielded = self._simulated(i)
            inside = min(len(rows_read), stop_in - start)
            left = rows_read[:inside][~yielded[:inside]]
            rest = self.parent.pieces(start + len(rows_read), stop_in) if start + len(rows_read) < stop_in else None
            self._cache[i] = np.concatenate(
                [rows_to_runs(left, self.spec.chunk_rows)] + ([rest] if rest is not None else [])
            )
        return self._cache[i]

    def pieces(self, start: int, stop: int) -> np.ndarray:
        """Rows at positions ``[start, stop)`` of the remainder as ``(k, 2)`` row ranges."""
        out, begin = [], 0
        first = int(np.searchsorted(self._ends, start, side="right"))
        for i in range(first, len(self._ends)):
            begin = int(self._ends[i - 1]) if i else 0
            if begin >= stop:
                break
            a, b = max(start, begin) - begin, min(stop, int(self._ends[i])) - begin
            if i == len(self._workers):  # the rows no rank read in that segment
                out.append(self.parent.pieces(self._tail_start + a, self._tail_start + b))
            else:
                out.append(RunStream(self._rows_left(i)).pieces(a, b))
        return np.concatenate(out) if out else np.zeros((0, 2), dtype=np.int64)


@lru_cache(maxsize=8)
def remaining_stream(spec: EpochSpec, epoch: int, history: tuple[Segment, ...]):
    """The stream of the segment of ``epoch`` after ``history``: rows not consumed in any earlier segment."""
    stream = spec.stream(epoch, history[0].world_size) if history else spec.stream(epoch, 1)
    for segment, past in enumerate(history):
        stream = RemainderStream(spec, epoch, stream, segment, past)
    return stream


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
    return spec.plan(epoch, topology, stream=remaining_stream(spec, epoch, history), segment=len(history))


# -- what state_dict saves --------------------------------------------------------------------------------
SETTING_NAMES = {"freeze_partition": "keep_in_memory"}  # a spec field by the name a user sets it with
# spec fields a state leaves out at their default: states saved before they existed still load, as the same plan
UNSAID = {"redeal_every": 0}


@dataclass(frozen=True, kw_only=True)
class LoaderCheckpoint:
    """Where one rank's loader is in its epoch (``epoch``, ``batches_seen``, the topology and the epoch's
    earlier ``history``), and what that position is only valid for: the :class:`~zarrtorch.plan.EpochSpec` the
    loader ran with, the plan's version and ``fingerprint`` (equal exactly when the batches are), and ``data``,
    a hash of each array's first bytes (:meth:`zarrtorch.ZarrIterableDataset.data_fingerprints`)."""

    epoch: int
    batches_seen: int
    rank: int
    world_size: int
    num_workers: int
    history: tuple[tuple[int, int, int], ...] = ()  # (world_size, num_workers, batches) of earlier segments
    spec: EpochSpec
    plan_version: int
    fingerprint: str
    data: tuple[tuple[str, str], ...]

    POSITION = ("epoch", "batches_seen", "rank", "world_size", "num_workers", "history")

    def to_dict(self) -> dict:
        return {
            **{name: getattr(self, name) for name in self.POSITION if name != "history"},
            "history": [list(seg) for seg in self.history],
            "spec": {k: v for k, v in dataclasses.asdict(self.spec).items() if k not in UNSAID or v != UNSAID[k]},
            "plan_version": self.plan_version,
            "fingerprint": self.fingerprint,
            "data": dict(self.data),
        }

    @classmethod
    def from_dict(cls, state: dict) -> LoaderCheckpoint:
        if not isinstance(state, dict):
            raise TypeError(f"a ZarrDataLoader state is a dict (from state_dict()), got {type(state).__name__}")
        names = [*cls.POSITION, "spec", "plan_version", "fingerprint", "data"]
        missing = [n for n in names if n not in state]
        if missing:
            raise ValueError(
                f"not a state of this zarrtorch's ZarrDataLoader: keys {missing} are missing (a state of another "
                "zarrtorch cannot be carried over: start the epoch afresh with loader.set_epoch(epoch))"
            )
        spec_fields = {f.name for f in dataclasses.fields(EpochSpec)}
        spec = {**UNSAID, **state["spec"]} if isinstance(state["spec"], dict) else state["spec"]
        if not isinstance(spec, dict) or set(spec) != spec_fields:
            raise ValueError(
                f"not a ZarrDataLoader state: 'spec' must hold {sorted(spec_fields)}, got {state['spec']!r}"
            )
        if not isinstance(state["data"], dict):
            raise ValueError(f"not a ZarrDataLoader state: 'data' is {state['data']!r}, not a dict array -> hash")
        history = tuple(tuple(int(v) for v in seg) for seg in state["history"])
        counts = {n: state[n] for n in ("epoch", "batches_seen", "rank", "num_workers")}
        counts.update({f"history[{i}]": min(seg) for i, seg in enumerate(history)})
        negative = {n: v for n, v in counts.items() if int(v) < 0}
        if negative or int(state["world_size"]) < 1:
            raise ValueError(
                f"not a position a loader can be at: {negative or {'world_size': state['world_size']}} "
                "(counts are >= 0, world_size >= 1); the state was altered or written by something else"
            )
        return cls(
            **{n: int(state[n]) for n in cls.POSITION if n != "history"},
            history=history,
            spec=EpochSpec(**spec),
            plan_version=int(state["plan_version"]),
            fingerprint=str(state["fingerprint"]),
            data=tuple(sorted((str(k), str(v)) for k, v in state["data"].items())),
        )

    @property
    def segments(self) -> tuple[Segment, ...]:
        return tuple(Segment(*seg) for seg in self.history)

    @property
    def segment_batches(self) -> int:
        """Batches yielded on the saved topology (``batches_seen`` counts the earlier segments too)."""
        return self.batches_seen - sum(seg.batches for seg in self.segments)

    def setup_differences(self, other: LoaderCheckpoint) -> list[str]:
        """``"setting: saved X, now Y"`` for every part of the set-up that differs: the plan's version, the
        windows (every other difference follows from them), each field of the spec, the data."""
        if self.plan_version != other.plan_version:
            return [
                f"plan version: saved {self.plan_version}, now {other.plan_version}: that zarrtorch's plan gives other "
                "batches than this one's, so the position cannot be carried over"
            ]
        saved, now = self.spec, other.spec
        if saved.windows != now.windows:
            return [
                f"windows: saved {describe_windows(saved.windows)}, now {describe_windows(now.windows)}: "
                "samples of other windows are other samples"
            ]
        out = [
            f"{SETTING_NAMES.get(f.name, f.name)}: saved {getattr(saved, f.name)!r}, now {getattr(now, f.name)!r}"
            for f in dataclasses.fields(EpochSpec)
            if getattr(saved, f.name) != getattr(now, f.name)
        ]
        if not out and self.fingerprint != other.fingerprint:
            out.append(
                f"fingerprint: saved {self.fingerprint!r}, now {other.fingerprint!r} with the same settings: the "
                "state was saved by another zarrtorch or NumPy whose plan or random numbers differ"
            )
        return out + data_differences(dict(self.data), dict(other.data))


def data_differences(saved: dict[str, str], now: dict[str, str]) -> list[str]:
    """What differs between the data a state was saved on and this loader's (:meth:`LoaderCheckpoint.data`)."""
    if sorted(saved) != sorted(now):
        return [f"arrays: saved {sorted(saved)}, now {sorted(now)}"]
    changed = [name for name in sorted(saved) if saved[name] != now[name]]
    if not changed:
        return []
    return [
        f"data: the first chunk of {', '.join(map(repr, changed))} holds other values than when the state was "
        "saved (another store of the same shape, another period, or the store rewritten). If it was rewritten with "
        "the same rows on purpose, pass load_state_dict(state, allow_other_data=True) (under Lightning: "
        "ZarrDataModule(..., allow_other_data=True))"
    ]


def describe_windows(described: str) -> str:
    """``Windows.describe()`` as a user wrote it, or "rows" for a loader of rows."""
    if not described:
        return "rows (no windows=)"
    try:
        history, lead, stride, segments, block_chunks = ast.literal_eval(described)
    except (ValueError, SyntaxError, TypeError):
        return described
    return (
        f"Windows(history={history}, lead={lead}, stride={stride}"
        + (f", segments={segments}" if segments else "")
        + (f", block_chunks={block_chunks}" if block_chunks else "")
        + ")"
    )
