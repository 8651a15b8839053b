"""``ZarrDataLoader``: a DataLoader that gives every rank the same number of batches, every epoch.

It reads the rank and world size from ``torch.distributed`` in the process that creates the iterator
(workers started by spawn or forkserver have no process group) and publishes them, with the epoch and the
resume point, in the dataset's :class:`zarrtorch._workers.shared.EpochState`, which every worker reads when it
starts an epoch. Lightning calls ``set_epoch`` on a loader's sampler, so the sampler forwards it here: no
``use_distributed_sampler=False`` and no ``reload_dataloaders_every_n_epochs`` are needed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader

from zarrtorch._compat.torch import (
    EpochSampler,
    WorkersSilent,
    awaited_worker,
    bound_waits,
    persistent_iterator,
    raised_in_worker,
    set_sampler,
    stop_workers,
    worker_processes,
)
from zarrtorch._read.fetch import RetryPolicy
from zarrtorch._util.arguments import INT64_LIMIT, flag, whole_number
from zarrtorch._util.process import (
    TopologyUnknown,
    check_ranks_agree,
    ctrl_c_held,
    distributed_topology,
    frozen_objects,
    process_state,
)
from zarrtorch._workers.dealt import piece_ring
from zarrtorch._workers.pinned import make_pinned
from zarrtorch._workers.ring import make_ring, pin_copy
from zarrtorch._workers.shared import EpochState, EpochView
from zarrtorch._workers.workahead import ProducerSilent, WorkAhead
from zarrtorch.dataset import ZarrIterableDataset
from zarrtorch.epoch import assemble_epoch
from zarrtorch.job import EpochJob, EpochRunner
from zarrtorch.options import check_loader_settings, loader_numbers
from zarrtorch.plan import PLAN_VERSION, EpochSpec, Segment, Topology
from zarrtorch.position import EpochPosition, EpochRun, resumed_history
from zarrtorch.readplan import ReadPlan
from zarrtorch.resume import LoaderCheckpoint, resumed_plan

SUPERSEDED = (
    "this iterator of a ZarrDataLoader was superseded: iter(loader) was called again since it was made, and "
    "a loader runs one epoch at a time (its workers, shared slots and position belong to the newest "
    "iterator). Use the newest iterator, or finish this one before starting another"
)


STORE_CHECK_FAILED = (
    "this iterator of a ZarrDataLoader refused its epoch: the check that the store was not rewritten since the dataset "
    "opened it failed (the error raised by the first next() says how). Make a new ZarrIterableDataset and loader"
)
FORKED = (
    "this iterator of a ZarrDataLoader was made in process {made} and this is process {now}, a fork of it: the "
    "threads and DataLoader workers that read its epoch run in that process only (waiting for them here would wait "
    "forever, and taking batches from its workers' queues would take them from that process's epoch). Start an epoch "
    "in this process with iter(loader), or go on with this one in process {made}"
)
INTERRUPTED = (
    "this iterator of a ZarrDataLoader was interrupted (KeyboardInterrupt inside next()): a batch may have been "
    "taken and not handed out, so it cannot go on without losing rows. Start the epoch again with iter(loader), or "
    "continue it on a new loader: other.load_state_dict(loader.state_dict()) (the batches handed out are counted)"
)
FAILED = (
    "this iterator of a ZarrDataLoader stopped at an error (raised by an earlier next(), above): the rest of its epoch "
    "was not read, and going on would end the epoch early, silently. Start the epoch again with iter(loader), or "
    "continue it on a new loader: other.load_state_dict(loader.state_dict()) (the batches handed out are counted)"
)


def worker_timeout_s(policy: RetryPolicy | None) -> float:
    """How long the loader waits for a worker's next batch by default (DataLoader's own default is forever, and a
    stopped or deadlocked worker must not hang the training loop): at least 5 minutes, and twice
    what one chunk read may take before it fails (every attempt of the retry policy, with its back-offs), plus a
    minute for a worker's start."""
    policy = policy or RetryPolicy()
    attempts = policy.retries + 1
    one_read = attempts * policy.timeout_s + policy.backoff_s * (2**policy.retries - 1)
    return max(300.0, 2 * one_read + 60.0)


class EpochIterator:
    """One epoch of a :class:`ZarrDataLoader`: counts the batches handed out (for ``state_dict``), stops
    the workers at once when one of them fails, and refuses to go on once a newer epoch started. ``loader``
    gives it what it needs by name (:class:`EpochControl`): nothing here reaches into the loader."""

    def __init__(self, inner, control: EpochControl, run: EpochRun, transform=None, *, workers=None, store_check=None):
        ahead = isinstance(inner, WorkAhead)
        # DataLoader's own iterator (``workers``; under the batches formed here, with batch_order="rank")
        self._inner = workers if workers is not None else inner.inner if ahead else inner
        self._next = inner.__next__ if ahead else lambda: control.receive(next(inner))  # received there
        self._stop_ahead = inner.stopper() if ahead else None
        self._control = control
        self._run = run
        self._transform = transform  # the dataset's, run here when it must draw random numbers in this thread
        self._ended_by: str | None = None  # why it refuses to go on, once next() raised (a Ctrl-C, an error, ...)
        # the check that the store was not rewritten, running beside the epoch's first reads: its outcome is taken
        # before the first batch is handed out (a batch read with an old shape or dtype is never handed out)
        self._store_check = store_check
        self._pid = os.getpid()  # the process whose threads and workers read this epoch

    def __iter__(self):
        return self

    def __next__(self):
        # once next() raised, the epoch cannot go on whole: a KeyboardInterrupt (Ctrl-C) lands between any two
        # bytecodes, after a batch was taken from the work-ahead thread and before it was handed out, or inside the
        # epoch's generator (work_ahead=0), which it ends, as an error there does; the next next() would lose that
        # batch or end the epoch early (StopIteration), silently. The iterator refuses instead, saying why
        if self._ended_by is not None:
            raise RuntimeError(self._ended_by)
        if os.getpid() != self._pid:
            raise RuntimeError(FORKED.format(made=self._pid, now=os.getpid()))
        try:
            return self._next_batch()
        except StopIteration:
            raise
        except KeyboardInterrupt:
            self._ended_by = INTERRUPTED
            raise
        except Exception:
            self._ended_by = self._ended_by or FAILED  # a refusal or a newer epoch said why already
            raise

    def _next_batch(self):
        control = self._control
        if control.newest() is not self._run:
            self._ended_by = SUPERSEDED
            raise RuntimeError(SUPERSEDED)
        try:
            batch = self._next()
        except StopIteration:
            self._check_whole()
            control.finished(self._run)
            raise
        except ProducerSilent as silent:
            raise self._unblock(silent) from None
        except Exception as exc:
            self._take_store_check(after=exc)
            stalled = control.stalled(self._inner, exc)
            if self._stop_epoch(stuck=stalled is not None):
                if stalled is not None:
                    raise stalled from None
                # DataLoader re-raises a worker's error from a frame that holds it (a reference cycle that
                # would keep this loader and its next workers for the garbage collector); the message
                # already carries the worker's traceback. An error of this process's own (receiving a batch
                # from a worker that exited) keeps its traceback, which names what failed
                if raised_in_worker(exc) or isinstance(exc, RuntimeError):  # a worker's, or its death
                    raise exc.with_traceback(None) from None
                raise RuntimeError(
                    f"receiving a batch from a DataLoader worker failed ({type(exc).__name__}: {exc}): the worker "
                    "exited or stopped while sending it. Its workers were stopped; a new iter() starts fresh ones"
                ) from exc
            raise
        self._take_store_check()
        if self._transform is not None:
            batch = self._transform(batch)
        self._run.seen += 1
        if self._run.late_warning is not None:
            warnings.warn(self._run.late_warning, stacklevel=2)
            self._run.late_warning = None
        return batch

    def _check_whole(self) -> None:
        """At the epoch's end: it handed out every batch it planned, or an error says how many it did not. The plan
        knows the number; an end before it (batches taken from its workers' queues by another process, or lost in
        any other way) is never a silent short epoch."""
        run = self._run
        planned = run.length - run.start
        if run.seen < planned:  # the iterator then refuses to go on, as after any error (__next__)
            raise RuntimeError(
                f"epoch {run.epoch} of this ZarrDataLoader ended after {run.seen} of the {planned} batches it planned "
                f"on this rank: {planned - run.seen} never arrived. Rows were lost, not read twice; the epoch is not "
                "counted as done. Start it again with iter(loader). If a process forked from this one iterated it, "
                "its workers' batches went there"
            )

    def _take_store_check(self, *, after: Exception | None = None) -> None:
        """Take the outcome of the check that the store was not rewritten, once, before the epoch's first batch is
        handed out. Its failure (a rewrite is a ``ValueError``; a store that did not answer, a ``ChunkReadError``)
        refuses the epoch: no batch of it is handed out, its work is stopped. When the epoch failed first (``after``),
        only a rewrite is raised, from that error: a chunk of the rewritten store that decodes to the wrong size, or is
        missing, is the rewrite's doing, and the rewrite is what to fix."""
        if self._store_check is None:
            return
        check, self._store_check = self._store_check, None
        try:
            check.result()
        except ValueError as rewritten:
            self._refuse()
            if after is not None:  # without tracebacks: a worker's error is raised from a frame that holds it
                raise rewritten.with_traceback(None) from after.with_traceback(None)
            raise
        except BaseException:
            if after is None:
                self._refuse()
                raise

    def _refuse(self) -> None:
        self._ended_by = STORE_CHECK_FAILED
        self._stop_epoch()

    def _stop_epoch(self, *, stuck: bool = False) -> bool:
        """Stops the epoch's work-ahead thread, then its workers; False when either would not stop. A worker's death
        is signalled in this thread while the work-ahead thread may be inside DataLoader's iterator, which is not safe
        to shut down under it (that thread sees the death within seconds too): the workers are left running when the
        thread does not stop."""
        if self._stop_ahead is not None and not self._stop_ahead(timeout_s=30.0, quiet=True):
            return False
        return stop_workers(self._control.loader, self._inner, stuck=stuck)

    def __len__(self) -> int:
        return self._run.length - self._run.start

    def _unblock(self, silent: ProducerSilent) -> RuntimeError:
        """The work-ahead thread is blocked inside a batch that never arrives whole (a worker stopped after it
        queued the batch: receiving it waits on that worker, with no timeout). Its workers are continued (a
        stopped one ends at shutdown), or killed if the thread still does not come out; then stopped."""
        control, inner = self._control, self._inner
        error = control.stalled(inner, WorkersSilent(f"DataLoader timed out after {silent}"))
        workers = worker_processes(inner)
        for worker in workers:
            with contextlib.suppress(OSError):
                os.kill(worker.pid, signal.SIGCONT)
        if not self._stop_ahead(timeout_s=10.0, quiet=True):
            for worker in workers:
                with contextlib.suppress(Exception):  # torch's SIGCHLD handler may raise here: they are ours
                    worker.kill()
            self._stop_ahead(timeout_s=30.0, quiet=True)
        with contextlib.suppress(Exception):
            stop_workers(control.loader, inner, stuck=True)
        return error

    @property
    def workers(self) -> list:
        """This epoch's worker processes (empty with ``num_workers=0``)."""
        return worker_processes(self._inner)


@dataclass(frozen=True)
class EpochControl:
    """What an :class:`EpochIterator` asks of its loader: the newest iteration, that one ended, what a silent
    worker means, how a batch is received."""

    loader: DataLoader
    newest: Callable[[], EpochRun | None]
    finished: Callable[[EpochRun], None]
    stalled: Callable[[object, BaseException], RuntimeError | None]
    receive: Callable


class ZarrDataLoader(DataLoader):
    """DataLoader over a :class:`ZarrIterableDataset`; batches are dicts of tensors.

    ``batch_size`` and ``drop_last`` apply to the whole rank: with ``drop_last=True`` every rank yields
    ``rows // (world_size * batch_size)`` full batches; with ``drop_last=False`` every row is read once,
    plus fewer than ``world_size`` rows repeated so that all ranks yield the same number of batches.
    ``rank``/``world_size`` override ``torch.distributed`` (to simulate ranks in one process).
    ``work_ahead``: batches handed over from a background thread that stays this many batches ahead of the
    consumer (with ``num_workers=0`` it assembles them; with workers it receives them); each holds one batch
    of memory in the main process; 0 turns it off. ``transport``: how batches leave the workers:
    ``"ring"`` (the default) preallocated shared-memory slots wrapped without a copy, each slot reused once
    nothing references its batch any more (:mod:`zarrtorch._workers.ring`); ``"queue"`` DataLoader's own way (a new
    shared-memory segment per batch). Other DataLoader arguments (``pin_memory``, ``prefetch_factor``,
    ``persistent_workers``, ``multiprocessing_context``...) pass through; ``timeout`` (seconds a worker's next batch
    may take; ``worker_timeout_s``) defaults to :func:`worker_timeout_s`, not DataLoader's forever; a dead worker is
    still named within seconds. A worker stopped whole (SIGSTOP, a
    debugger) after it queued a batch blocks the receiving of that batch: with ``work_ahead`` the consumer gives
    up a minute after ``timeout``; with ``work_ahead=0`` and ``transport="queue"`` nothing bounds that wait.
    ``check_ranks``: under a process
    group, every epoch's first ``iter()`` checks that all ranks computed the same plan (one small all-gather).
    ``batch_order``: ``"worker"`` (the default) each worker forms its own batches from its own run of the rank's
    rows, so the batches change with ``num_workers``; ``"rank"``: each rank's batches (rows, in order) are those of
    ``num_workers=0``, a function of the seed, the epoch, the batch size, ``drop_last`` and the number of ranks only:
    the workers read and decode the pieces of the rank's one stream, dealt out in turn, and the training process
    forms the batches (:mod:`zarrtorch._workers.dealt`; ``docs/batch-order.md``). Its states say ``num_workers`` 0,
    so a resume with any number of workers continues the sequence exactly. Not with ``transport="ring"`` or
    ``keep_in_memory=True`` and workers.
    Every argument after ``batch_size`` is passed by name (``DataLoader``'s third positional one is
    ``shuffle``).
    """

    def __init__(
        self,
        dataset: ZarrIterableDataset,
        batch_size: int = 1,
        *,
        drop_last: bool = False,
        num_workers: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        work_ahead: int = 2,
        transport: str | None = None,
        check_ranks: bool = True,
        batch_order: str = "worker",
        **kwargs,
    ):
        if not isinstance(dataset, ZarrIterableDataset):
            raise TypeError(f"ZarrDataLoader needs a zarrtorch.ZarrIterableDataset, got {type(dataset).__name__}")
        batch_size, drop_last, num_workers, rank, world_size, work_ahead, check_ranks = loader_numbers(
            batch_size, drop_last, num_workers, rank, world_size, work_ahead, check_ranks
        )
        check_loader_settings(
            dataset, batch_size, num_workers, rank, world_size, work_ahead, transport, kwargs, batch_order
        )
        deals_pieces = batch_order == "rank" and num_workers > 0
        # seconds a worker's next batch may take: DataLoader's own default waits forever (bound_waits)
        asked = kwargs.pop("timeout", None)
        self.worker_timeout_s = float(worker_timeout_s(dataset.read.retry) if asked is None else asked)
        self.work_ahead = work_ahead
        self.check_ranks = check_ranks
        # with no workers (or batches formed here, batch_order="rank") a random transform would run in the
        # work-ahead thread, drawing from torch's global generator while the training step does: it runs in the
        # consumer's thread instead, as DataLoader's
        in_consumer = dataset.transform is not None and (num_workers == 0 or deals_pieces) and work_ahead > 0
        prefetch = kwargs.get("prefetch_factor") or 2
        self.job = EpochJob(
            data=dataset,
            spec=dataset.spec(batch_size, drop_last),
            num_workers=num_workers,
            persistent=bool(kwargs.get("persistent_workers")),
            transform_in_consumer=in_consumer,
            read_plan=ReadPlan.of(dataset, num_workers),
            # allocated by iter(); with batch_order="rank" it carries the workers' pieces
            ring=(
                piece_ring(dataset, num_workers, prefetch, transport)
                if deals_pieces
                else make_ring(dataset, batch_size, num_workers, prefetch, work_ahead, transport)
            ),
            epochs=EpochState(),
            batch_order=batch_order,
            pinned=make_pinned(dataset, batch_size, num_workers, work_ahead, bool(kwargs.get("pin_memory"))),
        )
        # what receive() keeps of a slot
        self._ring_keep = None if dataset.return_index else set(dataset.out_columns) | {"padding"}
        self._ring_copy = pin_copy if bool(kwargs.get("pin_memory")) and torch.cuda.is_available() else None
        super().__init__(EpochRunner(self.job), batch_size=None, num_workers=num_workers, **kwargs)
        set_sampler(self, EpochSampler(self))  # Lightning's set_epoch lands here
        self._fixed_topology = None if rank is None else (int(rank), int(world_size))
        self.position = EpochPosition()  # the epoch the next iter() runs, where it starts, the newest iteration
        self._stop_work_ahead: Callable[[], None] | None = None  # of the last epoch's work-ahead thread
        self._last_workers: weakref.ref | None = None  # the last epoch's DataLoader iterator, with workers

    @property
    def consumed_batches(self) -> Callable[[], int | None] | None:
        """Batches of this epoch the consumer has finished with, when it can tell (a trainer fetches ahead: what the
        loader has yielded is then ahead of what was trained); see ZarrDataModule."""
        return self.position.consumed_batches

    @consumed_batches.setter
    def consumed_batches(self, count: Callable[[], int | None] | None) -> None:
        self.position.consumed_batches = count

    @property
    def consumer_epoch_length(self) -> Callable[[], int | None] | None:
        """Batches of each epoch the consumer takes at most, when fewer than the epoch's (Lightning's
        ``limit_train_batches``): taken them all, the epoch is over for it, and a checkpoint holds the next one's
        start."""
        return self.position.consumer_epoch_length

    @consumer_epoch_length.setter
    def consumer_epoch_length(self, count: Callable[[], int | None] | None) -> None:
        self.position.consumer_epoch_length = count

    # -- what it streams -----------------------------------------------------------------------------
    @property
    def data(self) -> ZarrIterableDataset:
        """The dataset this loader streams (the one it was given: nothing writes into it)."""
        return self.job.data

    @property
    def spec(self) -> EpochSpec:
        """What fixes every epoch's batches: the dataset's rows and shuffle, this loader's batch size and
        ``drop_last`` (:class:`zarrtorch.plan.EpochSpec`)."""
        return self.job.spec

    def batch_row_ids(
        self, *, epoch: int | None = None, rank: int | None = None, world_size: int | None = None, history=()
    ) -> list[np.ndarray]:
        """The store rows (or window start rows) of every batch this loader yields in ``epoch`` (default: the one
        the next ``iter()`` runs) on ``rank`` of ``world_size`` (default: this loader's), computed without reading
        data; ``history``: the epoch's earlier segments on other topologies (:mod:`zarrtorch.resume`)."""
        own_rank, own_world = self.topology() if rank is None or world_size is None else (rank, world_size)
        return self.data.batch_row_ids(
            epoch=self.position.epoch if epoch is None else epoch,
            batch_size=self.spec.batch_size,
            drop_last=self.spec.drop_last,
            rank=own_rank if rank is None else rank,
            world_size=own_world if world_size is None else world_size,
            num_workers=self.job.plan_workers,
            history=history,
        )

    # -- epochs and topology ------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the one the next ``iter(loader)`` runs: a new chunk order and a new partition on every
        rank. Call it every epoch. A loaded state (:meth:`load_state_dict`) of another epoch is dropped: that
        epoch starts afresh. An iteration already running goes on with its own epoch."""
        late = self.position.set_epoch(whole_number(epoch, "epoch", least=0, below=INT64_LIMIT))
        if late is not None:
            warnings.warn(late, stacklevel=2)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` runs."""
        return self.position.epoch

    def topology(self) -> tuple[int, int]:
        """(rank, world size) this loader uses now: ``rank=``/``world_size=`` if given, else
        :func:`zarrtorch._util.process.distributed_topology` (the process group, or torchrun's environment)."""
        return self._fixed_topology or distributed_topology()

    def _plan(self, rank: int, world: int, history: tuple[Segment, ...], epoch: int | None = None):
        topology = Topology(rank, world, self.job.plan_workers)
        return resumed_plan(self.spec, self.position.epoch if epoch is None else epoch, history, topology)

    def _length(self, rank: int, world: int, history: tuple[Segment, ...]) -> int:
        return sum(seg.batches for seg in history) + self._plan(rank, world, history).batches

    def __len__(self) -> int:
        """Exact number of batches this rank yields in the epoch the next ``iter()`` runs (the same on every
        rank). In an epoch resumed on another topology: the batches yielded before, plus what every rank
        yields of the rest."""
        rank, world = self.topology()
        history = self.position.start_point(world, self.job.plan_workers)[0]
        return self._length(rank, world, history) + self.position.counted(self.position.epoch)

    def count_as_done(self, batches: int) -> None:
        """A trainer counts ``batches`` batches of the epoch the next ``iter()`` runs as done that this loader never
        yielded (Lightning, resumed from a checkpoint taken at an epoch's last batch on more ranks, keeps its batch
        counter, 10, though its epoch is the next one, of 20 batches here): ``len()`` counts them too, so that the
        trainer still asks for every batch of the epoch, and the trainer's count of consumed batches
        (``consumed_batches``) is taken less them. Until that epoch ends or another one is set."""
        self.position.count_as_done(batches)

    def batches_before(self) -> int:
        """Batches of the epoch the next ``iter()`` runs that were yielded before it (by a loaded state)."""
        rank, world = self.topology()
        return self.position.start_point(world, self.job.plan_workers)[1]

    def __iter__(self):
        if self._stop_work_ahead is not None:  # the last epoch's thread must be off DataLoader's iterator
            self._stop_work_ahead, stop = None, self._stop_work_ahead
            stop()
        rank, world = self.topology()
        store_check = self.data.check_store_unchanged()  # a remote store's (no cache): taken at its first batch
        position = self.position
        history, skip = position.start_point(world, self.job.plan_workers)
        try:
            length = self._length(rank, world, history)  # raise here, not in a worker
        except ValueError as exc:
            if not position.refused():  # a loaded state refused as a whole: the epoch starts afresh next time
                raise
            raise ValueError(f"the loaded state was not applied: {exc}") from exc
        if position.repeated(self.data.shuffle):
            warnings.warn(
                f"ZarrDataLoader: epoch {position.epoch} starts again with the same order; call "
                "loader.set_epoch(epoch) before each epoch to get a new shuffle",
                stacklevel=2,
            )
        run = position.begin(history, skip, length)
        if self.check_ranks and self._checks_ranks():
            check_ranks_agree(
                f"plan {self.spec.fingerprint()}, epoch {run.epoch}, {world} ranks x {self.job.plan_workers} workers "
                f"(batch order {self.job.batch_order}), "
                f"{length} batches from batch {skip}, earlier segments {[tuple(s) for s in history]}, "
                f"data {self.data.data_fingerprint()}",
                f"epoch {run.epoch} of a ZarrDataLoader",
            )
        self._drop_dead_workers()
        if self.job.ring is not None:
            self._stop_earlier_workers()
            self.job.ring.start_epoch()
        earlier = sum(seg.batches for seg in history)
        self.job.epochs.publish(EpochView(run.epoch, skip - earlier, rank, world, history))
        inner = workers = self._start_workers()
        bound_waits(inner, self.worker_timeout_s)
        self._last_workers = weakref.ref(inner) if self.num_workers else None
        if self.job.deals_pieces:  # the workers send pieces: this process forms the batches
            inner = assemble_epoch(self.job, self.dataset.process_state(), inner)
        if self.work_ahead > 0:
            # the consumer's own limit, past DataLoader's: receiving a batch whose worker stopped after queueing
            # it waits for that worker without any timeout
            silent_s, wait_s = None, self.worker_timeout_s
            if self.num_workers and wait_s > 0:
                silent_s = wait_s + max(5.0, min(60.0, wait_s))
            inner = WorkAhead(inner, self.work_ahead, convert=self.receive, timeout_s=silent_s)
            self._stop_work_ahead = inner.stopper()
        transform = self.data.transform if self.job.transform_in_consumer else None
        control = EpochControl(self, lambda: position.run, position.finished, self._stalled, self.receive)
        iterator = EpochIterator(inner, control, run, transform, workers=workers, store_check=store_check)
        position.run_iterator = weakref.ref(iterator)
        return iterator

    def _checks_ranks(self) -> bool:
        """Whether this iteration is one of a process group's ranks, which must agree on the plan: no ``rank=``
        given, or the group's own rank and size given (as DistributedSampler users pass them: ranks with other
        seeds would read overlapping rows). Ranks simulated in one process (another size) are not checked."""
        if not torch.distributed.is_initialized():
            return False
        own = (torch.distributed.get_rank(), torch.distributed.get_world_size())
        given = self._fixed_topology
        if given is not None and given[1] == own[1] and given[0] != own[0]:
            # not a simulation (the group's size), yet another rank's share (LOCAL_RANK passed on a second node):
            # refused, or that rank's rows would be read twice and others never
            raise ValueError(
                f"rank={given[0]} was given, but this process is rank {own[0]} of the process group's {own[1]}: "
                "pass torch.distributed.get_rank() (not LOCAL_RANK), or leave rank= and world_size= out. To look "
                "at another rank's batches on purpose, pass check_ranks=False"
            )
        return given is None or given == own

    def _start_workers(self):
        """DataLoader's iterator for the epoch (workers start or, persistent, resume here). Persistent workers
        that die as they resume (a terminal's Ctrl-C reached them too, and they were still exiting when the next
        epoch began) are replaced once, instead of the epoch failing with "worker exited unexpectedly"."""
        try:
            return self._forked_iterator()
        except RuntimeError:
            kept = persistent_iterator(self)
            if kept is None or all(w.is_alive() for w in worker_processes(kept)):
                raise
            stop_workers(self, kept)
        return self._forked_iterator()

    def _forked_iterator(self):
        """DataLoader's iterator, its workers forked with this process's objects frozen and a Ctrl-C held until they
        are (:func:`~zarrtorch._util.process.ctrl_c_held`)."""
        forks = self.num_workers > 0
        with frozen_objects(forks), ctrl_c_held(forks):
            return super().__iter__()

    def _stalled(self, iterator, exc: Exception) -> RuntimeError | None:
        """DataLoader's "timed out after N seconds", said again with the worker it waited for and the fix."""
        if not isinstance(exc, WorkersSilent):
            return None  # another error: said as it is
        awaited = awaited_worker(iterator)
        stopped = [(w, p) for w, p in enumerate(worker_processes(iterator)) if process_state(p.pid)]
        if stopped:  # a worker stopped or stuck in a read explains the silence, whichever batch was next
            awaited = stopped[0]
        who = "a worker"
        if awaited is not None:
            wid, process = awaited
            state = process_state(process.pid)
            who = f"worker {wid} (pid {process.pid}{', ' + state if state else ''})"
        return RuntimeError(
            f"ZarrDataLoader: {who} sent no batch within {self.worker_timeout_s:g} s (the loader's timeout; by default "
            "twice what a chunk read may take before its retries give up, plus a minute), so it is stuck: "
            "stopped, deadlocked, or waiting on a file system that does not answer. Its workers were stopped; a "
            "new iter() starts fresh ones. If a batch can take longer (a slow transform), pass "
            "timeout=<seconds> to ZarrDataLoader (timeout=0 waits forever)"
        )

    def _drop_dead_workers(self) -> None:
        """Persistent workers of which one has died since the last epoch (killed between epochs, in the training
        step, or by a terminal's Ctrl-C, which reaches them too) are replaced: DataLoader would hand out their
        iterator again and fail every later epoch with "worker exited unexpectedly"."""
        kept = persistent_iterator(self)
        if kept is not None and any(not w.is_alive() for w in worker_processes(kept)):
            stop_workers(self, kept)

    def _stop_earlier_workers(self) -> None:
        """Workers of an earlier epoch still running (not persistent, and their iterator still referenced)
        would write into the ring slots this epoch's workers use: one epoch at a time per loader."""
        earlier = self._last_workers() if self._last_workers is not None else None
        if earlier is not None and earlier is not persistent_iterator(self):
            stop_workers(self, earlier)

    def receive(self, batch):
        """A batch as the consumer gets it: views of its ring slot when it came through one."""
        if self.job.ring is None:
            return batch
        return self.job.ring.receive(batch, self._ring_keep, copy=self._ring_copy)

    # -- checkpointing ------------------------------------------------------------------------------
    def checkpoint(self) -> LoaderCheckpoint:
        """This rank's position, the topology it runs on and the set-up the position is valid for.

        The position is that of the iteration in flight (what is being trained), until it ends or a new one
        starts; before any, where the next one starts. An epoch whose batches have all been yielded is saved
        as the start of the next one (or of the epoch ``set_epoch`` chose since): a run resumed from it trains
        that epoch whether or not its trainer calls ``set_epoch`` before it iterates (Lightning builds the
        iterator first)."""
        rank, world = self.topology()
        epoch, seen, history = self.position.saved(world, self.job.plan_workers)
        return checkpoint_of(
            self.spec, self.data.data_fingerprints(), self.job.plan_workers, epoch, seen, rank, world, history
        )

    def state_dict(self) -> dict:
        """Where this rank is (epoch, batches already yielded), the topology and the set-up, as a plain dict
        (what Lightning stores in its checkpoints)."""
        return self.checkpoint().to_dict()

    def load_state_dict(self, state: dict, *, allow_other_data: bool = False) -> None:
        """Continue the saved epoch after the batches already yielded.

        On the saved topology (same world size and workers) the epoch continues exactly as it would have.
        On another one, the rows not yet consumed by any saved rank are split again over the new ranks
        (:mod:`zarrtorch.resume`): every row once (``drop_last=False``, plus fewer than ``world_size``
        repeated rows to even out the ranks) or no row twice (``drop_last=True``), equal batches per rank.
        The batch size, seed, shuffling and data must be those of the saved run: the first bytes of each array
        are compared (a state of another store of the same shape would resume there without a word).
        ``allow_other_data=True`` skips that comparison, for a store rewritten on purpose with the same rows.

        Everything is checked before anything changes: a refused state raises here and leaves the loader as
        it was. An iteration in flight is superseded. The position is taken up by the next ``iter()``
        (``set_epoch`` of another epoch drops it), on the topology of that moment."""
        saved = LoaderCheckpoint.from_dict(state)
        now = self._setup_checkpoint()
        if flag(allow_other_data, "allow_other_data"):
            now = dataclasses.replace(now, data=saved.data)
        diff = saved.setup_differences(now)
        if diff:
            raise ValueError(
                "cannot resume this loader: the state was saved with other data or settings ("
                + "; ".join(diff)
                + "). Resume with the saved batch_size, seed, shuffle, buffer_chunks, drop_last, windows and store, or "
                "start the epoch afresh with loader.set_epoch(epoch) instead of load_state_dict."
            )
        try:
            rank, world = self.topology()
        except TopologyUnknown:
            rank = world = None  # checked when the epoch starts, once the process group exists
        if world is not None:  # raises for a position this data cannot have (cache=True on another topology...)
            self._plan(rank, world, resumed_history(saved, world, self.job.plan_workers), epoch=saved.epoch)
        self.position.load(saved)

    def _setup_checkpoint(self) -> LoaderCheckpoint:
        """A checkpoint of this loader's set-up (its position fields are placeholders)."""
        return checkpoint_of(self.spec, self.data.data_fingerprints(), self.job.plan_workers, 0, 0, 0, 1, ())


def checkpoint_of(
    spec: EpochSpec,
    data: dict[str, str],
    num_workers: int,
    epoch: int,
    seen: int,
    rank: int,
    world: int,
    history: tuple[Segment, ...],
) -> LoaderCheckpoint:
    """The checkpoint of a position (``seen`` batches of ``epoch``) of a loader with ``spec`` on ``data``."""
    return LoaderCheckpoint(
        epoch=epoch,
        batches_seen=seen,
        rank=rank,
        world_size=world,
        num_workers=num_workers,
        history=tuple(tuple(seg) for seg in history),
        spec=spec,
        plan_version=PLAN_VERSION,
        fingerprint=spec.fingerprint(),
        data=tuple(sorted(data.items())),
    )
