"""The loader's state, in three named pieces.

* :class:`LoaderConfig`: what the DataLoader decides once and every worker must agree on.
* :class:`EpochState`: what changes between epochs (epoch, resume point, rank, world size). The loader
  publishes it in a small shared-memory tensor that each worker reads when it starts an epoch: a worker
  holds a *pickled copy* of the dataset, made once for persistent workers and in another process for
  spawn/forkserver, so ordinary attributes set later in the main process would never reach it.
* :class:`LoaderCheckpoint`: what ``state_dict`` saves, and what must match to resume exactly.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch
from torch.utils.data import get_worker_info

from zarrtorch.process import distributed_topology
from zarrtorch.resume import Segment


@dataclass(frozen=True)
class LoaderConfig:
    """What the DataLoader decides and every worker must agree on."""

    batch_size: int
    drop_last: bool
    num_workers: int
    persistent_workers: bool = False
    transform_in_consumer: bool = False  # the loader applies the dataset's transform in the consumer's thread


@dataclass(frozen=True)
class EpochView:
    """One reading of :class:`EpochState`."""

    epoch: int
    skip: int  # batches of this rank's current segment already yielded before a resume
    rank: int
    world_size: int
    history: tuple[Segment, ...] = ()  # earlier segments of this epoch, on other topologies


class EpochState:
    """Epoch, resume point, topology and the epoch's earlier segments, shared with worker processes
    through shared memory (a fixed-size tensor: at most ``MAX_SEGMENTS`` interruptions per epoch)."""

    MAX_SEGMENTS = 32
    _HEAD = 6  # epoch, skip, rank, world_size, published, number of segments; then 3 values per segment

    def __init__(self) -> None:
        self._values = torch.zeros(self._HEAD + 3 * self.MAX_SEGMENTS, dtype=torch.int64).share_memory_()

    def publish(self, view: EpochView) -> None:
        """Set the values every worker will read at the start of its next epoch."""
        if len(view.history) > self.MAX_SEGMENTS:
            raise ValueError(f"an epoch resumed on another topology more than {self.MAX_SEGMENTS} times: "
                             "start the epoch afresh with loader.set_epoch(epoch)")  # fmt: skip
        values = [view.epoch, view.skip, view.rank, view.world_size, 1, len(view.history)]
        for seg in view.history:
            values += [seg.world_size, seg.num_workers, seg.batches]
        self._values.zero_()
        self._values[: len(values)] = torch.tensor(values)

    def read(self) -> EpochView | None:
        """The published values, or ``None`` before the loader first published any."""
        values = self._values.tolist()
        epoch, skip, rank, world_size, published, n = values[: self._HEAD]
        flat = values[self._HEAD : self._HEAD + 3 * n]
        history = tuple(Segment(*flat[i : i + 3]) for i in range(0, len(flat), 3))
        return EpochView(epoch, skip, rank, world_size, history) if published else None


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
    cache: bool
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


def epoch_view(epoch_state: EpochState | None) -> EpochView:
    """What the loader published for this epoch; without a loader, epoch 0 on torch.distributed's topology
    (a worker cannot know its rank that way, so it refuses)."""
    view = epoch_state.read() if epoch_state is not None else None
    if view is not None:
        return view
    if get_worker_info() is not None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RuntimeError("this worker cannot know its rank: iterate the dataset through zarrtorch.ZarrDataLoader")
    rank, world = distributed_topology()
    return EpochView(epoch=0, skip=0, rank=rank, world_size=world)
