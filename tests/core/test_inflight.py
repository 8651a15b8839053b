"""Requests in flight found while reading (zarrtorch._read.inflight.InFlight), on a clock the test moves. A
far store (every read takes 100 ms, however many are in flight) grows the level up to its most; a store whose
reads queue (one server: each read waits for the others) stops growing once reads queue; a consumer that is
the bottleneck shrinks it back to the first level; a fixed setting never moves. Then the loader with the
adaptive default over a slow HTTP server: every row once per epoch, 0 and 2 workers, and the memory budget
counts the most the level may reach."""

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


def run(controller: InFlight, clock: Clock, pieces: int, *, rate, latency, waited=lambda n: True) -> list[int]:
    """Consume ``pieces`` at ``rate(level)`` pieces/s, each read taking ``latency(level)`` s; the level after each."""
    levels = []
    for _ in range(pieces):
        clock.now += 1 / rate(controller.level)
        controller.consumed(waited(controller.level), latency(controller.level))
        levels.append(controller.level)
    return levels


def test_a_far_store_grows_the_level_up_to_its_most():
    clock = Clock()
    c = InFlight(8, 64, clock=clock)
    levels = run(c, clock, 3000, rate=lambda n: n / 0.1, latency=lambda n: 0.1)  # latency-bound: n per 100 ms
    assert levels[0] == 8 and levels[-1] == 64 and levels == sorted(levels)
    assert c.base == pytest.approx(0.1)


def test_reads_that_queue_stop_the_growth():
    """One server doing 100 reads/s: n in flight wait n x 10 ms each, and the rate stays 100/s."""
    clock = Clock()
    c = InFlight(8, 64, clock=clock)
    levels = run(c, clock, 3000, rate=lambda n: 100, latency=lambda n: n * 0.01)
    assert levels[-1] == 18 and max(levels) == 18  # stops where more than half of the reads in flight queue


def test_a_consumer_bound_run_shrinks_back_to_the_first_level():
    clock = Clock()
    c = InFlight(8, 64, start=40, clock=clock)  # a level found in an earlier epoch
    levels = run(c, clock, 2000, rate=lambda n: 50, latency=lambda n: 0.01, waited=lambda n: False)
    assert levels[0] == 40 and levels[-1] == 8 and levels == sorted(levels, reverse=True)


def test_a_fixed_setting_never_moves():
    clock = Clock()
    fixed = InFlight(5, 5, clock=clock)
    assert set(run(fixed, clock, 500, rate=lambda n: n / 0.1, latency=lambda n: 0.1)) == {5}
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
    run(c, clock, 3000, rate=lambda n: n / 0.1, latency=lambda n: 0.1)
    assert state.level(1) == c.level == 64 and state.level(0) == 0
    state.publish(EpochView(epoch=1, skip=0, rank=0, world_size=1))  # a new epoch keeps the levels
    assert InFlight(8, 64, start=state.level(1)).level == 64
    assert InFlight(8, 40, start=state.level(1)).level == 40 and InFlight(8, 64, start=3).level == 8
