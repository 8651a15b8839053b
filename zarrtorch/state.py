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
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoaderConfig:
    """What the DataLoader decides and every worker must agree on."""

    batch_size: int
    drop_last: bool
    num_workers: int


@dataclass(frozen=True)
class EpochView:
    """One reading of :class:`EpochState`."""

    epoch: int
    skip: int  # batches of this rank's epoch already yielded before a resume
    rank: int
    world_size: int


class EpochState:
    """Epoch, resume point and topology, shared with worker processes through shared memory."""

    _FIELDS = ("epoch", "skip", "rank", "world_size", "published")

    def __init__(self) -> None:
        self._values = torch.zeros(len(self._FIELDS), dtype=torch.int64).share_memory_()

    def publish(self, view: EpochView) -> None:
        """Set the values every worker will read at the start of its next epoch."""
        self._values.copy_(torch.tensor([view.epoch, view.skip, view.rank, view.world_size, 1]))

    def read(self) -> EpochView | None:
        """The published values, or ``None`` before the loader first published any."""
        epoch, skip, rank, world_size, published = (int(v) for v in self._values)
        return EpochView(epoch, skip, rank, world_size) if published else None


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

    POSITION = ("epoch", "batches_seen", "rank")  # where the rank is; every other field is the set-up

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, state: dict) -> LoaderCheckpoint:
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in state]
        if missing:
            raise ValueError(
                f"not a ZarrDataLoader state: keys {missing} are missing (saved by "
                "ZarrDataLoader.state_dict() of zarrtorch >= 0.1?)"
            )
        return cls(**{n: state[n] for n in names})

    def setup_differences(self, other: LoaderCheckpoint) -> list[str]:
        """``"field: saved X, now Y"`` for every set-up field that differs."""
        out = []
        for f in dataclasses.fields(self):
            if f.name not in self.POSITION and getattr(self, f.name) != getattr(other, f.name):
                out.append(f"{f.name}: saved {getattr(self, f.name)!r}, now {getattr(other, f.name)!r}")
        return out
