"""A reference model of ``ZarrDataLoader``, in plain Python lists: the rows every rank yields, batch by batch,
in any epoch, after any resume on any topology, and what each call (``set_epoch``, ``iter``, ``next``,
``state_dict``, ``load_state_dict``, ``len``) does to the loader's position.

It shares the specification with zarrtorch, not its code: the chunk order (a keyed bijection, written
again below with Python integers), the random draws it names (NumPy's generator seeded with ``(seed, epoch,
stream...)``: the cached pieces' order, the shuffle buffer's picks) and the rules of ``zarrtorch.plan``'s
docstring. Everything else is written again here, the slow and obvious way, so that the state machine in
``test_model.py`` compares two independent accounts of an epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.random import SeedSequence, default_rng


def generator(*key: int) -> np.random.Generator:
    return default_rng(SeedSequence([int(k) for k in key]))


class Refused(Exception):
    """The loader must refuse this (too few rows for a batch per rank, a cached epoch on another topology)."""


@dataclass(frozen=True)
class Setup:
    rows: int
    chunk_rows: int
    batch: int
    drop_last: bool
    shuffle: bool
    buffer_chunks: int
    cache: bool
    seed: int
    redeal_every: int = 0  # K: each rank's share kept for K epochs, its order new every epoch (0: dealt every epoch)

    @property
    def row_shuffle(self) -> bool:
        return self.shuffle and self.buffer_chunks > 0


def keyed_order(n: int, seed: int, epoch: int) -> list[int]:
    """The chunk order of ``zarrtorch.order``'s docstring, with Python integers: a 6-round Feistel network on
    2h bits (the least h >= 1 with 4**h >= n), round keys from ``SeedSequence([seed, epoch, 0])``, SplitMix64's
    finaliser as the round function, and positions that land outside ``[0, n)`` sent through again."""
    keys = SeedSequence([seed, epoch, 0]).generate_state(6, dtype=np.uint64).tolist()
    h = 1
    while 4**h < n:
        h += 1
    full, half = 2**64 - 1, 2**h - 1

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & full
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & full
        return z ^ (z >> 31)

    def network(x: int) -> int:
        left, right = x >> h, x & half
        for key in keys:
            left, right = right, left ^ (mix(right ^ key) & half)
        return (left << h) | right

    out = []
    for i in range(n):
        y = network(i)
        while y >= n:
            y = network(y)
        out.append(y)
    return out


def chunk_stream(setup: Setup, epoch: int) -> list[int]:
    """The epoch's rows: whole chunks in the epoch's order (epoch 0's for ``cache``, where it is frozen)."""
    n = -(-setup.rows // setup.chunk_rows)
    chunks = list(range(n))
    if setup.shuffle and n > 1:
        chunks = keyed_order(n, setup.seed, 0 if setup.cache else epoch)
    return [r for c in chunks for r in range(c * setup.chunk_rows, min((c + 1) * setup.chunk_rows, setup.rows))]


def placed_stream(setup: Setup, epoch: int, world: int) -> list[int]:
    """``redeal_every``: the rows of the epoch the shares were last dealt at, cut into the ranks' shares as the row
    budget cuts them (the rows past them last), each share's pieces in an order drawn from
    (seed, epoch, PLACED_PIECES, rank)."""
    base = chunk_stream(setup, epoch - epoch % setup.redeal_every)
    n = len(base)
    per_rank = n // (world * setup.batch) * setup.batch if setup.drop_last else -(-n // world)
    out: list[int] = []
    for rank in range(world):
        share = pieces(base[min(n, rank * per_rank) : min(n, (rank + 1) * per_rank)], setup.chunk_rows)
        order = generator(setup.seed, epoch, PLACED_PIECES, rank).permutation(len(share)) if share else []
        out += [row for k in order for row in share[k]]
    return out + base[min(n, world * per_rank) :]


def pieces(rows: list[int], chunk_rows: int) -> list[list[int]]:
    """``rows`` cut where a chunk ends or the row numbers stop following each other."""
    out: list[list[int]] = []
    for r in rows:
        if out and r == out[-1][-1] + 1 and r // chunk_rows == out[-1][-1] // chunk_rows:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def buffered(rows: list[int], sizes: list[int], setup: Setup, rng) -> list[list[int]]:
    """The batches a worker yields from its ``rows`` through the shuffle buffer (in order without ``rng``)."""
    out: list[list[int]] = []
    if rng is None:
        at = 0
        for b in sizes:
            out.append(rows[at : at + b])
            at += b
        return out
    capacity = max(setup.buffer_chunks * setup.chunk_rows, max(sizes, default=1))
    slots: list[int] = []
    at = 0
    for j, b in enumerate(sizes):
        wanted = max(b, min(capacity, setup.chunk_rows << min(j, 62)))  # fills up over the first batches
        grow = min(max(0, wanted - len(slots)), len(rows) - at)
        slots += rows[at : at + grow]
        at += grow
        take = rng.choice(len(slots), size=b, replace=False).tolist()
        out.append([slots[t] for t in take])
        refill = min(b, len(rows) - at)
        for t in take[:refill]:  # the next rows take the places just emptied
            slots[t] = rows[at]
            at += 1
        holes = take[refill:]
        if holes:  # the stream ran out: the last rows close the holes, in order
            keep = len(slots) - len(holes)
            movers = [i for i in range(keep, len(slots)) if i not in set(holes)]
            for dst, src in zip(sorted(h for h in holes if h < keep), movers, strict=True):
                slots[dst] = slots[src]
            del slots[keep:]
    return out


def segment_batches(
    setup: Setup, epoch: int, stream: list[int], segment: int, world: int, workers: int, rank: int
) -> list[list[int]]:
    """The batches ``rank`` yields, in order, when what is left of the epoch is ``stream``."""
    n, b = len(stream), setup.batch
    if segment and n < (world * b if setup.drop_last else 1):
        return []  # the rest of a resumed epoch: not one batch for every rank
    if setup.drop_last:
        count = n // (world * b)
        if count == 0:
            raise Refused(f"{n} rows cannot give {world} ranks a batch of {b}")
        per_rank, last = count * b, b
    else:
        per_rank = -(-n // world)
        count = -(-per_rank // b)
        last = per_rank - (count - 1) * b
    mine = [stream[(rank * per_rank + i) % n] for i in range(per_rank)]  # past the end: the padding
    streams = max(1, workers)
    base, extra = divmod(count, streams)
    per_worker, first = [], 0
    for w in range(streams):
        mine_w = base + (w >= streams - extra)
        rows = mine[first * b : min((first + mine_w) * b, per_rank)]
        sizes = [b] * mine_w
        if first + mine_w == count and mine_w:
            sizes[-1] = last
        if setup.cache and setup.shuffle and rows:
            cut = pieces(rows, setup.chunk_rows)
            rows = [r for i in generator(setup.seed, epoch, 1, rank, w).permutation(len(cut)) for r in cut[i]]
        key = (setup.seed, epoch, 2, rank, w) + ((segment,) if segment else ())
        per_worker.append(buffered(rows, sizes, setup, generator(*key) if setup.row_shuffle else None))
        first += mine_w
    yielded = []
    for r in range(max((len(x) for x in per_worker), default=0)):  # DataLoader: one from each worker in turn
        yielded += [x[r] for x in per_worker if r < len(x)]
    return yielded


def owned_rows(setup: Setup, stream: list[int], world: int, rank: int) -> set[int]:
    """The rows ``rank`` reads as its own share of ``stream`` (not the padding past the stream's end)."""
    n = len(stream)
    per_rank = n // (world * setup.batch) * setup.batch if setup.drop_last else -(-n // world)
    return set(stream[rank * per_rank : min(n, (rank + 1) * per_rank)])


def epoch_batches(setup: Setup, epoch: int, history: tuple, world: int, workers: int, rank: int) -> list[list[int]]:
    """The batches ``rank`` yields in the part of ``epoch`` after ``history`` ((world, workers, batches) of
    each earlier segment): the rows no rank consumed there, in the epoch's order, split again."""
    if history and setup.cache:
        raise Refused("cache=True freezes the partition on one topology")
    if setup.redeal_every:  # placed on the ranks of the epoch's first segment
        stream = placed_stream(setup, epoch, history[0][0] if history else world)
    else:
        stream = chunk_stream(setup, epoch)
    for index, (w_, k_, done) in enumerate(history):
        consumed: set[int] = set()
        for r in range(w_):
            earlier = segment_batches(setup, epoch, stream, index, w_, k_, r)
            if done > len(earlier):
                raise Refused("the state counts more batches than that segment had")
            own = owned_rows(setup, stream, w_, r)  # a rank's copy of a row another rank pads with is its own
            for batch in earlier[:done]:
                consumed.update(row for row in batch if row in own)  # a padding copy does not count
        stream = [r for r in stream if r not in consumed]
    return segment_batches(setup, epoch, stream, len(history), world, workers, rank)


@dataclass
class Run:
    epoch: int
    history: tuple
    start: int
    length: int
    seen: int = 0
    done: bool = False

    @property
    def position(self) -> int:
        return self.start + self.seen


@dataclass(frozen=True)
class State:
    """What ``state_dict`` says: epoch, position, the topology it was saved on, the earlier segments."""

    epoch: int
    position: int
    world: int
    workers: int
    history: tuple


class ModelLoader:
    """One rank's loader: the epoch the next ``iter()`` runs, where in it that starts, the newest iteration."""

    def __init__(self, setup: Setup, world: int, workers: int, rank: int):
        self.setup, self.world, self.workers, self.rank = setup, world, workers, rank
        self.epoch = 0
        self.start: State | tuple | None = None  # None: the epoch's beginning; a loaded State; (history, skip)
        self.run: Run | None = None
        self.set_since_run = True

    def start_point(self) -> tuple[tuple, int]:
        if self.start is None:
            return (), 0
        if isinstance(self.start, State):
            s = self.start
            if (s.world, s.workers) == (self.world, self.workers):
                return s.history, s.position
            return s.history + ((s.world, s.workers, s.position - sum(h[2] for h in s.history)),), s.position
        return self.start

    def _batches(self, history: tuple, epoch: int | None = None) -> list[list[int]]:
        e = self.epoch if epoch is None else epoch
        return epoch_batches(self.setup, e, history, self.world, self.workers, self.rank)

    def length(self) -> int:
        history = self.start_point()[0]
        return sum(h[2] for h in history) + len(self._batches(history))

    def set_epoch(self, epoch: int) -> None:
        if self.run is not None and not self.run.done and epoch == self.run.epoch == self.epoch:
            return  # the iteration in flight runs that epoch already
        if epoch != self.epoch:
            self.start = None
        self.epoch = epoch
        self.set_since_run = True

    def iter(self) -> list[list[int]]:
        """The batches the new iteration yields."""
        history, skip = self.start_point()
        try:
            full = self._batches(history)
        except Refused:
            if isinstance(self.start, State):
                self.start = None
            raise
        earlier = sum(h[2] for h in history)
        self.start = (history, skip) if history or skip else None
        self.run = Run(self.epoch, history, skip, earlier + len(full))
        self.set_since_run = False
        return full[skip - earlier :]

    def took(self) -> None:
        self.run.seen += 1

    def finished(self) -> None:
        self.run.done = True
        if self.run.epoch == self.epoch:
            self.start = None

    def state(self, consumed: int | None = None, limit: int | None = None) -> State:
        """``consumed``: batches the consumer has finished with, if it says (a trainer that prefetches); ``limit``:
        the batches of an epoch it takes at most, if it says (a trainer's ``limit_train_batches``)."""
        run = self.run
        position = None if run is None else run.position
        if run is not None and consumed is not None:  # never before where the run began: trained before it
            position = max(run.start, min(run.position, consumed))
        end = None if run is None else run.length if limit is None else max(run.start, min(run.length, limit))
        if run is not None and position < end:
            return State(run.epoch, position, self.world, self.workers, run.history)
        if run is not None and not self.set_since_run:
            return State(run.epoch + 1, 0, self.world, self.workers, ())
        history, skip = self.start_point()
        return State(self.epoch, skip, self.world, self.workers, history)

    def load(self, state: State) -> None:
        previous = self.start
        self.start = state
        try:
            self._batches(self.start_point()[0], epoch=state.epoch)  # refused before anything changes
        except Refused:
            self.start = previous
            raise
        self.epoch, self.run, self.set_since_run = state.epoch, None, True


MIX_ORDER = 3  # the mix order's tag, named in zarrtorch._util.random_streams
PLACED_PIECES = 4  # the placed shares' order tag, named there too


@dataclass(frozen=True)
class MixState:
    """What a ``MixedLoader``'s state says: the mix point and every source's state."""

    epoch: int
    drawn_before: tuple
    segment: int
    world: int
    steps: int
    sources: tuple


class ModelMix:
    """One rank's ``MixedLoader`` of per-source batches over :class:`ModelLoader` sources of one batch size: each
    source's target rows per mix epoch in global batches rounded once (halves up), the step order of the mix
    module's docstring, each source running its own epochs on (the next one when its iteration ends), and the
    rest of an epoch resumed on another world size as a new segment of the targets left."""

    def __init__(self, sources: list[ModelLoader], targets: list[int], seed: int):
        self.sources, self.targets, self.seed = sources, list(targets), seed
        self.world, self.batch = sources[0].world, sources[0].setup.batch
        self.epoch = 0
        self.point = (0, (0,) * len(sources), 0, self.world, 0)  # epoch, drawn before, segment, world, steps
        self.left: list[list | None] = [None] * len(sources)  # each source's batches not yet drawn of its iteration

    def order(self) -> list[int]:
        epoch, drawn, segment, world, _ = self.point
        quotas = [
            max(0, int(np.floor((t - d) / (world * self.batch) + 0.5)))
            for t, d in zip(self.targets, drawn, strict=True)
        ]
        steps = [k for k, q in enumerate(quotas) for _ in range(q)]
        return generator(self.seed, epoch, MIX_ORDER, segment).permutation(np.array(steps, dtype=np.int64)).tolist()

    def draw(self, k: int) -> list[int]:
        """The next batch of source ``k``: its current iteration's, or its next own epoch's first."""
        source = self.sources[k]
        if self.left[k] is None:
            self.left[k] = source.iter()
        while not self.left[k]:  # its iteration ended (or, resumed on more ranks, had no batch left)
            source.finished()
            source.set_epoch(source.epoch + 1)
            self.left[k] = source.iter()
        source.took()
        return self.left[k].pop(0)

    def steps(self) -> list[int]:
        """The sources of the steps the next ``iter()`` yields; when none is left, that iteration ends the epoch."""
        left = self.order()[self.point[4] :]
        if not left:
            self.epoch = self.point[0] + 1
            self.point = (self.epoch, (0,) * len(self.sources), 0, self.world, 0)
        return left

    def took(self) -> None:
        epoch, drawn, segment, world, steps = self.point
        self.point = (epoch, drawn, segment, world, steps + 1)
        if steps + 1 == len(self.order()):
            self.epoch = epoch + 1
            self.point = (epoch + 1, (0,) * len(self.sources), 0, self.world, 0)

    def state(self) -> MixState:
        return MixState(*self.point, tuple(s.state() for s in self.sources))

    def load(self, state: MixState) -> None:
        """Take up ``state`` (the sources are this rank's, on the new world)."""
        for source, saved in zip(self.sources, state.sources, strict=True):
            source.load(saved)
        self.left = [None] * len(self.sources)
        epoch, drawn, segment, world, steps = state.epoch, state.drawn_before, state.segment, state.world, state.steps
        self.point, self.epoch = (epoch, drawn, segment, world, steps), epoch
        if world != self.world:
            counts = [self.order()[:steps].count(k) for k in range(len(self.sources))]
            drawn = tuple(d + c * world * self.batch for d, c in zip(drawn, counts, strict=True))
            self.point = (epoch, drawn, segment + 1, self.world, 0)
