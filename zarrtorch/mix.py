"""``MixedLoader``: one training stream drawn from several stores, by weight or by rows per epoch.

Each source is a :class:`~zarrtorch.ZarrDataLoader` of its own (its arrays, chunking, windows, period, workers),
which keeps every guarantee it has alone: its own partition over ranks x workers, equal batches per rank, its
own shuffle and its own resume. The mixed loader only decides which source the next batch comes from:

* **Quotas.** Every mix epoch has a target in rows per source (``rows=``, or ``weights=`` times ``epoch_rows``);
  a source's quota is its target in global batches (``world_size x batch_size`` rows), rounded to the nearest
  one, so each source's count per epoch over all ranks is within half a global batch of its target.
* **Order.** The epoch's steps are the quotas' source indices in an order drawn from (seed, mix epoch) only:
  every rank draws the same source at the same step, so a model with a head per source under DDP runs the same
  parameters on every rank at every step. Each batch carries ``"source"``, the name of the source it holds. The
  order: each source's index repeated its quota's times, in the sources' order, permuted by NumPy's generator
  seeded with ``SeedSequence([seed, epoch, MIX_ORDER, segment])`` (``segment``: 0, or the count of resumes on
  another world size within the epoch).
* **Each row once, then the stated repeat rule.** A source runs its own epochs on through the mix epochs: a quota
  below its epoch continues where it stopped at the next mix epoch, a quota above it runs into its next own epoch
  (a new shuffle). Within one of its own epochs every row (or window start) is drawn once.
* **Resume.** The state holds the mix position and every source's loader state. On the saved topology it
  continues exactly; on another one each source resumes as its loader does elastically, and the rest of the
  epoch's targets (less the rows already drawn) are split again in global batches of the new topology.

Batches are per source (the default: different grids cannot share a batch) or, for sources of one grid,
``batches="mixed"``: every batch holds a fixed number of rows of every source (its loader's batch size, which is
its share), so each source's state is exact at every step and every guarantee above holds as it is.

Under Lightning: :class:`zarrtorch.lightning.MixedDataModule`, which tells the loader what the trainer has consumed
(``consumed_batches``, ``consumer_epoch_length``, ``count_as_done``) as it does for one store.
"""

from __future__ import annotations

import hashlib
import math
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from zarrtorch._util.arguments import INT64_LIMIT, whole_number
from zarrtorch._util.process import TopologyUnknown, check_ranks_agree
from zarrtorch._util.random_streams import MIX_ORDER
from zarrtorch.loader import ZarrDataLoader
from zarrtorch.plan import rng_for

MIX_VERSION = 2  # 2: steps_before
SOURCE = "source"  # the batch key that names a batch's source
PER_SOURCE, MIXED = "per_source", "mixed"


def quotas_of(targets: Sequence[float], global_batches: Sequence[int]) -> tuple[int, ...]:
    """Batches per rank of each source: its target rows in global batches of its own (``world x batch_size``),
    rounded to the nearest whole one (halves up), never below 0. Rounding once keeps every source within half a
    global batch of its target."""
    return tuple(max(0, math.floor(t / g + 0.5)) for t, g in zip(targets, global_batches, strict=True))


def step_order(quotas: Sequence[int], *, seed: int, epoch: int, segment: int) -> np.ndarray:
    """The source of every step of an epoch's segment: each source index its quota's times, in an order that
    depends only on (seed, epoch, segment, quotas), so every rank computes the same."""
    steps = np.repeat(np.arange(len(quotas), dtype=np.int64), np.asarray(quotas, dtype=np.int64))
    return rng_for(seed, epoch, MIX_ORDER, segment).permutation(steps)


@dataclass(frozen=True)
class MixPoint:
    """Where a mix epoch stands: its ``epoch``, the rows drawn per source in earlier segments (on other
    topologies), the segment's number, the world size it runs on, the steps of it already yielded, and the steps
    every rank yielded in the earlier segments (a trainer counts them in the epoch)."""

    epoch: int
    drawn_before: tuple[int, ...]
    segment: int
    world_size: int
    steps: int
    steps_before: int = 0

    def on(self, world: int, batches: Sequence[int], global_batches: Sequence[int]) -> MixPoint:
        """This point as a new segment on ``world`` ranks when it ran on another: the rows of the ``batches`` per rank
        of each source its yielded steps drew move into ``drawn_before``. On the same world size, itself."""
        if world == self.world_size:
            return self
        drawn = tuple(d + c * g for d, c, g in zip(self.drawn_before, batches, global_batches, strict=True))
        return MixPoint(self.epoch, drawn, self.segment + 1, world, 0, self.steps_before + self.steps)


class MixedLoader:
    """Batches of several :class:`~zarrtorch.ZarrDataLoader` sources, mixed by weight or by rows per epoch.

    Args:
        sources: ``{name: loader}`` (or a list: names ``"0"``, ``"1"``...), each used by this loader only. With
            per-source batches every loader has the same ``batch_size`` (a step's size does not change with its
            source).
        weights: each source's share of an epoch's rows (``{name: w}`` or a list), >= 0 with a positive sum.
        rows: each source's rows per epoch, over all ranks (instead of ``weights``).
        epoch_rows: rows of a mix epoch with ``weights`` (default: the rows of every source together).
        Neither ``weights`` nor ``rows``: every source's rows once per epoch (its own size).
        seed: fixes every epoch's order of sources (shared by every rank).
        batches: ``"per_source"``: every batch from one source, ``batch["source"]`` its name. ``"mixed"``: every
            batch holds ``batch_size`` rows of every source's loader (its share: no ``weights``/``rows``; sources of
            the same columns, shapes and dtypes, each of ``drop_last=True``), ``batch["source"]`` each row's source
            index in :attr:`names`.

    A source's rows beyond its quota wait for the next mix epoch; a quota above its size runs into its next own
    epoch (a new shuffle). Memory: every source's loader keeps its workers and buffers, so two sources of
    ``num_workers=2`` start 4 worker processes (:func:`zarrtorch.loader_memory` counts them all).
    """

    def __init__(
        self,
        sources: Mapping[str, ZarrDataLoader] | Sequence[ZarrDataLoader],
        *,
        weights: Mapping[str, float] | Sequence[float] | None = None,
        rows: Mapping[str, int] | Sequence[int] | None = None,
        epoch_rows: int | None = None,
        seed: int = 0,
        batches: str = PER_SOURCE,
    ):
        self.sources = named_sources(sources)
        names = list(self.sources)
        if batches not in (PER_SOURCE, MIXED):
            raise ValueError(f"batches must be 'per_source' or 'mixed', got {batches!r}")
        self.mixed = batches == MIXED
        if self.mixed:
            self.batch_sizes = mixed_batch_sizes(self.sources, weights, rows)
            self.targets = epoch_targets(self.sources, list(self.batch_sizes), None, epoch_rows)
        else:
            self.batch_sizes = (common_batch_size(self.sources),) * len(names)
            self.targets = epoch_targets(self.sources, weights, rows, epoch_rows)
        self.batch_size = sum(self.batch_sizes) if self.mixed else self.batch_sizes[0]
        self.seed = whole_number(seed, "seed (shared by every rank)", least=0, below=INT64_LIMIT)
        self.epoch = 0
        self._start: MixPoint | None = None  # where the next iter() starts: None, a loaded state's point
        self._iters: dict[str, object] = {}  # each source's iterator in flight, kept across mix epochs
        self._run: MixRun | None = None  # the newest iteration
        self._names = names
        self._counted_ahead: tuple[int, int] | None = None  # (epoch, steps) a trainer counts as done
        # what a consumer says, when it can (a trainer: see zarrtorch.lightning): the steps of this mix epoch it has
        # finished with (it may fetch ahead), and the most it takes of an epoch (``limit_train_batches``)
        self.consumed_batches: Callable[[], int | None] | None = None
        self.consumer_epoch_length: Callable[[], int | None] | None = None
        self._warned_worlds: set[int] = set()  # world sizes whose never-drawn sources were said
        self._check_quotas()
        for name, loader in self.sources.items():
            loader.consumed_batches = _SourceConsumed(self, name)

    def _check_quotas(self, world: int | None = None) -> None:
        """The quotas on ``world`` ranks, checked: a quota is its target rounded to whole global batches, so targets
        each under half of one would give every epoch no step at all (refused: a training loop would run its
        epochs on nothing), and a single source under half of its own is never drawn (said). Before a launcher's
        process group exists the world size is not known yet: checked on one rank then (no step there, none on
        more), and again by ``iter()``."""
        if world is None:
            try:
                world = self.topology()[1]
            except TopologyUnknown:
                world = 1
        quotas = self.quotas(MixPoint(0, (0,) * len(self._names), 0, world, 0))
        if sum(quotas) > 0:
            self._warn_of_sources_never_drawn(quotas, world)
            return
        targets = dict(zip(self._names, self.targets, strict=True))
        rows = (
            f"its {sum(self.targets)} rows (targets {targets}) are"
            if self.mixed
            else f"its targets {targets} rows are each"
        )
        raise ValueError(
            f"a MixedLoader's epoch would have no step: {rows} under half a global batch ({world * self.batch_size} "
            f"rows: world_size {world} x batch_size {self.batch_size}), the unit a quota is rounded to. Give more rows "
            "per epoch (epoch_rows= or rows=), or a smaller batch_size"
        )

    def _warn_of_sources_never_drawn(self, quotas: tuple[int, ...], world: int) -> None:
        """A source whose target is under half its global batch rounds to no batch, and the rounding is the same
        every epoch: asked for, it would never be trained on. Said once per world size."""
        if self.mixed or world in self._warned_worlds:
            return
        self._warned_worlds.add(world)
        never = {n: t for n, t, q in zip(self._names, self.targets, quotas, strict=True) if q == 0 and t > 0}
        if never:
            globals_ = dict(zip(self._names, self.global_batches(world), strict=True))
            warnings.warn(
                f"MixedLoader: sources {sorted(never)} get no batch in any epoch: their targets (rows {never}) are "
                f"each under half of one of their global batches (rows: {globals_}, world_size {world} x "
                "batch_size), the unit a quota is rounded to. Give them more weight or rows, more rows per epoch "
                "(epoch_rows=), or a smaller batch_size",
                stacklevel=3,
            )

    # -- the schedule --------------------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """The sources' names, in order (mixed batches give each row's source as an index into them)."""
        return list(self._names)

    def topology(self) -> tuple[int, int]:
        """(rank, world size) of the sources, which must agree."""
        found = {name: loader.topology() for name, loader in self.sources.items()}
        if len(set(found.values())) > 1:
            raise ValueError(
                f"the sources of a MixedLoader run on different topologies (name: (rank, world_size)) {found}: give "
                "them the same rank=/world_size=, or none (the process group's)"
            )
        return next(iter(found.values()))

    def global_batches(self, world: int) -> tuple[int, ...]:
        """Rows of one global batch of each source on ``world`` ranks."""
        return tuple(world * b for b in self.batch_sizes)

    def start_point(self, world: int) -> MixPoint:
        """Where the next ``iter()`` starts its epoch on ``world`` ranks (a loaded state's point, moved to a new
        segment when it was saved on another world size), in the epoch ``set_epoch`` chose."""
        start = self._start
        if start is None or start.epoch != self.epoch:
            return MixPoint(self.epoch, (0,) * len(self._names), 0, world, 0)
        saved_order = self.order(start)
        return start.on(world, self.batches_drawn(saved_order[: start.steps]), self.global_batches(start.world_size))

    def quotas(self, point: MixPoint) -> tuple[int, ...]:
        """Batches per rank of each source in ``point``'s segment: what is left of every target, on its world. Mixed
        batches: the same for every source, the steps left of the whole epoch."""
        left = [t - d for t, d in zip(self.targets, point.drawn_before, strict=True)]
        if self.mixed:
            steps = quotas_of([sum(left)], [point.world_size * self.batch_size])[0]
            return (steps,) * len(left)
        return quotas_of(left, self.global_batches(point.world_size))

    def order(self, point: MixPoint) -> np.ndarray:
        """The source index of every step of ``point``'s segment (mixed batches: ``-1``, every source)."""
        if self.mixed:
            return np.full(self.quotas(point)[0], -1, dtype=np.int64)
        return step_order(self.quotas(point), seed=self.seed, epoch=point.epoch, segment=point.segment)

    def batches_drawn(self, steps: np.ndarray) -> tuple[int, ...]:
        """Batches per rank of each source that ``steps`` (of an order) draw."""
        if self.mixed:
            return (len(steps),) * len(self._names)
        return tuple(int(c) for c in np.bincount(steps, minlength=len(self._names)))

    def __len__(self) -> int:
        """Steps of this rank in the epoch the next ``iter()`` runs, from its start: a resumed state's steps
        yielded before count too (on another world size: those of the earlier segments plus the rest), as a
        ``ZarrDataLoader`` counts them and a trainer, resumed with its count of them, expects."""
        point = self.start_point(self.topology()[1])
        return point.steps_before + len(self.order(point)) + self._counted(self.epoch)

    def count_as_done(self, steps: int) -> None:
        """A trainer counts ``steps`` steps of the epoch the next ``iter()`` runs as done that this loader never
        yielded (Lightning resumed at an epoch's end on another world size keeps the old epoch's count): ``len()``
        counts them too, and the trainer's count of consumed steps is taken less them. Until that epoch ends or
        another one is set."""
        self._counted_ahead = (self.epoch, int(steps)) if int(steps) > 0 else None

    def batches_before(self) -> int:
        """Steps of the epoch the next ``iter()`` runs that were yielded before it (by a loaded state)."""
        point = self.start_point(self.topology()[1])
        return point.steps_before + point.steps

    def _counted(self, epoch: int) -> int:
        ahead = self._counted_ahead
        return ahead[1] if ahead is not None and ahead[0] == epoch else 0

    @property
    def sampler(self) -> _EpochSetter:
        """Where Lightning calls ``set_epoch`` every epoch (it looks for ``loader.sampler.set_epoch`` and nowhere
        else): without it a ``limit_train_batches`` epoch, which never runs to its end, would run again."""
        return _EpochSetter(self)

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the mix epoch the next ``iter()`` runs (its order of sources). The sources run their own
        epochs on: their rows continue where the last mix epoch left them."""
        epoch = whole_number(epoch, "epoch", least=0, below=INT64_LIMIT)
        late = self._late_set_epoch(epoch)
        if epoch != self.epoch:
            self._counted_ahead = None
        self.epoch = epoch
        if late is not None:
            warnings.warn(late, stacklevel=2)

    def _late_set_epoch(self, epoch: int) -> str | None:
        """The warning a ``set_epoch(epoch)`` calls for, as a ZarrDataLoader's does (:mod:`zarrtorch.position`):
        the iteration of another mix epoch began just before and goes on as its own epoch, which a trainer counts
        as ``epoch``. Kept for its first step when none is out yet (an iterator dropped unused says nothing)."""
        run = self._run
        if run is None or run.done or epoch == run.point.epoch == self.epoch:
            return None  # nothing in flight, or it runs this epoch already (Lightning sets it after iter())
        alive = run.iterator is not None and run.iterator() is not None  # not dropped (a break, Ctrl-C)
        # a run that gave every step the consumer takes is over, though its end was not asked for
        going_on = alive and run.point.steps + run.seen < self._consumed_length(run)
        if not going_on or epoch == run.point.epoch or run.seen > 2:
            return None
        message = (
            f"MixedLoader: set_epoch({epoch}) came after the iteration over mix epoch {run.point.epoch} began; that "
            f"iteration goes on as epoch {run.point.epoch} (its order of sources), and epoch {epoch} starts at the "
            "next iter(). Under Lightning this is a run resumed at an epoch's end with a bare MixedLoader, whose "
            "position Lightning does not restore there: use zarrtorch.lightning.MixedDataModule (it keeps the "
            "position in its own state), or call mix.set_epoch(epoch) before trainer.fit"
        )
        if run.seen == 0:
            run.late_warning = message  # said at its first step, if one is ever drawn
            return None
        return message

    # -- iterating -----------------------------------------------------------------------------------------------
    def __iter__(self):
        rank, world = self.topology()
        self._check_quotas(world)
        last = self._run
        if last is not None and not last.done and last.point.steps + last.seen == len(last.order):
            self._finished(last)  # its every step was taken, only its end not asked for: it is over
        point = self.start_point(world)
        if last is not None and not last.done and last.point.epoch == point.epoch:
            self._restart(last)
        # a source's own epoch runs on across mix epochs, and its loader checks its store only when one begins:
        # a store written again between mix epochs would be read on with the old plan, shape and dtype
        for name in self._iters:
            pending = self.sources[name].data.check_store_unchanged()  # a continued source: checked at once
            if pending is not None:
                pending.result()
        order = self.order(point)
        if self._checks_ranks():
            check_ranks_agree(
                f"mix of {self._names}, targets {self.targets}, epoch {point.epoch}, segment {point.segment}, "
                f"{len(order)} steps from step {point.steps}, order {_digest(order)}",
                f"epoch {point.epoch} of a MixedLoader",
            )
        run = MixRun(point, order, {name: loader.state_dict() for name, loader in self.sources.items()})
        self._run = run
        steps = _MixSteps(self._steps(run))
        run.iterator = weakref.ref(steps)
        return steps

    def _steps(self, run: MixRun):
        for step in range(run.point.steps, len(run.order)):
            if self._run is not run:
                raise RuntimeError(
                    "this iterator of a MixedLoader was superseded: iter() was called again since it was made; "
                    "use the newest iterator"
                )
            index = int(run.order[step])
            if index < 0:
                batch = mixed_batch([self._next_of(name) for name in self._names])
            else:
                batch = {**self._next_of(self._names[index]), SOURCE: self._names[index]}
            run.seen = step + 1 - run.point.steps
            if run.late_warning is not None:
                warnings.warn(run.late_warning, stacklevel=2)
                run.late_warning = None
            yield batch
        if not run.done:
            self._finished(run)

    def _finished(self, run: MixRun) -> None:
        """``run`` took every step of its epoch: the next ``iter()`` runs the next mix epoch (unless ``set_epoch``
        says another)."""
        run.done = True
        self._start = None
        if self._counted(run.point.epoch):
            self._counted_ahead = None
        if self.epoch == run.point.epoch:
            self.epoch = run.point.epoch + 1

    def _next_of(self, name: str) -> dict:
        """The next batch of source ``name``, into its next own epoch when its current one has ended."""
        loader = self.sources[name]
        for _ in range(2):
            if name not in self._iters:
                self._iters[name] = iter(loader)
            try:
                return next(self._iters[name])
            except StopIteration:
                del self._iters[name]
                loader.set_epoch(loader.epoch + 1)
            except KeyboardInterrupt:
                # the source's iterator refuses to go on after it (it may have taken a batch it did not hand out):
                # its next step resumes its own epoch after the batches it handed out
                del self._iters[name]
                loader.load_state_dict(loader.state_dict())
                raise
        raise RuntimeError(f"source {name!r} of a MixedLoader yielded no batch in a whole epoch of its own")

    def _restart(self, run: MixRun) -> None:
        """An unfinished iteration of this epoch is run again from its start: every source goes back to where it
        stood then, so no row of the abandoned steps is lost."""
        load_all(self.sources, run.source_states)
        self._iters = {}

    def _checks_ranks(self) -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized() and all(s.check_ranks for s in self.sources.values())

    # -- state -----------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The mix position (epoch, segment, steps yielded, rows drawn in earlier segments, world size) and every
        source's loader state, as a plain dict. A finished epoch is saved as the next one's start."""
        rank, world = self.topology()
        run = self._run
        if run is not None and not run.done:
            p, steps = run.point, self._steps_consumed(run)
            point = MixPoint(p.epoch, p.drawn_before, p.segment, p.world_size, steps, p.steps_before)
            if steps >= self._consumed_length(run):  # every step taken: the next epoch's start
                point = MixPoint(p.epoch + 1, (0,) * len(self._names), 0, world, 0)
        else:
            point = self.start_point(world)
        return {
            "mix_version": MIX_VERSION,
            "names": list(self._names),
            "targets": list(self.targets),
            "batch_sizes": list(self.batch_sizes),
            "batches": MIXED if self.mixed else PER_SOURCE,
            "seed": self.seed,
            "epoch": point.epoch,
            "segment": point.segment,
            "world_size": point.world_size,
            "steps": point.steps,
            "drawn_before": list(point.drawn_before),
            "steps_before": point.steps_before,
            "sources": {name: loader.state_dict() for name, loader in self.sources.items()},
        }

    def _steps_consumed(self, run: MixRun) -> int:
        """Steps of ``run``'s epoch to count as done: those yielded, or fewer if the consumer says so (it may
        fetch ahead), never fewer than where ``run`` began."""
        yielded = run.point.steps + run.seen
        consumed = self.consumed_batches() if self.consumed_batches is not None else None
        if consumed is None:
            return yielded
        # in the trainer's count: steps it counts as done that were never yielded, and the earlier segments'
        consumed = int(consumed) - self._counted(run.point.epoch) - run.point.steps_before
        return max(run.point.steps, min(yielded, consumed))

    def _consumed_length(self, run: MixRun) -> int:
        """Steps of ``run``'s epoch the consumer takes: all of them, or the fewer it says it stops at."""
        limit = self.consumer_epoch_length() if self.consumer_epoch_length is not None else None
        if limit is None:
            return len(run.order)
        limit = int(limit) - self._counted(run.point.epoch) - run.point.steps_before
        return max(run.point.steps, min(len(run.order), limit))

    def unconsumed_of(self, name: str) -> int:
        """Batches of source ``name`` this loader has yielded that its consumer has not finished with (0 without a
        ``consumed_batches`` hook): a checkpoint puts them back into the source's state."""
        run = self._run
        if run is None or run.done or self.consumed_batches is None:
            return 0
        ahead = run.order[self._steps_consumed(run) : run.point.steps + run.seen]
        index = self._names.index(name)
        return len(ahead) if self.mixed else int(np.count_nonzero(ahead == index))

    def load_state_dict(self, state: dict, *, allow_other_data: bool | Mapping[str, bool] = False) -> None:
        """Continue the saved mix epoch: exactly on the saved world size; on another, every source resumes as its
        loader does elastically and the rest of each target is split in the new global batches. The sources,
        targets, batch size and seed must be the saved ones. Everything is checked before anything changes.
        ``allow_other_data``: as :meth:`ZarrDataLoader.load_state_dict`, for every source or ``{name: bool}``."""
        differences = [
            f"{key}: saved {state.get(key)!r}, now {now!r}"
            for key, now in (
                ("mix_version", MIX_VERSION),
                ("names", list(self._names)),
                ("targets", list(self.targets)),
                ("batch_sizes", list(self.batch_sizes)),
                ("batches", MIXED if self.mixed else PER_SOURCE),
                ("seed", self.seed),
            )
            if state.get(key) != now
        ]
        if differences:
            raise ValueError(
                "cannot resume this MixedLoader: the state was saved with other sources or settings ("
                + "; ".join(differences)
                + "). Build it with the saved sources (same names, order), weights or rows, batch size and seed"
            )
        point = MixPoint(
            whole_number(state["epoch"], "epoch", least=0),
            tuple(int(d) for d in state["drawn_before"]),
            whole_number(state["segment"], "segment", least=0),
            whole_number(state["world_size"], "world_size", least=1),
            whole_number(state["steps"], "steps", least=0),
            whole_number(state["steps_before"], "steps_before", least=0),
        )
        saved_sources = state.get("sources")
        if not isinstance(saved_sources, Mapping) or set(saved_sources) != set(self._names):
            raise ValueError(f"the state's sources {list(saved_sources or ())} are not this loader's {self._names}")
        load_all(self.sources, saved_sources, allow_other_data)
        self._start, self.epoch = point, point.epoch
        self._run, self._iters, self._counted_ahead = None, {}, None


@dataclass
class MixRun:
    """One iteration of a mix epoch: where it started, its order, the sources' states when it began (a restart
    goes back to them) and the steps it has yielded."""

    point: MixPoint
    order: np.ndarray
    source_states: dict
    seen: int = 0
    done: bool = False
    iterator: weakref.ref | None = None  # its iterator, while something holds it
    late_warning: str | None = None  # said at its first step: a set_epoch of another epoch came before it


def load_all(
    sources: dict[str, ZarrDataLoader], states: Mapping[str, dict], allow_other_data: bool | Mapping[str, bool] = False
) -> None:
    """Load every source's state, or none: a source that refuses its state puts the ones loaded before back.
    ``allow_other_data``: for every source, or ``{name: bool}``."""
    allowed = {
        n: allow_other_data.get(n, False) if isinstance(allow_other_data, Mapping) else allow_other_data
        for n in sources
    }
    before = {name: loader.state_dict() for name, loader in sources.items()}
    done = []
    try:
        for name, loader in sources.items():
            loader.load_state_dict(states[name], allow_other_data=allowed[name])
            done.append(name)
    except Exception:
        for name in done:
            sources[name].load_state_dict(before[name])
        raise


class _MixSteps:
    """A mix epoch's steps, refused once a KeyboardInterrupt or an error came out of one: the generator under it
    ended there, and going on would have ended the epoch early, silently. A new ``iter()`` runs the epoch again from
    its start (each source back where it stood then); ``set_epoch`` then ``iter()`` goes on to another."""

    def __init__(self, steps):
        self._steps, self._ended_by = steps, None

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self._ended_by is not None:
            raise RuntimeError(
                f"this iterator of a MixedLoader {self._ended_by}: it cannot go on without ending the "
                "epoch early. Call iter(mix) to run the epoch again from its start, or mix.set_epoch(epoch) then "
                "iter(mix)"
            )
        try:
            return next(self._steps)
        except StopIteration:
            raise
        except KeyboardInterrupt:
            self._ended_by = "was interrupted (a KeyboardInterrupt inside a step)"
            raise
        except Exception as exc:
            self._ended_by = f"stopped at an error ({type(exc).__name__}, raised by an earlier next(), above)"
            raise


class _SourceConsumed:
    """A source's ``consumed_batches``: the batches of its own epoch it has yielded, less those the mix's consumer
    has not finished with (it may read ahead; a checkpoint must hold them as not yet trained). ``None``
    (all yielded) when the mix has nothing to subtract. Holds the mix by weak reference (no loader cycle)."""

    def __init__(self, mix: MixedLoader, name: str):
        self._mix, self._name = weakref.ref(mix), name

    def __call__(self) -> int | None:
        mix = self._mix()
        ahead = mix.unconsumed_of(self._name) if mix is not None else 0
        if ahead == 0:
            return None
        run = mix.sources[self._name].position.run
        if run is None or ahead > run.seen:
            raise RuntimeError(
                f"source {self._name!r} of a MixedLoader: its consumer holds {ahead} of its batches, more than its "
                "current epoch has yielded; a checkpoint cannot put them back (consume all but the last batch before "
                "saving)"
            )
        return run.position - ahead


class _EpochSetter:
    """``MixedLoader.sampler``: forwards ``set_epoch`` (what Lightning calls every epoch)."""

    def __init__(self, mix: MixedLoader):
        self._mix = mix

    def set_epoch(self, epoch: int) -> None:
        self._mix.set_epoch(epoch)


def _digest(order: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(order, dtype=np.int64).tobytes(), digest_size=8).hexdigest()


# -- checking what a user passes ----------------------------------------------------------------------------------
def named_sources(sources) -> dict[str, ZarrDataLoader]:
    """``{name: loader}`` from a mapping or a list, each a ZarrDataLoader given once, with no column ``"source"``."""
    if isinstance(sources, Mapping):
        named = {str(k): v for k, v in sources.items()}
        if len(named) != len(sources):
            raise ValueError(f"the names of a MixedLoader's sources must differ as strings, got {list(sources)}")
    elif isinstance(sources, Sequence) and not isinstance(sources, str):
        named = {str(i): v for i, v in enumerate(sources)}
    else:
        raise TypeError(f"sources must be {{name: ZarrDataLoader}} or a list of them, got {type(sources).__name__}")
    if len(named) < 1:
        raise ValueError("a MixedLoader needs at least one source")
    for name, loader in named.items():
        if not isinstance(loader, ZarrDataLoader):
            raise TypeError(f"source {name!r} must be a zarrtorch.ZarrDataLoader, got {type(loader).__name__}")
        if SOURCE in loader.data.out_columns:
            raise ValueError(
                f"source {name!r} has a column named {SOURCE!r}, the key a MixedLoader adds to say a batch's "
                "source: rename it (ZarrIterableDataset(variables=...) or stack=)"
            )
    seen: dict[int, str] = {}
    for name, loader in named.items():
        if id(loader) in seen:
            raise ValueError(
                f"sources {seen[id(loader)]!r} and {name!r} are the same ZarrDataLoader: give each source a loader of "
                "its own (two loaders may share one dataset)"
            )
        seen[id(loader)] = name
    return named


def common_batch_size(sources: dict[str, ZarrDataLoader]) -> int:
    """The batch size every source has; refused when they differ (a step's size would change with its source)."""
    sizes = {name: loader.spec.batch_size for name, loader in sources.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"the sources of a MixedLoader have other batch sizes {sizes}: a training step's size (and its learning "
            "rate) would change with the source. Give every source's ZarrDataLoader the same batch_size"
        )
    return next(iter(sizes.values()))


def mixed_batch_sizes(sources: dict[str, ZarrDataLoader], weights, rows) -> tuple[int, ...]:
    """Each source's rows in a mixed batch: its loader's batch size, which is its share (no ``weights``/``rows``).
    Refused when the sources' batches cannot be stacked: other columns, shapes or dtypes (other grids), or other
    extra keys (``return_index``, ``return_padding``); and for a source of ``drop_last=False``, whose own epochs end
    in a short batch (:func:`refuse_short_batches`)."""
    if weights is not None or rows is not None:
        sizes = {name: loader.spec.batch_size for name, loader in sources.items()}
        raise ValueError(
            "with batches='mixed' a source's share is its ZarrDataLoader's batch_size (every batch holds that many "
            f"rows of it; here {sizes}): leave weights= and rows= out, and give each source's loader the batch size "
            "of its share"
        )
    first_name, first = next(iter(sources.items()))
    for name, loader in sources.items():
        kept = [(ds.out_columns, ds.return_index, ds.return_padding) for ds in (first.data, loader.data)]
        if kept[0] != kept[1]:
            raise ValueError(
                f"batches='mixed' stacks the rows of every source in one batch, but sources {first_name!r} and "
                f"{name!r} give other columns (name: (row shape, dtype), return_index, return_padding): {kept[0]} and "
                f"{kept[1]}. Different grids cannot share a batch: use batches='per_source'"
            )
    refuse_short_batches(sources)
    return tuple(loader.spec.batch_size for loader in sources.values())


def refuse_short_batches(sources: dict[str, ZarrDataLoader]) -> None:
    """Mixed batches hold every source's batch size of rows at every step: a source whose loader keeps its last,
    short batch (``drop_last=False``) would put fewer of its rows in the step that ends each of its own epochs."""
    short = [name for name, loader in sources.items() if not loader.spec.drop_last]
    if short:
        raise ValueError(
            f"batches='mixed' holds every source's batch_size of rows in each batch, but some loaders have "
            f"drop_last=False (sources {short}): each of their own epochs ends in a short batch, and that step would "
            "hold fewer of its rows than its share. Give each source's ZarrDataLoader drop_last=True"
        )


def mixed_batch(batches: list[dict]) -> dict:
    """One batch of the rows of every source's batch, in the sources' order; ``"source"`` gives each row's source
    (its index in the loader's ``names``)."""
    import torch

    keys = [sorted(b) for b in batches]
    if any(k != keys[0] for k in keys):
        raise ValueError(
            f"batches='mixed': the sources' batches have other keys {keys} (a transform?): they must agree"
        )
    out = {key: torch.cat([b[key] for b in batches]) for key in batches[0]}
    counts = [len(next(iter(b.values()))) for b in batches]
    out[SOURCE] = torch.repeat_interleave(torch.arange(len(batches)), torch.tensor(counts))
    return out


def per_source(value, names: list[str], what: str) -> list:
    """``value`` (``{name: x}`` or a list in the sources' order) as a list in the sources' order."""
    if isinstance(value, Mapping):
        given = {str(k): v for k, v in value.items()}
        if set(given) != set(names):
            raise ValueError(f"{what} must name every source once: sources {names}, {what} names {list(given)}")
        return [given[n] for n in names]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence | np.ndarray):
        raise TypeError(f"{what} must be {{name: value}} or a list of one value per source, got {value!r}")
    if len(value) != len(names):
        raise ValueError(f"{what} has {len(value)} values for {len(names)} sources {names}")
    return list(value)


def epoch_targets(sources: dict[str, ZarrDataLoader], weights, rows, epoch_rows) -> tuple[int, ...]:
    """Rows per mix epoch of each source (over all ranks), from ``weights`` (times ``epoch_rows``), ``rows``, or
    every source's own size."""
    names = list(sources)
    sizes = [loader.spec.rows for loader in sources.values()]
    if weights is not None and rows is not None:
        raise ValueError("give a MixedLoader weights= or rows=, not both")
    if rows is not None:
        if epoch_rows is not None:
            raise ValueError("epoch_rows= goes with weights=; with rows= the epoch is their sum")
        counts = [
            whole_number(r, f"rows of source {n!r}", least=0)
            for n, r in zip(names, per_source(rows, names, "rows"), strict=True)
        ]
        if sum(counts) == 0:
            raise ValueError(f"rows {dict(zip(names, counts, strict=True))} sum to 0: an epoch needs a row")
        return tuple(counts)
    if weights is None:
        if epoch_rows is not None:
            raise ValueError("epoch_rows= goes with weights=")
        return tuple(sizes)
    shares = [_weight(w, n) for n, w in zip(names, per_source(weights, names, "weights"), strict=True)]
    if sum(shares) <= 0:
        raise ValueError(
            f"weights {dict(zip(names, shares, strict=True))} sum to 0: give at least one source a positive weight"
        )
    total = sum(sizes) if epoch_rows is None else whole_number(epoch_rows, "epoch_rows", least=1)
    return tuple(round(total * s / sum(shares)) for s in shares)


def _weight(value, name: str) -> float:
    try:
        w = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"weight of source {name!r} must be a number >= 0, got {value!r}") from None
    if not math.isfinite(w) or w < 0:
        raise ValueError(f"weight of source {name!r} must be a finite number >= 0, got {value!r}")
    return w
