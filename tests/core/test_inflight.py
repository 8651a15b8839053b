"""Requests in flight found while reading (zarrtorch._read.inflight.InFlight), on a clock the test moves: a
far store's reads are waited for and a larger level reads faster, so the level grows up to its most; a
consumer-bound run waits too but a larger level does not read faster, so it goes back and never tries that
level again; a fixed setting and a run that never waits keep their level. Then the loader with the adaptive
default over a slow HTTP server: every row once per epoch, 0 and 2 workers, and the memory budget counts
the most the level may reach."""

from __future__ import annotations

import numpy as np
import pytest

from zarrtorch import ReadOptions, ZarrDataLoader, ZarrIterableDataset, loader_memory, prepare_zarr
from zarrtorch._read.inflight import InFlight
from zarrtorch.course.servers import HttpStoreServer


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def run(controller: InFlight, clock: Clock, pieces: int, *, seconds_per_piece, waited) -> list[int]:
    """Consume ``pieces``; each takes ``seconds_per_piece(level)``; returns the level after each piece."""
    levels = []
    for _ in range(pieces):
        clock.now += seconds_per_piece(controller.level)
        controller.consumed(waited=waited(controller.level))
        levels.append(controller.level)
    return levels


def test_a_far_store_grows_the_level_while_it_pays_up_to_its_most():
    clock = Clock()
    c = InFlight(8, 64, clock=clock)
    levels = run(c, clock, 2000, seconds_per_piece=lambda n: 0.1 / n, waited=lambda n: True)  # 100 ms, latency-bound
    assert levels[0] == 8 and levels[-1] == 62  # 12, 18, 27, 41, 62 paid; 64 (the most) gave only 3 % more
    assert max(levels) == 64 and levels[-500:].count(64) == 0


def test_a_consumer_bound_run_goes_back_and_does_not_try_again():
    clock = Clock()
    c = InFlight(8, 64, clock=clock)
    levels = run(c, clock, 2000, seconds_per_piece=lambda n: 0.01, waited=lambda n: True)  # the rate never moves
    assert max(levels) == 12  # tried once (8 x 1.5)...
    assert levels[-1] == 8 and levels[-500:].count(12) == 0  # ...went back, and stays


def test_it_grows_only_as_far_as_it_pays():
    clock = Clock()
    c = InFlight(8, 64, clock=clock)
    levels = run(c, clock, 3000, seconds_per_piece=lambda n: 0.1 / min(n, 20), waited=lambda n: True)
    assert levels[-1] == 27 and max(levels) == 41  # 12, 18, 27 paid (27 reads 11 % faster than 18), 41 did not
    assert levels[-1000:].count(41) == 0  # and is not tried again


def test_no_waits_or_a_fixed_setting_keep_the_level():
    clock = Clock()
    never = InFlight(8, 64, clock=clock)
    assert set(run(never, clock, 500, seconds_per_piece=lambda n: 0.01, waited=lambda n: False)) == {8}
    fixed = InFlight(5, 5, clock=clock)
    assert set(run(fixed, clock, 500, seconds_per_piece=lambda n: 0.1 / n, waited=lambda n: True)) == {5}
    assert InFlight(8, 3).most == 8  # never below the first level


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("inflight")
    data = np.arange(600 * 3, dtype=np.float32).reshape(600, 3)
    path = root / "s.zarr"
    prepare_zarr({"x": data}, path, chunk_rows=6)
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_the_adaptive_default_reads_every_row_once_over_a_slow_server(store, workers):
    with HttpStoreServer(store.parent, delay_ms=20) as server:
        ds = ZarrIterableDataset(f"{server.url}/{store.name}", variables=["x"], return_index=True, seed=1)
        first, most = ds.in_flight_range(1)
        assert (first, most) == (8, 128)  # small chunks: the most that 256 MiB of them hold is capped at 128
        loader = ZarrDataLoader(ds, batch_size=10, num_workers=workers)
        assert loader_memory(loader).per_reader >= (most + 1) * 6 * 3 * 4  # counts the most, not the first
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            rows = np.concatenate([b["index"].numpy() for b in loader])
            assert np.array_equal(np.sort(rows), np.arange(600))
    fixed = ZarrIterableDataset(store, variables=["x"], read=ReadOptions(requests_in_flight=3))
    assert fixed.in_flight_range(1) == (3, 3)
    assert ZarrIterableDataset(store, variables=["x"]).in_flight_range(2) == (3, 3)  # local: decode threads + 1


def test_the_level_found_is_kept_for_the_next_epochs_workers():
    """Non-persistent workers are new processes every epoch: the level a worker settles on goes to the loader's
    shared state, and the next epoch's worker of that id starts from it (within first and most)."""
    from zarrtorch._workers.shared import EpochState, EpochView

    state = EpochState()
    clock = Clock()
    c = InFlight(8, 64, start=state.level(1), on_change=lambda level: state.remember_level(1, level), clock=clock)
    assert c.level == 8
    run(c, clock, 2000, seconds_per_piece=lambda n: 0.1 / n, waited=lambda n: True)
    assert state.level(1) == c.level == 62 and state.level(0) == 0
    state.publish(EpochView(epoch=1, skip=0, rank=0, world_size=1))  # a new epoch keeps the levels
    assert InFlight(8, 64, start=state.level(1)).level == 62
    assert InFlight(8, 40, start=state.level(1)).level == 40 and InFlight(8, 64, start=3).level == 8
