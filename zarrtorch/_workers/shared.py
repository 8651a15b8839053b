"""What the loader shares with its workers.

* :class:`EpochState`: what changes between epochs (epoch, resume point, rank, world size). The loader
  publishes it in a small shared-memory tensor that each worker reads when it starts an epoch: a worker
  holds a *pickled copy* of the dataset, made once for persistent workers and in another process for
  spawn/forkserver, so ordinary attributes set later in the main process would never reach it.

What ``state_dict`` saves is :class:`zarrtorch.resume.LoaderCheckpoint`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch.utils.data import get_worker_info

from zarrtorch._util.process import distributed_topology


@dataclass(frozen=True)
class EpochView:
    """One reading of :class:`EpochState`."""

    epoch: int
    skip: int  # batches of this rank's current segment already yielded before a resume
    rank: int
    world_size: int
    history: tuple[tuple[int, int, int], ...] = ()  # earlier segments: (world size, workers, batches) each


class EpochState:
    """Epoch, resume point, topology and the epoch's earlier segments, shared with worker processes
    through shared memory (a fixed-size tensor: at most ``MAX_SEGMENTS`` interruptions per epoch)."""

    MAX_SEGMENTS = 32
    _HEAD = 6  # epoch, skip, rank, world_size, published, number of segments; then 3 values per segment
    LEVELS = 256  # then the requests in flight each worker (id modulo 256) last settled on

    def __init__(self) -> None:
        size = self._HEAD + 3 * self.MAX_SEGMENTS + self.LEVELS
        self._values = torch.zeros(size, dtype=torch.int64).share_memory_()

    def remember_level(self, worker: int, level: int) -> None:
        """Keep the requests in flight worker ``worker`` found (:mod:`zarrtorch._read.inflight`) for the workers
        of the next epochs: non-persistent workers are new processes every epoch."""
        self._values[self._HEAD + 3 * self.MAX_SEGMENTS + worker % self.LEVELS] = int(level)

    def level(self, worker: int) -> int:
        """What :meth:`remember_level` kept for ``worker`` (0: nothing yet)."""
        return int(self._values[self._HEAD + 3 * self.MAX_SEGMENTS + worker % self.LEVELS])

    def publish(self, view: EpochView) -> None:
        """Set the values every worker will read at the start of its next epoch."""
        if len(view.history) > self.MAX_SEGMENTS:
            raise ValueError(
                f"an epoch resumed on another topology more than {self.MAX_SEGMENTS} times: "
                "start the epoch afresh with loader.set_epoch(epoch)"
            )
        values = [view.epoch, view.skip, view.rank, view.world_size, 1, len(view.history)]
        for seg in view.history:
            values += [int(v) for v in seg]
        self._values[: self._HEAD + 3 * self.MAX_SEGMENTS].zero_()  # the levels stay
        self._values[: len(values)] = torch.tensor(values)

    def read(self) -> EpochView | None:
        """The published values, or ``None`` before the loader first published any."""
        values = self._values.tolist()
        epoch, skip, rank, world_size, published, n = values[: self._HEAD]
        flat = values[self._HEAD : self._HEAD + 3 * n]
        history = tuple(tuple(flat[i : i + 3]) for i in range(0, len(flat), 3))
        return EpochView(epoch, skip, rank, world_size, history) if published else None


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
