"""The real ZarrDataLoader driven through random sequences of the calls users make, against the reference model
(``loader_model.py``): every rank of a job (1-3 ranks x 0-2 workers) in lockstep, as DDP runs them.

Calls: build (rank, world size, workers, drop_last, shuffle, buffer, cache, transport, persistent workers, the
batch order (``batch_order="rank"``: the batches of no worker, whatever the workers),
samples that are rows or windows of time steps: history, lead, stride, a gap, and the store read from local disk
or over HTTP through a node's chunk cache of the example's own, filled by its first epoch and read by the next),
``set_epoch``, ``iter``, ``next`` k times, break, a second ``iter`` while one runs, ``state_dict`` then a new
job with ``load_state_dict`` on another topology (mid-epoch or at an epoch's end, with a consumer that says how
many batches of an epoch it takes), the same in Lightning's order (``iter`` before ``set_epoch``), a second
loader on the same dataset running another epoch meanwhile, a state refused for its settings or for another
store's data, ``len``.

Invariants after every step: each batch equals the model's, row for row, with its data; ``len()`` equals
the model's on every rank, and every rank's is the same; a state equals the model's; an iteration that ran
out covers its epoch (every row once, fewer repeats than the ranks of its segments; with ``drop_last``, no row
twice and fewer than ``world x batch`` left out), counted on the rows actually yielded; no call takes more
than ``DEADLINE_S``. CI runs ``ZARRTORCH_FUZZ_EXAMPLES`` (default 15) derandomized examples; ``make fuzz``
runs many more, randomized.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import os
import shutil
import signal
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from loader_model import ModelLoader, ModelMix, Refused, Setup, State

from zarrtorch import MixedLoader, ReadOptions, ZarrDataLoader, ZarrIterableDataset, prepare_zarr
from zarrtorch.course.servers import HttpStoreServer
from zarrtorch.windows import Windows

EXAMPLES = int(os.environ.get("ZARRTORCH_FUZZ_EXAMPLES", "15"))
FUZZING = "ZARRTORCH_FUZZ_EXAMPLES" in os.environ
DEADLINE_S = 60
STORES = [(37, 5), (64, 8), (23, 23), (30, 1)]  # (rows, chunk rows): partial last chunk, even, one chunk, 1-row
_ROOT = Path(tempfile.mkdtemp(prefix="zarrtorch-model-"))
atexit.register(shutil.rmtree, _ROOT, True)


def store_path(rows: int, chunk: int, shift: float = 0.0) -> Path:
    """A store of ``rows`` rows: row ``i`` holds ``(i + shift, -i)`` (``shift``: another store of the same shape)."""
    path = _ROOT / f"r{rows}c{chunk}s{shift:g}.zarr"
    if not path.exists():
        x = np.arange(rows, dtype=np.float32)[:, None] * np.array([1.0, -1.0], dtype=np.float32)
        x[:, 0] += shift
        prepare_zarr({"x": x}, path, chunk_rows=chunk, progress=False)
    return path


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout(f"a call took longer than {DEADLINE_S} s: stuck")


def deadline(method):
    """Fail a rule (or invariant) that runs longer than DEADLINE_S (SIGALRM: the test runs in the main thread)."""

    def wrapped(self, *args, **kwargs):
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(DEADLINE_S)
        try:
            return method(self, *args, **kwargs)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)

    wrapped.__name__ = method.__name__
    wrapped.__doc__ = method.__doc__
    return wrapped


class LoaderMachine(RuleBasedStateMachine):
    JOB = ("world", "workers", "loaders", "models", "iters", "expected", "yielded")

    def make_job(self, world: int, workers: int) -> dict:
        """Start a job of ``world`` ranks x ``workers`` workers; returns the job it replaces (restore_job)."""
        old = {name: getattr(self, name, None) for name in self.JOB}
        self.world, self.workers = world, workers
        extra = {"persistent_workers": self.persistent, "multiprocessing_context": "fork"} if workers else {}
        if workers and self.transport:
            extra["transport"] = self.transport
        settings = dict(batch_size=self.setup.batch, drop_last=self.setup.drop_last, num_workers=workers)
        settings["batch_order"] = self.batch_order
        self.loaders = [
            ZarrDataLoader(self.dataset, rank=r, world_size=world, **settings, **extra) for r in range(world)
        ]
        self.models = [ModelLoader(self.setup, world, self.planned(workers), rank) for rank in range(world)]
        self.iters: list | None = None
        self.expected: list[list[list[int]]] = []
        self.yielded: list[list[list[int]]] = []  # the batches (rows) each rank yielded in the current iteration
        return old

    def planned(self, workers: int) -> int:
        """The workers the batches are planned for: with ``batch_order="rank"`` none, whatever reads them."""
        return 0 if self.batch_order == "rank" else workers

    def restore_job(self, old: dict) -> None:
        for name, value in old.items():
            setattr(self, name, value)

    @initialize(
        store=st.sampled_from(STORES),
        batch=st.integers(1, 9),
        drop_last=st.booleans(),
        shuffle=st.booleans(),
        buffer_chunks=st.integers(0, 3),
        cache=st.booleans(),
        seed=st.integers(0, 3),
        world=st.integers(1, 3),
        workers=st.integers(0, 2),
        transport=st.sampled_from([None, "queue"]),
        persistent=st.booleans(),
        window=st.one_of(st.none(), st.tuples(st.integers(1, 2), st.integers(0, 3), st.integers(1, 2), st.booleans())),
        batch_order=st.sampled_from(["worker", "rank"]),
        redeal_every=st.sampled_from([0, 0, 2]),
        node_cache=st.sampled_from([False, False, True]),
    )
    @deadline
    def build(
        self,
        store,
        batch,
        drop_last,
        shuffle,
        buffer_chunks,
        cache,
        seed,
        world,
        workers,
        transport,
        persistent,
        window,
        batch_order="worker",
        redeal_every=0,
        node_cache=False,
    ):
        rows, chunk = store
        # node_cache: the stores read over HTTP through a node's chunk cache of this example's own
        self.server = HttpStoreServer(_ROOT).start() if node_cache else None
        self.cache_dir = Path(tempfile.mkdtemp(dir=_ROOT, prefix="cache-")) if node_cache else None
        windows, self.starts = None, None
        samples, plan_chunk = rows, chunk
        if window is not None:  # samples are windows: the model plans window ids, numbered here by hand
            history, lead, stride, gap = window
            segments = ((0, rows // 2), (rows // 2 + 1, rows)) if gap else ((0, rows),)
            span = (history + lead - 1) * stride + 1
            self.starts = [s for a, b in segments for s in range(a, b - span + 1)]
            self.offsets = [k * stride for k in range(history + lead)]
            self.history = history
            windows = Windows(history=history, lead=lead, stride=stride, segments=segments if gap else None)
            samples, cache = len(self.starts), False
            # blocks (zarrtorch.windows): 20 times the chunks the halo reaches into, and at least 4 in the period
            plan_chunk = min(max(1, -(-(span - 1) // chunk) * 20), max(1, len(self.starts) // (4 * chunk))) * chunk
        batch = min(batch, samples // 3)  # every rank of up to 3 gets a batch with drop_last
        self.batch_order = batch_order
        if batch_order == "rank":  # not with workers, which a resume may bring (refused at construction)
            cache = False
        redeal_every = redeal_every if shuffle and not cache else 0  # the dataset refuses it otherwise
        self.setup = Setup(samples, plan_chunk, batch, drop_last, shuffle, buffer_chunks, cache, seed, redeal_every)
        self.persistent = persistent or cache  # cache=True with workers needs persistent workers
        self.transport = transport
        self.store = store
        self.dataset_settings = dict(
            shuffle=shuffle,
            seed=seed,
            buffer_chunks=buffer_chunks,
            keep_in_memory=cache,
            redeal_every=redeal_every or None,
            return_index=True,
            windows=windows,
        )
        if node_cache:
            self.dataset_settings["read"] = ReadOptions(cache_dir=self.cache_dir)
        self.dataset = ZarrIterableDataset(self.source(rows, chunk), **self.dataset_settings)
        self.make_job(world, workers)
        self.run_before: list[int] = []  # rows of the current iteration's epoch consumed before it started
        self.before: list[int] = []  # the same for the next iteration (its start point)
        self.run_worlds: list[int] = []  # world sizes of the jobs the current iteration's epoch ran on
        self.worlds: list[int] = [world]
        self.lagged = 0  # batches taken but not trained when the last state was saved (save_and_resume's lag)

    # -- calls ------------------------------------------------------------------------------------------
    @rule(epoch=st.integers(0, 3))
    @deadline
    def set_epoch(self, epoch):
        for loader, model in zip(self.loaders, self.models, strict=True):
            loader.set_epoch(epoch)
            model.set_epoch(epoch)
        if self.models[0].start is None:
            self.before, self.worlds = [], [self.world]

    @rule()
    @deadline
    def next_epoch(self):
        """``loader.set_epoch(epoch + 1)``, then ``iter``: a training loop's next epoch."""
        self.set_epoch(self.models[0].epoch + 1)
        self.start_iteration()

    @rule()
    @deadline
    def start_iteration(self):
        self.iters = [iter(loader) for loader in self.loaders]
        self.expected = [model.iter() for model in self.models]
        self.yielded = [[] for _ in self.loaders]
        self.run_before, self.run_worlds = list(self.before), list(self.worlds)

    @precondition(lambda self: self.iters is not None)
    @rule(k=st.integers(1, 6))
    @deadline
    def take(self, k):
        for _ in range(k):
            ended = []
            for rank, (it, model) in enumerate(zip(self.iters, self.models, strict=True)):
                batch = next(it, None)
                taken = model.run.seen
                if taken == len(self.expected[rank]):
                    assert batch is None, f"rank {rank} yielded a batch past its {taken} planned"
                    model.finished()
                    ended.append(rank)
                    continue
                assert batch is not None, f"rank {rank} ended after {taken} of {len(self.expected[rank])} batches"
                rows = self.check_data(batch)
                assert rows == self.expected[rank][taken], f"rank {rank}, batch {taken}"
                model.took()
                self.yielded[rank].append(rows)
            if ended:
                assert ended == list(range(self.world)), f"ranks {ended} ended, the others did not"
                self.check_coverage()
                self.iters = None
                if self.models[0].start is None:
                    self.before, self.worlds = [], [self.world]
                return

    def check_data(self, batch) -> list[int]:
        """The batch's sample ids (rows, or window ids) after checking its data against them."""
        index = batch["index"].numpy()
        if self.starts is None:
            np.testing.assert_array_equal(batch["x"].numpy()[:, 1], -index.astype(np.float32))
            return index.tolist()
        rows = index[:, None] + np.asarray(self.offsets)[None, :]
        np.testing.assert_array_equal(batch["x"].numpy()[:, :, 1], -rows[:, : self.history].astype(np.float32))
        if "x_target" in batch:
            np.testing.assert_array_equal(batch["x_target"].numpy()[:, :, 1], -rows[:, self.history :])
        assert batch["x"].shape[1] == self.history
        assert ("x_target" in batch) == (len(self.offsets) > self.history)
        return [self.starts.index(s) for s in index.tolist()]

    @precondition(lambda self: self.iters is not None)
    @rule()
    @deadline
    def finish(self):
        """The rest of the epoch, as a training loop runs it."""
        self.take(len(self.expected[0]) - self.models[0].run.seen + 1)

    @precondition(lambda self: self.iters is not None)
    @rule()
    @deadline
    def abandon(self):
        """``break``: the iterators are dropped mid-epoch."""
        self.iters = None
        gc.collect()

    @precondition(lambda self: self.iters is not None)
    @rule()
    @deadline
    def second_iterator(self):
        """A second ``iter()`` while one runs: the first refuses to go on, the second runs."""
        old = self.iters
        self.start_iteration()
        for it in old:
            with pytest.raises(RuntimeError, match="superseded"):
                next(it)

    @rule(
        world=st.integers(1, 3),
        workers=st.integers(0, 2),
        again=st.booleans(),
        lag=st.integers(0, 1),
        limit=st.one_of(st.none(), st.integers(0, 6)),
    )
    @deadline
    def save_and_resume(self, world, workers, again, lag, limit=None):
        """Every rank saves; a new job on (maybe) another topology loads rank 0's state (``again``: and calls
        ``set_epoch`` with the saved epoch, as Lightning does). ``lag``: the consumer has not trained the last
        batch it took (Lightning fetches one ahead), and says so through ``consumed_batches``. ``limit``: the
        consumer takes at most that many batches of an epoch (Lightning's ``limit_train_batches``), and says so
        through ``consumer_epoch_length``: past it, the epoch is over for it."""
        run = self.models[0].run
        consumed = run.position - lag if run is not None and 0 < lag <= run.position else None  # none untrained
        for loader in self.loaders:
            loader.consumed_batches = (lambda c=consumed: c) if consumed is not None else None
            loader.consumer_epoch_length = (lambda n=limit: n) if limit is not None else None
        states = [loader.state_dict() for loader in self.loaders]
        for loader in self.loaders:
            loader.consumed_batches = loader.consumer_epoch_length = None
        expected = self.models[0].state(consumed, limit)
        self.lagged = min(lag, run.seen) if consumed is not None else 0  # none before the run began
        for rank, state in enumerate(states):
            assert (state["epoch"], state["batches_seen"]) == (expected.epoch, expected.position), f"rank {rank}"
            assert [tuple(h) for h in state["history"]] == list(expected.history)
        carried = self.carried_rows(expected)
        worlds = self.carried_worlds(expected)
        saved_on = (self.world, self.planned(self.workers))
        old = self.make_job(world, workers)
        refused = False
        for loader, model in zip(self.loaders, self.models, strict=True):
            try:
                model.load(State(expected.epoch, expected.position, *saved_on, expected.history))
            except Refused:
                refused = True
                with pytest.raises(ValueError, match="keep_in_memory=True"):
                    loader.load_state_dict(states[0])
                continue
            loader.load_state_dict(states[0])
            if again:
                loader.set_epoch(expected.epoch)
                model.set_epoch(expected.epoch)
        if refused:  # the old job goes on
            self.restore_job(old)
            return
        self.before, self.worlds = carried, worlds + [world]

    @rule(world=st.integers(1, 3), workers=st.integers(0, 2), lag=st.integers(0, 1))
    @deadline
    def lightning_order(self, world, workers, lag):
        """A resume in Lightning's order: ``load_state_dict``, then ``iter`` (its fetcher takes a batch at once),
        then ``set_epoch`` with the saved epoch. The iteration goes on from the saved position (the next epoch's
        start for a state saved at an epoch's end), and nothing is said about the late ``set_epoch``."""
        self.save_and_resume(world, workers, again=False, lag=lag)
        epoch = self.models[0].epoch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.start_iteration()
            self.take(1)
            self.set_epoch(epoch)
        late = [str(w.message) for w in caught if "came after the iteration" in str(w.message)]
        assert not late, late

    def saved_mid_run(self, state: State) -> bool:
        run = self.models[0].run
        return run is not None and state.epoch == run.epoch and state.position == run.position - self.lagged

    def carried_rows(self, state: State) -> list[int]:
        """Rows of ``state``'s epoch consumed before its position, as actually yielded (the batches taken but
        not trained, ``lag``, are not: the resumed job yields them again)."""
        if self.saved_mid_run(state) and state.position:
            trained = [batches[: len(batches) - self.lagged] for batches in self.yielded]
            return self.run_before + [r for batches in trained for batch in batches for r in batch]
        return list(self.before) if state.position else []

    def carried_worlds(self, state: State) -> list[int]:
        """World sizes the saved epoch ran on so far (each pads fewer rows than its ranks)."""
        if self.saved_mid_run(state) and state.position:
            return self.run_worlds
        return self.worlds if state.position else []

    @precondition(lambda self: self.iters is not None)
    @rule(every=st.integers(1, 3))
    @deadline
    def another_loader_meanwhile(self, every):
        """A second loader on the same dataset (rank 0, no workers) runs the next epoch whole while this iteration
        goes on, one of this iteration's batches taken every ``every`` of its own: each yields its own epoch."""
        other = ZarrDataLoader(
            self.dataset,
            batch_size=self.setup.batch,
            drop_last=self.setup.drop_last,
            rank=0,
            world_size=self.world,
        )
        model = ModelLoader(self.setup, self.world, 0, 0)
        epoch = self.models[0].epoch + 1
        other.set_epoch(epoch)
        model.set_epoch(epoch)
        try:
            expected = model.iter()
        except Refused:
            with pytest.raises(ValueError):
                iter(other)
            return
        got = []
        for k, batch in enumerate(other):
            got.append(self.check_data(batch))
            if k % every == 0 and self.iters is not None:
                self.take(1)
        assert got == expected

    @rule(weight=st.integers(0, 2), stop=st.integers(0, 12), world=st.integers(1, 3))
    @deadline
    def mix_with_another_store(self, weight, stop, world):
        """A ``MixedLoader`` of this dataset and a second store (37 rows in chunks of 5, its own seed) by weights
        (1, ``weight``), every rank of this job's world: each step's source and rows equal the model's on every rank;
        after ``stop`` steps rank 0's state resumes on ``world`` ranks, and the rest of the epoch and the next one
        equal the model's too."""
        setup = dataclasses.replace(self.setup, cache=False)
        other = Setup(37, 5, setup.batch, setup.drop_last, True, 1, False, 2)
        datasets = [
            ZarrIterableDataset(self.source(*self.store), **{**self.dataset_settings, "keep_in_memory": False}),
            ZarrIterableDataset(store_path(37, 5), seed=2, buffer_chunks=1, return_index=True),
        ]
        epoch_rows = setup.rows + other.rows
        targets = [round(epoch_rows * w / (1 + weight)) for w in (1, weight)]

        def job(ranks: int):
            mixes, models = [], []
            for rank in range(ranks):
                loaders = [
                    ZarrDataLoader(ds, batch_size=setup.batch, drop_last=setup.drop_last, rank=rank, world_size=ranks)
                    for ds in datasets
                ]
                mixes.append(MixedLoader(loaders, weights=[1, weight], epoch_rows=epoch_rows, seed=self.setup.seed))
                sources = [ModelLoader(s, ranks, 0, rank) for s in (setup, other)]
                models.append(ModelMix(sources, targets, self.setup.seed))
            return mixes, models

        def steps(mixes, models, count=None) -> None:
            expected = [m.steps() for m in models]
            iters = [iter(m) for m in mixes]
            for step, k in enumerate(expected[0][:count]):
                assert all(e[step] == k for e in expected)
                for it, model in zip(iters, models, strict=True):
                    batch = next(it)
                    assert batch["source"] == str(k), f"step {step}: source {batch['source']}, the model's {k}"
                    if k == 0:
                        assert self.check_data(batch) == model.draw(0)
                    else:
                        np.testing.assert_array_equal(batch["x"].numpy()[:, 1], -batch["index"].numpy())
                        assert batch["index"].tolist() == model.draw(1)
                    model.took()
            if count is None:
                assert all(next(it, None) is None for it in iters), "a rank yielded more steps than the model"

        mixes, models = job(self.world)
        steps(mixes, models, stop)
        state = mixes[0].state_dict()
        expected = models[0].state()
        assert (state["epoch"], state["steps"], state["segment"]) == (expected.epoch, expected.steps, expected.segment)
        assert [(s["epoch"], s["batches_seen"]) for s in state["sources"].values()] == [
            (s.epoch, s.position) for s in expected.sources
        ]
        mixes, models = job(world)
        for mix, model in zip(mixes, models, strict=True):
            mix.load_state_dict(state)
            model.load(expected)
        steps(mixes, models)
        steps(mixes, models)

    @rule()
    @deadline
    def state_on_another_store(self):
        """A state saved here, loaded by a loader of the same settings on a store of the same shape holding other
        values, is refused by what differs, and changes nothing."""
        state = self.loaders[0].state_dict()
        rows, chunk = self.store
        other = ZarrDataLoader(
            ZarrIterableDataset(self.source(rows, chunk, shift=1000.0), **self.dataset_settings),
            batch_size=self.setup.batch,
            drop_last=self.setup.drop_last,
            rank=0,
            world_size=self.world,
        )
        before = other.state_dict()
        with pytest.raises(ValueError, match="data: the first chunk of 'x' holds other values"):
            other.load_state_dict(state)
        assert other.state_dict() == before

    @rule(field=st.sampled_from(["batch_size", "seed", "drop_last"]))
    @deadline
    def refused_state(self, field):
        """A state saved with other settings is refused, and changes nothing."""
        loader = self.loaders[0]
        state = loader.state_dict()
        before_len = len(loader)
        bad = dict(state)
        spec = bad["spec"] = dict(bad["spec"])
        spec[field] = (not spec[field]) if field == "drop_last" else spec[field] + 1
        with pytest.raises(ValueError, match=f"{field}: saved"):
            loader.load_state_dict(bad)
        assert loader.state_dict() == state and len(loader) == before_len

    # -- invariants -------------------------------------------------------------------------------------
    @invariant()
    @deadline
    def lengths_agree(self):
        if not hasattr(self, "loaders"):
            return
        lengths = []
        for rank, (loader, model) in enumerate(zip(self.loaders, self.models, strict=True)):
            try:
                expected = model.length()
            except Refused:
                with pytest.raises(ValueError):
                    len(loader)
                continue
            assert len(loader) == expected, f"rank {rank}: len {len(loader)}, the model says {expected}"
            lengths.append(expected)
        assert len(set(lengths)) <= 1, f"ranks disagree on the number of batches: {lengths}"

    def check_coverage(self):
        rows = self.run_before + [r for batches in self.yielded for batch in batches for r in batch]
        counts = np.bincount(np.asarray(rows, dtype=np.int64), minlength=self.setup.rows)
        if self.setup.drop_last:
            assert counts.max(initial=0) <= 1, f"rows read twice: {np.nonzero(counts > 1)[0].tolist()}"
            assert int((counts == 0).sum()) < self.world * self.setup.batch, "too many rows left out"
        else:
            assert counts.min() >= 1, f"rows never read: {np.nonzero(counts == 0)[0].tolist()}"
            assert int(counts.sum()) - self.setup.rows < sum(self.run_worlds), "more repeats than padding allows"

    def source(self, rows: int, chunk: int, shift: float = 0.0) -> str | Path:
        """The store :func:`store_path` makes, as this example reads it: its path, or its URL at the server."""
        path = store_path(rows, chunk, shift)
        return f"{self.server.url}/{path.name}" if self.server is not None else path

    def teardown(self):
        self.iters = None
        self.loaders = []
        gc.collect()
        if getattr(self, "server", None) is not None:
            self.server.stop()
            self.server = None


LoaderMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=16,
    deadline=None,
    derandomize=not FUZZING,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],  # explaining forks too much
)


@pytest.mark.slow
class TestLoaderModel(LoaderMachine.TestCase):
    def setUp(self):
        warnings.filterwarnings("ignore", message=".*starts again with the same order")
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        warnings.filterwarnings("ignore", message=".*came after the iteration over epoch")


@pytest.mark.slow
@pytest.mark.parametrize("saved_at,lag", [("mid-epoch", 1), ("epoch-end", 0), ("epoch-end", 1)])
def test_a_resume_in_lightnings_order(saved_at, lag):
    """Lightning's order (load_state_dict, iter, set_epoch of the saved epoch) on another topology, every time:
    the rule above runs only where the random sequences reach it. ``lag``: the last batch taken is not trained."""
    machine = LoaderMachine()
    machine.build(
        store=(64, 8),
        batch=4,
        drop_last=False,
        shuffle=True,
        buffer_chunks=1,
        cache=False,
        seed=1,
        world=2,
        workers=0,
        transport=None,
        persistent=False,
        window=None,
    )
    machine.next_epoch()
    if saved_at == "epoch-end":
        machine.finish()
    else:
        machine.take(3)
    machine.lightning_order(world=3, workers=1, lag=lag)
    # an epoch whose last batch was trained is saved as the next one's start; one batch short, as itself
    assert machine.models[0].run.epoch == (2 if saved_at == "epoch-end" and not lag else 1)
    machine.lengths_agree()
    machine.finish()
    machine.teardown()


def test_a_consumer_count_below_the_resume_point_keeps_that_point():
    """A trainer's count of consumed batches that starts again at 0 after a resume once made ``state_dict`` save
    a position before the resume point: the rows trained before it were trained again on the same topology, and
    on another one the state described a segment of -3 batches, which ``load_state_dict`` refused (lightning_order
    found it)."""
    ds = ZarrIterableDataset(store_path(64, 8), seed=1, buffer_chunks=1, return_index=True)
    first = ZarrDataLoader(ds, batch_size=4, rank=0, world_size=2)
    it = iter(first)
    trained = [next(it)["index"] for _ in range(3)]
    second = ZarrDataLoader(ds, batch_size=4, rank=0, world_size=1)
    second.load_state_dict(first.state_dict())
    iter(second)
    second.consumed_batches = lambda: 0  # nothing of this run trained yet, counted from the resume
    saved = second.state_dict()
    assert saved["batches_seen"] == 3
    third = ZarrDataLoader(ds, batch_size=4, rank=0, world_size=2)
    third.load_state_dict(saved)
    rest = [b["index"] for b in third]
    assert len(rest) == len(third) - 3
    assert not set(torch.cat(trained).tolist()) & set(torch.cat(rest).tolist())
