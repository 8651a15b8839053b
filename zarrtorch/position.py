"""Where a loader is in its epochs: the epoch the next ``iter()`` runs, where it starts in it, the iteration in
flight, and what a consumer says it took. Plain bookkeeping, no data: :class:`zarrtorch.ZarrDataLoader` asks it
where an iteration starts and what a checkpoint holds, and tells it when an iteration begins and ends.

The rules it keeps:

* ``set_epoch(e)`` makes ``e`` the next iteration's epoch; a loaded state of another epoch is dropped. An
  iteration in flight goes on with its own epoch (Lightning calls ``set_epoch`` after it builds its iterator).
* The next iteration starts at the epoch's beginning, at a loaded state (resolved on the topology of that
  moment), or where the last iteration of the same epoch started (iterated again, it restarts there).
* A checkpoint holds the position of the iteration in flight, in batches the consumer finished with (a trainer
  fetches ahead); an epoch whose batches have all been taken (or all the consumer takes of them, a trainer's
  ``limit_train_batches``) is saved as the next epoch's start.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

from zarrtorch.plan import Segment
from zarrtorch.resume import LoaderCheckpoint


@dataclass
class EpochRun:
    """One iteration of an epoch (``iter(loader)``): where in the epoch it started and how far it got."""

    epoch: int
    history: tuple[Segment, ...]  # the epoch's segments on earlier topologies
    start: int  # batches of the epoch yielded before this iteration began (earlier segments included)
    length: int  # batches of the whole epoch on this rank (``len(loader)`` when it began)
    seen: int = 0  # batches this iteration has yielded
    done: bool = False  # it ran to its end
    late_warning: str | None = None  # said at its first batch: a set_epoch of another epoch came before it

    @property
    def position(self) -> int:
        return self.start + self.seen


def resumed_history(saved: LoaderCheckpoint, world: int, num_workers: int) -> tuple[Segment, ...]:
    """The segments before a resume of ``saved`` on ``world`` ranks x ``num_workers`` workers: the saved
    ones, plus the saved topology's own when the new one differs."""
    history = saved.segments
    if (saved.world_size, saved.num_workers) != (world, num_workers):
        history += (Segment(saved.world_size, saved.num_workers, saved.segment_batches),)
    return history


class EpochPosition:
    """A loader's place in its epochs (see the module's rules). ``consumed_batches`` and ``consumer_epoch_length``
    are what a consumer says, when it can: the batches of this epoch it has finished with (a trainer fetches
    ahead), and the most it takes of an epoch (Lightning's ``limit_train_batches``)."""

    def __init__(self):
        self.epoch = 0  # the epoch the next iter() runs
        # where in it the next iter() starts: None (its beginning), a loaded state (resolved on the topology of that
        # moment), or (earlier segments, batches) of the last iteration of this epoch (a restart)
        self.start: LoaderCheckpoint | tuple[tuple[Segment, ...], int] | None = None
        self.run: EpochRun | None = None  # the newest iteration: older iterators refuse to go on
        self.set_since_run = True  # set_epoch or load_state_dict since the newest iteration began
        self.run_iterator: weakref.ref | None = None  # the newest iteration's iterator, while something holds it
        self.counted_ahead: tuple[int, int] | None = None  # (epoch, batches) a trainer counts as done
        self.consumed_batches: Callable[[], int | None] | None = None
        self.consumer_epoch_length: Callable[[], int | None] | None = None

    # -- epochs ------------------------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> str | None:
        """Make ``epoch`` the next iteration's; returns a warning to give where an iteration of another epoch
        began just before (its first batches are out: it goes on as its own epoch)."""
        run = self.run
        if run is not None and not run.done and epoch == run.epoch == self.epoch:
            return None  # the iteration in flight runs it already (Lightning calls set_epoch after it iterates)
        alive = self.run_iterator is not None and self.run_iterator() is not None  # not dropped (a break, Ctrl-C)
        # an iteration that yielded its every batch is over, though its end was not asked for (Lightning's
        # validation takes exactly len() batches); so is one that reached the consumer's own epoch length (a
        # trainer's limit_train_batches), which never asks for the rest
        going_on = run is not None and not run.done and alive and run.position < self._consumed_length(run)
        late = going_on and epoch != run.epoch and run.seen <= 2
        if epoch != self.epoch:
            self.start, self.counted_ahead = None, None
        self.epoch, self.set_since_run = epoch, True
        if not late:
            return None
        message = (
            f"ZarrDataLoader: set_epoch({epoch}) came after the iteration over epoch {run.epoch} began; that "
            f"iteration goes on as epoch {run.epoch} (its batches are of that epoch), and epoch {epoch} starts at the "
            "next iter(). Under Lightning this is a run resumed at an epoch's end with a bare loader, whose position "
            "Lightning does not restore there: use zarrtorch.lightning.ZarrDataModule (it keeps the position in its "
            "own state), or call loader.set_epoch(epoch) before trainer.fit"
        )
        if run.seen == 0:  # nothing is out yet: said only if a batch of it ever is (an iterator dropped unused is not)
            run.late_warning = message
            return None
        return message

    def start_point(self, world: int, num_workers: int) -> tuple[tuple[Segment, ...], int]:
        """(earlier segments, batches already yielded) from which the next iteration starts its epoch on
        ``world`` ranks x ``num_workers`` workers."""
        start = self.start
        if start is None:
            return (), 0
        if isinstance(start, LoaderCheckpoint):
            return resumed_history(start, world, num_workers), start.batches_seen
        return start

    def counted(self, epoch: int) -> int:
        """Batches of ``epoch`` a trainer counts as done that the loader never yielded (:meth:`count_as_done`)."""
        ahead = self.counted_ahead
        return ahead[1] if ahead is not None and ahead[0] == epoch else 0

    def count_as_done(self, batches: int) -> None:
        self.counted_ahead = (self.epoch, int(batches)) if int(batches) > 0 else None

    # -- iterations --------------------------------------------------------------------------------------------
    def repeated(self, shuffle: bool) -> bool:
        """Whether the next iteration runs the epoch the last one finished, without a ``set_epoch`` between."""
        last = self.run
        return last is not None and last.done and not self.set_since_run and shuffle

    def begin(self, history: tuple[Segment, ...], skip: int, length: int) -> EpochRun:
        """The new iteration, from batch ``skip`` of ``length`` after ``history``: the newest from now on."""
        self.start = (history, skip) if history or skip else None  # a restart of this epoch starts here too
        self.run = EpochRun(self.epoch, history, skip, length)
        self.set_since_run = False
        return self.run

    def refused(self) -> bool:
        """A loaded state turned out not to fit the topology of the moment: the epoch starts afresh next time.
        ``True`` when there was one (the error then says the state was not applied)."""
        if not isinstance(self.start, LoaderCheckpoint):
            return False
        self.start = None
        return True

    def finished(self, run: EpochRun) -> None:
        run.done = True
        if self.counted(run.epoch):
            self.counted_ahead = None
        if run.epoch == self.epoch:
            self.start = None  # iterated again without set_epoch, the epoch starts from its beginning

    def load(self, saved: LoaderCheckpoint) -> None:
        """Take up ``saved`` at the next iteration; an iteration in flight is superseded."""
        self.epoch, self.start, self.run, self.set_since_run = saved.epoch, saved, None, True

    # -- what a checkpoint holds -------------------------------------------------------------------------------
    def saved(self, world: int, num_workers: int) -> tuple[int, int, tuple[Segment, ...]]:
        """(epoch, batches done, earlier segments) of a checkpoint now: the iteration in flight while its consumer
        has batches of it to take (what is being trained); its epoch's end as the next epoch's start; before any
        iteration, where the next one starts."""
        run = self.run
        if run is not None and self._position(run) < self._consumed_length(run):  # a trainer may hold batches
            return run.epoch, self._position(run), run.history  # it has not trained yet
        if run is not None and not self.set_since_run:
            return run.epoch + 1, 0, ()  # its last batch yielded: the next epoch's start
        history, seen = self.start_point(world, num_workers)
        return self.epoch, seen, history

    def _consumed_length(self, run: EpochRun) -> int:
        """Batches of ``run``'s epoch the consumer takes: all of them, or the fewer it says it stops at (in its own
        count)."""
        limit = self.consumer_epoch_length() if self.consumer_epoch_length is not None else None
        if limit is None:
            return run.length
        return max(run.start, min(run.length, int(limit) - self.counted(run.epoch)))

    def _position(self, run: EpochRun) -> int:
        """Batches of ``run``'s epoch to count as done: those yielded, or fewer if the consumer says so, but never
        fewer than where ``run`` began (those were trained before it, in an earlier run or job): a state saved
        below that point would describe a segment of negative length, which no loader can resume."""
        consumed = self.consumed_batches() if self.consumed_batches is not None else None
        if consumed is not None and int(consumed) < 0:
            raise ValueError(
                f"consumed_batches() said {consumed} batches were consumed: it must count the batches of this epoch "
                "the consumer has finished with (an integer >= 0), or return None"
            )
        if consumed is None:
            return run.position
        consumed = int(consumed) - self.counted(run.epoch)  # in the trainer's count, not yielded by this loader
        return max(run.start, min(run.position, consumed))
