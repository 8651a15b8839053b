"""What a :class:`~zarrtorch.ZarrDataLoader` hands the processes that read: one job, made once per loader.

The loader builds an :class:`EpochJob` from the dataset it is given (a description of the data that nothing
changes) and its own settings: the spec that fixes every epoch's batches, its workers, the read plan, the batch
slots its workers write into and the small shared tensor in which it publishes each epoch (the epoch, the resume
point, the rank and the world size). DataLoader iterates an :class:`EpochRunner` over that job: in each worker,
or in the training process with ``num_workers=0``, one ``iter()`` runs one epoch through
:func:`zarrtorch.epoch.run_epoch` (with ``batch_order="rank"`` and workers, a worker's epoch is its turn of the
pieces, and the training process forms the batches: :func:`zarrtorch.epoch.assemble_epoch`). Nothing flows
back into the dataset: a process's state across epochs (its connections, buffers, the level of its requests in
flight, the next epoch's first reads, rows kept in memory) is the runner's in that process, so every loader, and
every process of one, has its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from torch.utils.data import IterableDataset, get_worker_info

from zarrtorch._workers.pinned import PinnedSlots
from zarrtorch._workers.ring import BatchRing
from zarrtorch._workers.shared import EpochState
from zarrtorch.plan import EpochSpec
from zarrtorch.readplan import ReadPlan


@dataclass(frozen=True, kw_only=True)
class EpochJob:
    """Everything one epoch of a loader needs in every process that reads, fixed when the loader is built.

    ``data``: the :class:`~zarrtorch.ZarrIterableDataset`; ``spec``: what fixes the batches; ``num_workers`` and
    ``persistent``: the DataLoader's workers; ``transform_in_consumer``: the dataset's transform runs in the
    training process's thread, not here; ``read_plan``: how a process reads; ``ring``: the batch slots shared with
    the workers, or with ``batch_order="rank"`` their piece slots (``None``: through DataLoader's queue);
    ``epochs``: where the loader publishes each epoch's view (:class:`~zarrtorch._workers.shared.EpochState`);
    ``batch_order``: ``"worker"``, each worker forms its own batches, or ``"rank"``, the rank's batches are those of
    one stream whatever the workers; ``pinned``: with ``pin_memory=True``, no workers and CUDA, the page-locked slots
    batches are gathered into (:mod:`zarrtorch._workers.pinned`)."""

    data: object
    spec: EpochSpec
    num_workers: int
    persistent: bool
    transform_in_consumer: bool
    read_plan: ReadPlan
    ring: BatchRing | None
    epochs: EpochState
    batch_order: str = "worker"
    pinned: PinnedSlots | None = None

    @property
    def plan_workers(self) -> int:
        """The workers the plan splits a rank's batches over (:class:`~zarrtorch.plan.Topology`): the DataLoader's,
        or with ``batch_order="rank"`` none, one stream per rank whatever reads it. Plans, lengths, checkpoints
        and resumes count these, not the processes."""
        return 0 if self.batch_order == "rank" else self.num_workers

    @property
    def deals_pieces(self) -> bool:
        """Whether the workers only read and decode the pieces of the rank's stream, dealt out in turn, and the
        training process forms the batches from them (``batch_order="rank"`` with workers)."""
        return self.batch_order == "rank" and self.num_workers > 0


class EpochRunner(IterableDataset):
    """The iterable a ZarrDataLoader gives DataLoader: each ``iter()`` runs the published epoch of ``job`` in the
    process it is called in. Its per-process state (:class:`zarrtorch.epoch.ProcessState`) is never pickled:
    a worker, forked or spawned, starts its own."""

    def __init__(self, job: EpochJob):
        self.job = job
        self._process = None

    @property
    def data(self):
        """The dataset this loader streams."""
        return self.job.data

    def process_state(self):
        """This process's state across the loader's epochs (made afresh in a new process)."""
        from zarrtorch.epoch import ProcessState

        if self._process is None or self._process.pid != os.getpid():
            self._process = ProcessState(self.job)
        return self._process

    def __getstate__(self) -> dict:
        return {"job": self.job}

    def __setstate__(self, state: dict) -> None:
        self.job, self._process = state["job"], None

    def __iter__(self):
        from zarrtorch.epoch import run_epoch

        return run_epoch(self.job, self.process_state(), get_worker_info())
