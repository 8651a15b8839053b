"""Shares kept on their ranks for K epochs (``ZarrIterableDataset(redeal_every=K)``,
:func:`zarrtorch.plan.placed_stream`), so that a node's chunk cache holds what the node reads next: every row once
and equal batches per rank in every epoch, a rank's chunks the same for K epochs and dealt anew after, its order new
every epoch. Elastic resume on another topology keeps exactly once: ``tests/core/test_resume.py`` and the loader's
model (``test_model.py``) draw ``redeal_every`` too."""

from __future__ import annotations

import numpy as np
import pytest

from zarrtorch import ZarrIterableDataset, prepare_zarr
from zarrtorch.plan import EpochSpec, Topology
from zarrtorch.resume import batches_of, expand

ROWS, CHUNK, BATCH, WORLD, WORKERS, K = 1000, 16, 8, 4, 2, 3


def epoch_batches(spec: EpochSpec, epoch: int) -> list[list[np.ndarray]]:
    return [batches_of(spec, spec.plan(epoch, Topology(r, WORLD, WORKERS))) for r in range(WORLD)]


@pytest.mark.parametrize("drop_last", [False, True])
def test_each_rank_keeps_its_chunks_for_k_epochs_with_every_row_once_and_equal_batches(drop_last):
    spec = EpochSpec(ROWS, CHUNK, BATCH, drop_last, seed=7, buffer_chunks=2, redeal_every=K)
    chunks, orders = [], []
    for epoch in range(2 * K):
        per_rank = epoch_batches(spec, epoch)
        assert len({len(b) for b in per_rank}) == 1  # equal batches on every rank
        rows = np.concatenate([b for rank in per_rank for b in rank])
        if drop_last:
            assert len(rows) == len(np.unique(rows)) and ROWS - len(rows) < WORLD * BATCH
        else:
            assert set(rows.tolist()) == set(range(ROWS)) and len(rows) - ROWS < WORLD  # padding < world
        chunks.append([set((np.concatenate(rank) // CHUNK).tolist()) for rank in per_rank])
        orders.append([np.concatenate(rank) for rank in per_rank])
    for epoch in range(1, 2 * K):
        same_deal = epoch % K != 0
        assert (chunks[epoch] == chunks[epoch - 1]) == same_deal, f"epoch {epoch}: shares kept only within a deal"
        for rank in range(WORLD):  # the order within a share changes every epoch
            a, b = orders[epoch][rank], orders[epoch - 1][rank]
            assert len(a) != len(b) or not np.array_equal(a, b), f"epoch {epoch}, rank {rank}: the same order"


def test_without_redeal_every_the_plan_and_its_fingerprint_are_unchanged():
    plain = EpochSpec(ROWS, CHUNK, BATCH, False, seed=7, buffer_chunks=2)
    assert plain.fingerprint() == EpochSpec(ROWS, CHUNK, BATCH, False, seed=7, buffer_chunks=2).fingerprint()
    placed = EpochSpec(ROWS, CHUNK, BATCH, False, seed=7, buffer_chunks=2, redeal_every=1)
    assert placed.fingerprint() != plain.fingerprint()  # a checkpoint of one is refused by the other


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"redeal_every": 0}, "redeal_every"),
        ({"redeal_every": 1.5}, "redeal_every"),
        ({"redeal_every": 2, "shuffle": False}, "redeal_every"),
        ({"redeal_every": 2, "keep_in_memory": True}, "redeal_every"),
    ],
)
def test_bad_redeal_every_is_refused_by_name(tmp_path, settings, match):
    prepare_zarr({"x": np.arange(64, dtype=np.float32)}, tmp_path / "s.zarr", chunk_rows=8, progress=False)
    with pytest.raises(ValueError, match=match):
        ZarrIterableDataset(tmp_path / "s.zarr", **settings)


def test_a_dataset_with_redeal_every_plans_the_placed_shares(tmp_path):
    prepare_zarr({"x": np.arange(ROWS, dtype=np.float32)}, tmp_path / "s.zarr", chunk_rows=CHUNK, progress=False)
    ds = ZarrIterableDataset(tmp_path / "s.zarr", seed=7, buffer_chunks=2, redeal_every=K)
    spec = EpochSpec(ROWS, CHUNK, BATCH, False, seed=7, buffer_chunks=2, redeal_every=K)
    for epoch in (0, 1):
        got = ds.batch_row_ids(epoch=epoch, batch_size=BATCH, rank=1, world_size=WORLD, num_workers=WORKERS)
        want = epoch_batches(spec, epoch)[1]
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("rows, chunk_rows, world", [(1000, 16, 4), (77, 5, 3), (64, 8, 1)])
def test_the_loaders_model_places_the_same_rows(rows, chunk_rows, world, drop_last):
    """``loader_model.placed_stream``, written again from the rule, gives the package's placed stream row for row:
    the model-based test (``test_model.py``) then checks the loader against an independent account."""
    from loader_model import Setup, placed_stream

    for epoch in range(4):
        spec = EpochSpec(rows, chunk_rows, 4, drop_last, seed=3, buffer_chunks=1, redeal_every=2)
        placed = spec.stream(epoch, world)
        setup = Setup(rows, chunk_rows, 4, drop_last, True, 1, False, 3, redeal_every=2)
        assert expand(placed.pieces(0, placed.length)).tolist() == placed_stream(setup, epoch, world)


def test_a_state_saved_before_redeal_every_existed_loads_as_the_same_plan():
    """A state without ``redeal_every`` in its spec (every state saved before it existed) is the plan that deals
    every epoch, and a state of such a plan is saved without it; one with shares kept says so."""
    from zarrtorch.resume import LoaderCheckpoint

    spec = EpochSpec(ROWS, CHUNK, BATCH, False, seed=7, buffer_chunks=2)
    state = LoaderCheckpoint(
        epoch=1,
        batches_seen=3,
        rank=0,
        world_size=2,
        num_workers=0,
        history=(),
        spec=spec,
        plan_version=4,
        fingerprint=spec.fingerprint(),
        data=(),
    ).to_dict()
    assert "redeal_every" not in state["spec"]
    assert LoaderCheckpoint.from_dict(state).spec == spec
    placed = EpochSpec(ROWS, CHUNK, BATCH, False, seed=7, buffer_chunks=2, redeal_every=2)
    state["spec"] = LoaderCheckpoint.from_dict({**state, "spec": {**state["spec"], "redeal_every": 2}}).to_dict()[
        "spec"
    ]
    assert state["spec"]["redeal_every"] == 2 and LoaderCheckpoint.from_dict(state).spec == placed
