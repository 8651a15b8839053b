"""Several stores mixed by weight (``zarrtorch.MixedLoader``): each source's count per epoch within a global batch
of its target, its rows once within its quota and then the stated repeat rule, the same source at the same step
on every rank, exact resume (also on another world size), and bad input refused at construction by name.
Ranks are simulated in one process (``rank=``/``world_size=``), except the one test that runs two gloo ranks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from zarrtorch import MixedLoader, ZarrDataLoader, ZarrIterableDataset, audit_mix, loader_memory, prepare_zarr

BATCH = 8
SIZES = {"era": 240, "cerra": 96}  # rows; chunks of 12
OFFSET = {"era": 0, "cerra": 10_000}  # x holds OFFSET + row: a row's value names its source


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    paths = {}
    for name, rows in SIZES.items():
        paths[name] = root / f"{name}.zarr"
        x = OFFSET[name] + np.arange(rows, dtype=np.float32)
        prepare_zarr({"x": x}, paths[name], chunk_rows=12, progress=False)
    return paths


def mix_for(stores, rank=0, world=1, *, sizes=None, **mix_args) -> MixedLoader:
    loaders = {
        name: ZarrDataLoader(
            ZarrIterableDataset(path, seed=3, buffer_chunks=2, return_index=True),
            batch_size=(sizes or {}).get(name, BATCH),
            drop_last=True,
            rank=rank,
            world_size=world,
            work_ahead=0,
        )
        for name, path in stores.items()
    }
    return MixedLoader(loaders, seed=5, **mix_args)


def drawn(batches) -> dict[str, list[int]]:
    """Rows drawn per source, in order; checks every row is of the source its batch names (a mixed batch: each row's
    source, an index into the names)."""
    out: dict[str, list[int]] = {name: [] for name in SIZES}
    names = list(SIZES)
    for b in batches:
        named = b["source"]
        row_sources = [named] * len(b["x"]) if isinstance(named, str) else [names[i] for i in named.tolist()]
        for name, x, index in zip(row_sources, b["x"].tolist(), b["index"].tolist(), strict=True):
            assert x - OFFSET[name] == index, f"a row named {name!r} is of another source"
            out[name].append(index)
    return out


def epoch_of_all_ranks(mixes) -> tuple[list[list], dict[str, list[int]]]:
    """One epoch of every simulated rank: the sources per step of each rank, and the rows drawn over all ranks."""
    per_rank = [list(m) for m in mixes]
    rows: dict[str, list[int]] = {name: [] for name in SIZES}
    for batches in per_rank:
        for name, r in drawn(batches).items():
            rows[name] += r
    return [[str(b["source"]) for b in batches] for batches in per_rank], rows


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize(
    "form", [{"weights": {"era": 1, "cerra": 3}, "epoch_rows": 200}, {"rows": {"era": 100, "cerra": 150}}]
)
def test_each_sources_count_per_epoch_is_within_one_global_batch_of_its_target(stores, world, form):
    """Weights (x epoch_rows) or rows per epoch per source: over all ranks, each source's rows of every epoch are
    within one global batch (world x batch rows) of its target, and every rank draws the same source per step."""
    targets = {"era": 50, "cerra": 150} if "weights" in form else form["rows"]
    mixes = [mix_for(stores, r, world, **form) for r in range(world)]
    for _ in range(3):  # cerra's quota (150) runs past its 96 rows: its next own epochs
        sources, rows = epoch_of_all_ranks(mixes)
        assert all(s == sources[0] for s in sources), "ranks drew other sources at the same step"
        for name, target in targets.items():
            assert abs(len(rows[name]) - target) <= world * BATCH, (name, len(rows[name]), target)


def test_a_sources_rows_are_drawn_once_within_its_quota_and_continue_at_the_next_epoch(stores):
    """era's quota (96 of its 240 rows a mix epoch) continues where it stopped: over its own epoch (2.5 mix epochs)
    every row exactly once. cerra's (192 a mix epoch, twice its 96 rows) runs into its next own epoch, a new
    shuffle: each of its own epochs holds every row once, in another order."""
    mix = mix_for(stores, rows={"era": 96, "cerra": 192})
    era, cerra = [], []
    for _ in range(5):
        rows = drawn(list(mix))
        era += rows["era"]
        cerra += rows["cerra"]
    assert len(era) == 5 * 96 and len(cerra) == 5 * 192
    for own_epoch in range(2):
        assert sorted(era[240 * own_epoch : 240 * (own_epoch + 1)]) == list(range(240))
    own = [cerra[96 * e : 96 * (e + 1)] for e in range(10)]
    assert all(sorted(rows) == list(range(96)) for rows in own)
    assert own[0] != own[1], "cerra's second own epoch repeated the first's order"


def test_every_source_is_drawn_in_the_default_mix_once_per_epoch(stores):
    """No weights nor rows: every source's rows once per mix epoch."""
    rows = drawn(list(mix_for(stores)))
    assert sorted(rows["era"]) == list(range(240)) and sorted(rows["cerra"]) == list(range(96))


def run_steps(mix, steps=None) -> list[dict]:
    it = iter(mix)
    return [next(it) for _ in range(steps)] if steps is not None else list(it)


def test_a_mix_resumed_mid_epoch_continues_exactly_as_the_uninterrupted_run(stores):
    """A state saved after 7 steps of mix epoch 1 (a fresh loader, its sources fresh too) yields the rest of that
    epoch and the next one batch for batch as the run that went on."""
    form = {"weights": [2, 1], "epoch_rows": 160}
    whole = mix_for(stores, **form)
    run_steps(whole)
    epoch_1 = iter(whole)
    for _ in range(7):
        next(epoch_1)
    state = json.loads(json.dumps(whole.state_dict()))
    rest = list(epoch_1) + run_steps(whole)
    resumed = mix_for(stores, **form)
    resumed.load_state_dict(state)
    again = run_steps(resumed) + run_steps(resumed)
    assert [b["source"] for b in again] == [b["source"] for b in rest]
    assert [b["index"].tolist() for b in again] == [b["index"].tolist() for b in rest]


@pytest.mark.parametrize(
    ("new_world", "form"),
    [
        (1, {"rows": {"era": 120, "cerra": 60}}),
        (3, {"rows": {"era": 120, "cerra": 60}}),
        (3, {"batches": "mixed", "epoch_rows": 320}),
    ],
)
def test_a_mix_resumed_on_another_world_size_keeps_every_target_and_reads_no_row_twice(stores, new_world, form):
    """Saved after 5 steps of 2 ranks, resumed on 1 or 3: over the epoch, each source's rows are within one global
    batch of its target, none twice; the new ranks draw the same source at each step. The targets stay a global
    batch and more below each source's rows: a target of all of them (cerra's 96) may, rounded up on the new
    topology, take a batch from the source's next own epoch (the repeat rule), as drop_last leaves rows out of
    the resumed rest."""
    form = {"sizes": {"era": 6, "cerra": 2}, **form} if "batches" in form else form
    old = [mix_for(stores, r, 2, **form) for r in range(2)]
    targets = dict(zip(SIZES, old[0].targets, strict=True))
    before = [run_steps(m, 5) for m in old]
    state = json.loads(json.dumps(old[0].state_dict()))
    new = [mix_for(stores, r, new_world, **form) for r in range(new_world)]
    for m in new:
        m.load_state_dict(state)
    sources, rows = epoch_of_all_ranks(new)
    assert all(s == sources[0] for s in sources)
    for batches in before:
        for name, r in drawn(batches).items():
            rows[name] += r
    for name, target in targets.items():
        assert len(rows[name]) == len(set(rows[name])), f"{name}: a row drawn twice"
        assert abs(len(rows[name]) - target) <= max(2, new_world) * BATCH, (name, len(rows[name]))


def test_an_abandoned_epoch_iterated_again_restarts_where_it_began(stores):
    """iter() again after a break in the same epoch: the sources go back to where the epoch began, so the rows of
    the abandoned steps are drawn in the restarted epoch (none lost)."""
    mix = mix_for(stores)
    run_steps(mix, 9)
    rows = drawn(list(mix))
    assert sorted(rows["era"]) == list(range(240)) and sorted(rows["cerra"]) == list(range(96))


def test_an_epoch_whose_every_step_was_taken_is_over_though_its_end_was_not_asked_for(stores):
    """A loop that takes exactly len(mix) batches (zip, islice) never asks for the end: the next iter() runs the
    next mix epoch (the state already said so), not the same epoch again from its start."""
    mix = mix_for(stores, rows={"era": 120, "cerra": 48})
    it = iter(mix)
    first = [next(it) for _ in range(len(mix))]
    assert mix.state_dict()["epoch"] == 1
    second = list(mix)
    rows = {name: drawn(first)[name] + drawn(second)[name] for name in SIZES}
    assert sorted(rows["era"]) == list(range(240)) and sorted(rows["cerra"]) == list(range(96))


# -- what a consumer says (a trainer: zarrtorch.lightning.MixedDataModule) --------------------------------------------
@pytest.mark.parametrize("form", [{"weights": [2, 1], "epoch_rows": 160}, {"batches": "mixed", "epoch_rows": 160}])
def test_a_state_saved_while_the_consumer_holds_a_batch_resumes_at_that_batch(stores, form):
    """A consumer that reads one batch ahead (``consumed_batches`` one below the steps yielded) saves a state that
    puts that batch back, in the mix and in its source: the resumed mix yields it again, then the rest as the
    uninterrupted run does."""
    form = {"sizes": {"era": 6, "cerra": 2}, **form} if "batches" in form else form
    whole = mix_for(stores, **form)
    it = iter(whole)
    taken = [next(it) for _ in range(8)]  # 7 trained, the 8th held
    whole.consumed_batches = lambda: 7
    state = json.loads(json.dumps(whole.state_dict()))
    whole.consumed_batches = None
    rest = [taken[7], *it]
    resumed = mix_for(stores, **form)
    resumed.load_state_dict(state)
    again = run_steps(resumed)
    assert state["steps"] == 7
    assert [drawn([b]) for b in again] == [drawn([b]) for b in rest]


def test_the_consumers_epoch_length_ends_the_epoch_in_a_state(stores):
    """A consumer that takes 5 steps of each epoch (Lightning's ``limit_train_batches=5``): a state saved after them
    is the next epoch's start, the sources where the 5 steps left them."""
    whole = mix_for(stores, weights=[2, 1], epoch_rows=160)
    whole.consumer_epoch_length = lambda: 5
    run_steps(whole, 5)
    state = json.loads(json.dumps(whole.state_dict()))
    assert (state["epoch"], state["steps"]) == (1, 0)
    whole.set_epoch(1)
    resumed = mix_for(stores, weights=[2, 1], epoch_rows=160)
    resumed.load_state_dict(state)
    assert [drawn([b]) for b in run_steps(resumed)] == [drawn([b]) for b in run_steps(whole)]


def test_steps_a_trainer_counts_as_done_lengthen_the_epoch_and_shift_its_count(stores):
    """``count_as_done(3)`` (a trainer resumed at an epoch's end on another world size keeps the old epoch's count):
    ``len()`` counts the 3 steps, and a state saved when the trainer counts 3 + 4 holds 4 steps."""
    mix = mix_for(stores, weights=[2, 1], epoch_rows=160)
    length = len(mix)
    mix.count_as_done(3)
    assert len(mix) == length + 3 and mix.batches_before() == 0
    run_steps(mix, 4)
    mix.consumed_batches = lambda: 3 + 4
    assert mix.state_dict()["steps"] == 4


def test_a_mix_resumed_on_another_world_size_counts_the_steps_before_as_a_trainer_does(stores):
    """Saved after 3 steps on 2 ranks, resumed on 1: ``len()`` is those 3 steps plus the rest (as a ZarrDataLoader's),
    and a trainer's count (3 + 4 after 4 more steps) saves 4 steps of the new segment. Lightning, resumed with its
    count at 3, asked for ``len()`` = the rest only and stopped 3 steps short of the epoch's end."""
    old = [mix_for(stores, r, 2, weights=[2, 1], epoch_rows=160) for r in range(2)]
    for m in old:
        run_steps(m, 3)
    state = json.loads(json.dumps(old[0].state_dict()))
    new = mix_for(stores, 0, 1, weights=[2, 1], epoch_rows=160)
    new.load_state_dict(state)
    assert new.batches_before() == 3
    length = len(new)
    it = iter(new)
    assert [next(it) for _ in range(4)] and len(list(it)) == length - 3 - 4
    again = mix_for(stores, 0, 1, weights=[2, 1], epoch_rows=160)
    again.load_state_dict(state)
    run_steps(again, 4)
    again.consumed_batches = lambda: 3 + 4
    assert again.state_dict()["steps"] == 4


def loaders(stores, **over):
    out = {}
    for name, path in stores.items():
        args = {"batch_size": BATCH, **over.get(name, {})}
        out[name] = ZarrDataLoader(ZarrIterableDataset(path), **args)
    return out


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"weights": {"era": -1, "cerra": 2}}, "weight of source 'era' must be a finite number >= 0"),
        ({"weights": [0, 0]}, "sum to 0"),
        ({"weights": [1, float("nan")]}, "weight of source 'cerra'"),
        ({"weights": {"era": 1}}, "must name every source once"),
        ({"rows": {"era": 10, "cerra": -3}}, "rows of source 'cerra'"),
        ({"weights": [1, 1], "rows": [1, 1]}, "not both"),
        ({"batches": "mixed", "weights": [1, 1]}, "with batches='mixed' a source's share is its ZarrDataLoader's"),
        ({"batches": "both"}, "batches must be 'per_source' or 'mixed'"),
    ],
)
def test_bad_mix_settings_are_refused_at_construction_by_name(stores, kwargs, says):
    with pytest.raises((ValueError, TypeError), match=says.replace("(", r"\(").replace(")", r"\)")):
        MixedLoader(loaders(stores), **kwargs)


def test_sources_with_other_batch_sizes_are_refused_by_name(stores):
    with pytest.raises(ValueError, match=r"other batch sizes \{'era': 8, 'cerra': 4\}"):
        MixedLoader(loaders(stores, cerra={"batch_size": 4}))


def test_mixed_batches_of_sources_on_other_grids_are_refused_by_name(stores, tmp_path):
    """Two grids cannot share a batch: the error names the sources and their columns, and the way out."""
    path = tmp_path / "fine.zarr"
    prepare_zarr({"x": np.zeros((24, 2, 2), np.float32)}, path, chunk_rows=12, progress=False)
    sources = {"era": loaders(stores)["era"], "fine": ZarrDataLoader(ZarrIterableDataset(path), batch_size=BATCH)}
    with pytest.raises(ValueError, match=r"sources 'era' and 'fine' give other columns .* use batches='per_source'"):
        MixedLoader(sources, batches="mixed")


@pytest.mark.parametrize("world", [1, 2])
def test_mixed_batches_hold_every_sources_share_and_each_row_once(stores, world):
    """batches='mixed', era 6 rows and cerra 2 a batch: every batch holds exactly that, each row's source named; an
    epoch of 320 rows draws era's share (3/4: its 240 rows, each once) and cerra's (80 rows) within a global batch."""
    sizes = {"era": 6, "cerra": 2}
    mixes = [mix_for(stores, r, world, sizes=sizes, batches="mixed", epoch_rows=320) for r in range(world)]
    per_rank = [list(m) for m in mixes]
    for batch in per_rank[0]:
        assert batch["source"].tolist() == [0] * 6 + [1] * 2
    rows: dict[str, list[int]] = {name: [] for name in SIZES}
    for batches in per_rank:
        for name, r in drawn(batches).items():
            rows[name] += r
    for name, share in (("era", 6 / 8), ("cerra", 2 / 8)):
        assert abs(len(rows[name]) - share * 320) <= world * sizes[name]
    assert sorted(rows["era"]) == list(range(240))


def test_mixed_batches_of_sources_whose_own_epochs_end_in_a_short_batch_are_refused(stores):
    """batches='mixed' promises every batch ``batch_size`` rows of each source. Sources with the loader's default
    drop_last=False end each of their own epochs in a short batch: era 4 and cerra 5 rows a batch (96 rows, 1 left
    at the end of each of its epochs) gave steps of 4 era rows and 1 cerra row, a share other than asked, silently
    (only audit_mix said so). Refused at construction, naming the sources; drop_last=True keeps every share."""
    sizes = {"era": 4, "cerra": 5}
    short = loaders(stores, era={"batch_size": 4}, cerra={"batch_size": 5})  # drop_last=False, the default
    with pytest.raises(ValueError, match=r"drop_last=False \(sources \['era', 'cerra'\]\).*drop_last=True"):
        MixedLoader(short, batches="mixed")
    mix = mix_for(stores, sizes=sizes, batches="mixed", epoch_rows=200)
    assert all(batch["source"].tolist() == [0] * 4 + [1] * 5 for batch in mix)


@pytest.mark.parametrize(
    ("world", "form"),
    [
        (1, {"weights": [1, 1], "epoch_rows": 4}),
        (1, {"rows": [3, 3]}),
        (1, {"batches": "mixed", "epoch_rows": 5}),
        (2, {"rows": [7, 7]}),  # a whole batch on one rank, under half of the two ranks' global batch
    ],
)
def test_a_mix_whose_every_quota_rounds_to_no_batch_is_refused_not_an_empty_epoch(stores, world, form):
    """epoch_rows=4 with batches of 8: each source's target, under half a global batch, rounded to no batch, and
    every epoch of the mix had no step: a training loop ran its epochs on nothing, without a word."""
    with pytest.raises(
        ValueError, match=r"no step: .*under half a global batch.*\(epoch_rows= or rows=\), or a smaller batch_size"
    ):
        mix_for(stores, 0, world, **form)


def test_a_mix_built_before_its_launchers_process_group_waits_for_the_world_size_to_refuse_an_empty_epoch(
    stores, monkeypatch
):
    """A MixedDataModule under Lightning's DDP is built before the process group exists (WORLD_SIZE set, RANK not):
    the check for an epoch of no step asked for the topology at construction and failed every DDP run with
    TopologyUnknown. It checks on one rank then, and again on the real world size at iter()."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    sources = {
        name: ZarrDataLoader(ZarrIterableDataset(path, seed=3), batch_size=BATCH, drop_last=True)
        for name, path in stores.items()
    }
    mix = MixedLoader(sources, seed=5, rows=[7, 7])  # a step on one rank, none on two
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"no step: .*world_size 2 x batch_size"):
        iter(mix)


def test_a_source_whose_target_rounds_to_no_batch_in_every_epoch_is_named_not_left_out_silently(stores):
    """Weights 1000:1 over 800 rows an epoch: the small source's target (under half a global batch) rounded to no
    batch, the same every epoch, so a source the user mixed in was never trained on, without a word."""
    with pytest.warns(UserWarning, match=r"sources \['cerra'\] get no batch in any epoch.*more weight or rows"):
        mix = mix_for(stores, weights=[1000, 1], epoch_rows=800)
    assert {int(s) for s in mix.order(mix.start_point(1))} == {0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mix_for(stores, weights=[1, 1], epoch_rows=800)


def test_one_loader_given_as_two_sources_is_refused(stores):
    one = loaders(stores)["era"]
    with pytest.raises(ValueError, match="sources 'a' and 'b' are the same ZarrDataLoader"):
        MixedLoader({"a": one, "b": one})


# -- two real ranks ----------------------------------------------------------------------------------------------
WORKER = Path(__file__).with_name("mix_ddp_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_gloo_ranks_draw_the_same_source_at_every_step(stores, tmp_path):
    """Two ranks (gloo, as torchrun starts them) with a head per source: each step all-reduces the source's index,
    so ranks drawing other sources would fail there; they must also draw other rows of the same source (two mix
    epochs take cerra's 96 rows once: the ranks share them)."""
    port, world = free_port(), 2
    procs = []
    for rank in range(world):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank)}
        env.update(WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
        cmd = [sys.executable, str(WORKER), str(stores["era"]), str(stores["cerra"]), str(tmp_path)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        logs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"rank {rank}:\n{log[-3000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert ranks[0]["sources"] == ranks[1]["sources"] and len(set(ranks[0]["sources"])) == 2
    for name in SIZES:
        a, b = (set(r["rows"][name]) for r in ranks)
        assert not a & b, f"{name}: both ranks drew rows {sorted(a & b)[:5]}"
    assert sorted(ranks[0]["rows"]["cerra"] + ranks[1]["rows"]["cerra"]) == list(range(96))


# -- audit and memory ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2])
def test_audit_mix_gives_each_sources_share_as_the_loader_yields_it(stores, world):
    """audit_mix, from the plans only, says each source's rows and own epochs of the next mix epoch as the ranks then
    yield them; cerra's quota (150 rows of its 96) runs into its next own epoch."""
    mixes = [mix_for(stores, r, world, rows={"era": 100, "cerra": 150}) for r in range(world)]
    run_steps(mixes[0])  # epoch 0 on rank 0 only: the audit is of rank 0's sources, now in epoch 1
    for m in mixes[1:]:
        run_steps(m)
    report = audit_mix(mixes[0])
    _, rows = epoch_of_all_ranks(mixes)
    shares = {s.name: s for s in report.sources}
    assert report.ok and report.epoch == 1 and report.world_size == world
    for name in SIZES:
        assert shares[name].rows == len(rows[name]) and shares[name].duplicates == 0
    assert shares["cerra"].own_epochs[1] > shares["cerra"].own_epochs[0]
    assert "'cerra'" in report.summary() and "OK" in report.summary()


def test_loader_memory_of_a_mix_counts_every_sources_loader(stores):
    """Two sources of two workers each: four worker processes, every one counted."""
    sources = {
        name: ZarrDataLoader(ZarrIterableDataset(path), batch_size=BATCH, num_workers=2)
        for name, path in stores.items()
    }
    memory = loader_memory(MixedLoader(sources))
    assert memory.total == sum(loader_memory(s).total for s in sources.values())
    assert sum(budget.readers for budget in memory.sources.values()) == 4


def test_a_mix_of_rank_order_sources_resumed_with_another_worker_count_continues_the_uninterrupted_run(tmp_path):
    """A break-test's sequence across two features: sources with ``batch_order="rank"``, a mix stopped after 5
    steps with 1 worker per source and resumed with none, then the next epoch: every batch as in the uninterrupted
    run; and a source asked for more batches than it holds repeats exactly the excess (its next own epoch)."""
    import numpy as np

    import zarrtorch as zt

    def store(name, rows, offset):
        path = tmp_path / f"{name}.zarr"
        zt.prepare_zarr(
            {"x": (np.arange(rows, dtype=np.float32) + offset)[:, None]}, path, chunk_rows=16, progress=False
        )
        return path

    a, b = store("a", 200, 0), store("b", 120, 10_000)

    def mix(workers):
        def source(path):
            ds = zt.ZarrIterableDataset(path, seed=1)
            return zt.ZarrDataLoader(ds, batch_size=8, num_workers=workers, drop_last=True, batch_order="rank")

        return zt.MixedLoader({"a": source(a), "b": source(b)}, weights={"a": 1, "b": 1}, seed=5)

    def key(batch):
        return batch["source"], tuple(int(v) for v in batch["x"][:, 0].tolist())

    uninterrupted = mix(0)
    epochs = []
    for epoch in (0, 1):
        uninterrupted.set_epoch(epoch)
        epochs.append([key(batch) for batch in uninterrupted])
    stopped = mix(1)
    stopped.set_epoch(0)
    it = iter(stopped)
    got = [key(next(it)) for _ in range(5)]
    state = stopped.state_dict()
    del it, stopped
    resumed = mix(0)
    resumed.load_state_dict(state)
    got += [key(batch) for batch in resumed]
    assert got == epochs[0]
    resumed.set_epoch(1)
    assert [key(batch) for batch in resumed] == epochs[1]
    b_rows = [v for source, rows in epochs[0] if source == "b" for v in rows]
    quota = sum(1 for source, _ in epochs[0] if source == "b")
    assert len(b_rows) - len(set(b_rows)) == (quota - 120 // 8) * 8  # the batches beyond its own epoch's 15


def late_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "came after the iteration over mix epoch" in str(w.message)]


@pytest.mark.parametrize("drawn_before", [1, 0])
def test_a_set_epoch_after_the_mix_epochs_iteration_began_warns_once(stores, drawn_before):
    """``set_epoch(1)`` after ``iter()`` of mix epoch 0 (a bare MixedLoader under Lightning resumed at an epoch's
    end: Lightning iterates, then sets the epoch): that iteration goes on as epoch 0, its order, and the trainer
    counts it as epoch 1, while a ZarrDataLoader said so and the mix said nothing. Said once, at its first batch
    when none was out yet; the next epoch runs as set."""
    mix = mix_for(stores)
    it = iter(mix)
    taken = [next(it) for _ in range(drawn_before)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mix.set_epoch(1)
        taken += list(it)
        following = list(mix)
    assert len(late_warnings(caught)) == 1, [str(w.message) for w in caught]
    message = late_warnings(caught)[0]
    assert "set_epoch(1)" in message and "MixedDataModule" in message
    assert [str(b["source"]) for b in taken] == [str(b["source"]) for b in mix_for(stores)]  # epoch 0, whole
    assert len(following) == len(mix_for(stores)) and mix.epoch == 2


def test_a_mix_used_as_lightning_uses_it_never_warns_of_a_late_set_epoch(stores):
    """set_epoch before iter(); set_epoch of the running epoch after iter() (Lightning); an epoch taken to its
    last step without asking for its end (Lightning takes len() steps); an iterator dropped unused; a state
    loaded mid-epoch, then the next epochs: no warning."""
    mix = mix_for(stores)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(2):
            mix.set_epoch(epoch)
            it = iter(mix)
            mix.sampler.set_epoch(epoch)
            for _ in range(len(mix)):
                next(it)
        unused = iter(mix)
        del unused
        mix.set_epoch(3)
        it = iter(mix)
        [next(it) for _ in range(3)]
        state = mix.state_dict()
        resumed = mix_for(stores)
        resumed.load_state_dict(state)
        for epoch in (3, 4):
            resumed.set_epoch(epoch)
            list(resumed)
    assert late_warnings(caught) == []


def test_a_source_rewritten_between_mix_epochs_is_refused_though_its_own_epoch_goes_on(tmp_path):
    """breaks6: prepare_zarr wrote a source's store again (float64 for int64) between two mix epochs while that
    source's own epoch went on across them (its quota is a fifth of its rows): the next mix epoch went on reading it
    with the old plan and dtype, 13 of its 80 rows the new float64 bytes read as int64, silently (the rewrite check
    ran only when a source's own epoch began). Every mix epoch checks the stores of the sources it continues."""
    paths = {name: tmp_path / f"{name}.zarr" for name in ("a", "b")}
    for rows, path in zip((400, 100), paths.values(), strict=True):
        prepare_zarr({"y": np.arange(rows, dtype=np.int64)}, path, chunk_rows=10, progress=False)
    loaders = {n: ZarrDataLoader(ZarrIterableDataset(p, seed=1), batch_size=BATCH) for n, p in paths.items()}
    mix = MixedLoader(loaders, rows={"a": 80, "b": 80}, seed=0)
    assert sum(len(b["y"]) for b in mix) == 160
    prepare_zarr({"y": np.arange(400, dtype=np.float64)}, paths["a"], chunk_rows=10, overwrite=True, progress=False)
    mix.set_epoch(1)
    with pytest.raises(ValueError, match="rewritten since this dataset opened it"):
        list(mix)


def sources_a_failing_at_its_fourth_batch(tmp_path, error: Callable[[], BaseException], **loader_kw) -> dict:
    """Loaders of two stores of 400 rows (``a``: 0-399, ``b``: 1000-1399); ``a``'s transform raises ``error()`` at
    its fourth batch (a new exception: one kept by the transform would hold its traceback, hence the loaders and
    their work-ahead threads, for as long as the transform lives)."""
    paths = {name: tmp_path / f"{name}.zarr" for name in ("a", "b")}
    for offset, path in zip((0, 1000), paths.values(), strict=True):
        prepare_zarr({"y": offset + np.arange(400, dtype=np.int64)}, path, chunk_rows=10, progress=False)
    calls = {"n": 0}

    def fails_at_the_fourth_batch(batch):
        calls["n"] += 1
        if calls["n"] == 4:
            raise error()
        return batch

    transforms = {"a": fails_at_the_fourth_batch, "b": None}
    return {
        n: ZarrDataLoader(ZarrIterableDataset(p, seed=1, transform=transforms[n]), batch_size=BATCH, **loader_kw)
        for n, p in paths.items()
    }


@pytest.mark.parametrize("work_ahead", [0, 2])
def test_a_mix_interrupted_inside_a_step_refuses_to_go_on_and_its_next_epoch_keeps_each_row_once(tmp_path, work_ahead):
    """breaks6: a Ctrl-C while a source's transform ran inside a mix step. Used on, the same mix iterator ended the
    epoch at once (56 of 400 rows), silently; the next mix epoch lost the batch the source had taken (work_ahead=2)
    or ended the source's own epoch there (work_ahead=0, 24 of its 400 rows), so rows of its next own epoch came
    early, repeated. The mix iterator now refuses to go on, and the source resumes after the batches it handed out."""
    loaders = sources_a_failing_at_its_fourth_batch(tmp_path, KeyboardInterrupt, work_ahead=work_ahead)
    mix = MixedLoader(loaders, rows={"a": 200, "b": 200}, seed=0)
    drawn_a: list[int] = []
    steps = iter(mix)
    with pytest.raises(KeyboardInterrupt):
        for batch in steps:
            drawn_a += [v for v in batch["y"].tolist() if v < 1000]
    with pytest.raises(RuntimeError, match="interrupted"):
        next(steps)
    for epoch in (1, 2):
        mix.set_epoch(epoch)
        drawn_a += [v for b in mix for v in b["y"].tolist() if v < 1000]
    assert sorted(drawn_a[:400]) == list(range(400))  # its own first epoch: every row once


def test_a_mix_iterator_used_on_after_an_error_in_a_step_refuses(tmp_path):
    """breaks7: an error in a source's step (here its transform; a failed chunk read alike) ended the mix's
    generator: the same mix iterator used on ended the epoch at once (StopIteration), silently, as a normal end. It
    now refuses, naming the error before."""
    loaders = sources_a_failing_at_its_fourth_batch(tmp_path, lambda: ValueError("a transform that failed"))
    steps = iter(MixedLoader(loaders, rows={"a": 200, "b": 200}, seed=0))
    with pytest.raises(ValueError, match="a transform that failed"):
        for _ in steps:
            pass
    with pytest.raises(RuntimeError, match="stopped at an error \\(ValueError"):
        next(steps)
