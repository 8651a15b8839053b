"""Requests in flight found while reading (zarrtorch._read.inflight.InFlight), on a clock the test moves, through
a model of the pipeline: the consumer spends ``work`` seconds on each piece, each read takes ``latency(level)``
seconds, so pieces come at ``min(level / latency, 1 / work)`` a second and the consumer waits for the rest. A far
store (every read takes the round trip, however many are in flight) reaches what Little's law needs within a few
round trips, and never passes the most the memory budget counts; a store whose reads queue (one server: each read
waits for the others) stops growing, and a level found before shrinks once reads start to queue; latency that
grows with the level is still overlapped while the rate follows; a consumer that is the bottleneck shrinks it back
to the first level; a fixed setting never moves. Then the loader with the
adaptive default over a slow HTTP server: every row once per epoch, 0 and 2 workers, and the memory budget
counts the most the level may reach."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zarrtorch import ReadOptions, ReadPlan, ZarrDataLoader, ZarrIterableDataset, loader_memory, prepare_zarr
from zarrtorch._read.inflight import HOLD, InFlight
from zarrtorch._read.reader import PieceReader
from zarrtorch.course.servers import HttpStoreServer


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def run(controller: InFlight, clock: Clock, pieces: int, *, work: float, latency) -> list[tuple[float, int]]:
    """Consume ``pieces``, each taking the consumer ``work`` s, each read ``latency(level)`` s: (time, level) after
    each piece."""
    out = []
    for _ in range(pieces):
        lat = latency(controller.level)
        every = max(work, lat / controller.level)  # seconds between pieces: the consumer's, or what the reads allow
        clock.now += every
        controller.consumed(every - work, lat)
        out.append((clock.now, controller.level))
    return out


def levels(trace: list[tuple[float, int]]) -> list[int]:
    return [level for _, level in trace]


@pytest.mark.parametrize(("rtt", "work"), [(0.02, 0.002), (0.1, 0.002), (0.02, 0.0005), (0.1, 0.0005)])
def test_a_far_store_reaches_what_littles_law_needs_within_a_few_round_trips(rtt, work):
    """The consumer takes a piece every ``work`` s: ``rtt / work`` reads in flight keep it busy (10 to 200). While
    it waits more than half of a window of one round trip the level may quadruple: 8 gets there in
    ``log4(need / 8)`` windows and one more (doubling took ``log2``: 200 at 100 ms in 0.52 s, now 0.32 s)."""
    clock, need = Clock(), math.ceil(rtt / work)
    c = InFlight(8, 256, clock=clock)
    trace = run(c, clock, 6000, work=work, latency=lambda n: rtt)
    reached = next(t for t, level in trace if level >= need)
    windows = math.ceil(math.log(need / 8, 4)) + 1
    assert reached <= windows * max(rtt, 0.05) + 1e-9  # windows last a round trip, >= 50 ms
    assert need <= c.level <= 2 * need and levels(trace) == sorted(levels(trace))  # no further, and never back
    assert c.base == pytest.approx(rtt)


@settings(max_examples=60, deadline=None)
@given(
    most=st.integers(1, 128),
    first=st.integers(1, 16),
    start=st.integers(0, 200),
    work=st.floats(1e-4, 0.05),
    rtt=st.floats(1e-3, 0.3),
    per_read=st.floats(0, 0.02),
)
def test_the_level_stays_between_the_first_and_the_most_the_budget_counts(most, first, start, work, rtt, per_read):
    clock = Clock()
    c = InFlight(first, most, start=start, clock=clock)
    seen = levels(run(c, clock, 600, work=work, latency=lambda n: rtt + per_read * n))
    assert max(first, 1) <= min(seen) and max(seen) <= max(first, most)


def test_reads_that_queue_stop_the_growth():
    """One server doing 100 reads/s: n in flight wait n x 10 ms each, and the rate stays 100/s. The level grows
    once (nothing said the first window's reads had queued, and the consumer waited all of it: x4), then stops:
    larger levels tried do not raise the rate and are undone, less and less often."""
    clock = Clock()
    c = InFlight(8, 64, clock=clock)
    seen = levels(run(c, clock, 3000, work=0.001, latency=lambda n: n * 0.01))
    assert seen[-1] == 32 and max(seen) == 48 and Counter(seen).most_common(1)[0][0] == 32
    tried = [i for i in range(1, len(seen)) if seen[i] > seen[i - 1] == 32]
    gaps = np.diff(tried)[:6]  # pieces between tries: doubling windows, up to a cap
    assert len(gaps) == 6 and all(np.diff(gaps) > 0)


def test_latency_that_looks_like_queueing_is_still_overlapped_while_the_rate_follows():
    """Each read waits 50 ms plus 2 ms per read in flight (a busy event loop, a scheduler): past 64 in flight the
    latency says most reads queue, yet more of them still bring more a second (86: 7% more than 64); 128 brings
    less than 10% more than 86 and is undone."""
    clock = Clock()
    c = InFlight(8, 128, clock=clock)
    seen = levels(run(c, clock, 6000, work=0.001, latency=lambda n: 0.05 + 0.002 * n))
    assert seen[-1] == Counter(seen).most_common(1)[0][0] and 64 < seen[-1] < 128


def test_a_server_that_answers_a_few_at_a_time_is_seen_in_the_first_burst():
    """A server answering 10 reads at a time, 20 ms each (500 a second): the epoch starts 32 reads at once, which
    come back in waves (10 after 20 ms, 10 after 40, ...), and then every read waits its turn (level / 500 s). The
    median of that first window is already queued; taken as the unqueued round trip, it hid the queue and the
    level climbed to the most (a break-test, on a real server; here 128 and more). Its quickest tenth shows the
    round trip: the level stays near where it started, trying a larger one now and then (x1.5, undone)."""
    clock = Clock()
    c = InFlight(8, 256, start=32, clock=clock)
    for k in range(32):  # the first burst, consumed as it arrives
        lat = 0.02 * (k // 10 + 1)
        clock.now = lat
        c.consumed(0.02 if k % 10 == 0 else 0.0, lat)
    seen = []
    for _ in range(3000):  # then a read every 2 ms, each waiting behind the level's others
        lat = c.level / 500
        clock.now += 0.002
        c.consumed(0.0019, lat)  # the consumer waits for nearly every piece
        seen.append(c.level)
    assert c.base == pytest.approx(0.02) and max(seen) <= 64 and Counter(seen).most_common(1)[0][0] <= 36


def test_a_level_found_before_shrinks_once_reads_queue():
    """A far store, then (the next epoch) its server saturates at 100 reads/s: past 10 in flight reads only wait
    their turn."""
    clock = Clock()
    c = InFlight(8, 128, clock=clock)
    run(c, clock, 2000, work=0.002, latency=lambda n: 0.1)
    found = c.level
    c.new_epoch()
    seen = levels(run(c, clock, 2000, work=0.002, latency=lambda n: max(0.1, n / 100)))
    assert found >= 50 and seen[-1] <= 40 and Counter(seen).most_common(1)[0][0] <= 40  # within 4 x the rate's need


def test_a_consumer_bound_run_shrinks_back_to_the_first_level():
    clock = Clock()
    c = InFlight(8, 64, start=40, clock=clock)  # a level found in an earlier epoch
    seen = levels(run(c, clock, 2000, work=0.02, latency=lambda n: 0.01))
    assert seen[0] == 40 and seen[-1] == 8 and seen == sorted(seen, reverse=True)


def test_a_fixed_setting_never_moves():
    clock = Clock()
    fixed = InFlight(5, 5, clock=clock)
    assert set(levels(run(fixed, clock, 500, work=0.001, latency=lambda n: 0.1))) == {5}
    assert InFlight(8, 3).most == 8  # never below the first level


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("inflight")
    data = np.arange(600 * 3, dtype=np.float32).reshape(600, 3)
    path = root / "s.zarr"
    prepare_zarr({"x": data}, path, chunk_rows=6)
    return path


def first_read_held_back(store, in_flight: InFlight, pieces: int = 40) -> tuple[int, int, list[int]]:
    """Read ``pieces`` 6-row pieces through a :class:`PieceReader` whose first read waits until the reads behind it
    have stopped starting (the others take 5 ms): (reads started meanwhile, most at once meanwhile, the pieces'
    order)."""
    import zarr

    arrays = dict(zarr.open_group(store, mode="r").arrays())
    reader = PieceReader(arrays, 6, threads=16, in_flight=in_flight)
    release, lock = threading.Event(), threading.Lock()
    started, at_once = [], [0, 0]  # now, most

    def read(a, b):
        with lock:
            started.append(a)
            at_once[0] += 1
            at_once[1] = max(at_once)
        try:
            release.wait(10) if a == 0 else time.sleep(0.005)
            return {"start": a}
        finally:
            with lock:
                at_once[0] -= 1

    it = reader.iter_pieces(np.array([[6 * i, 6 * i + 6] for i in range(pieces)]), read=read)
    with ThreadPoolExecutor(1) as consumer:
        head = consumer.submit(next, it)  # the consumer waits for the first piece
        count, deadline = -1, time.monotonic() + 10
        while count != len(started) and time.monotonic() < deadline:  # until no read has started for 0.2 s
            count = len(started)
            time.sleep(0.2)
        most_at_once = at_once[1]  # afterwards the level may change: the consumer waited
        release.set()
        order = [head.result(10)["start"]] + [p["start"] for p in it]
    return count, most_at_once, order


def test_a_slow_first_read_does_not_empty_the_wire(store):
    """Pieces are handed out in order, so reads that finish wait for the ones before them. An adapted level
    counts the reads on the wire: while the first is held back, the reads behind it finish and more start, up to
    ``held`` (``HOLD`` x the level) pieces in all and never more than the level at once; a fixed setting counts
    every read ahead, as it always has (one answer of 240 ms, twice the median at 100 ms, left the wire empty
    until it came: ``benchmarks/head_of_line.py``)."""
    adapted = InFlight(2, 8, start=4, most_held=32)
    assert adapted.held == HOLD * 4 > 4
    started, most_at_once, order = first_read_held_back(store, adapted)
    # how many of the 5 ms reads overlap is a matter of scheduling: the rule is the most, never more
    assert started == HOLD * 4 and most_at_once <= 4 and order == [6 * i for i in range(40)]
    started, most_at_once, order = first_read_held_back(store, InFlight(4, 4))
    assert started == 4 and most_at_once <= 4 and order == [6 * i for i in range(40)]
    assert InFlight(2, 8, start=8, most_held=12).held == 12  # within what the memory budget counts
    assert InFlight(2, 8, start=3).held == min(8, HOLD * 3)  # most_held is at least the most


@pytest.mark.parametrize("workers", [0, 2])
def test_the_adaptive_default_reads_every_row_once_over_a_slow_server(store, workers):
    with HttpStoreServer(store.parent, delay_ms=20) as server:
        ds = ZarrIterableDataset(f"{server.url}/{store.name}", variables=["x"], return_index=True, seed=1)
        plan = ReadPlan.of(ds, 0, decode_threads=1)
        first, most = plan.first_in_flight, plan.most_in_flight
        assert (first, most) == (8, 256)  # small chunks: the most that 256 MiB of them hold is capped at 256
        loader = ZarrDataLoader(ds, batch_size=10, num_workers=workers)
        assert loader_memory(loader).per_reader >= (most + 1) * 6 * 3 * 4  # counts the most, not the first
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            rows = np.concatenate([b["index"].numpy() for b in loader])
            assert np.array_equal(np.sort(rows), np.arange(600))
    fixed = ZarrIterableDataset(store, variables=["x"], read=ReadOptions(requests_in_flight=3))
    fixed_plan = ReadPlan.of(fixed, 0, decode_threads=1)
    assert (fixed_plan.first_in_flight, fixed_plan.most_in_flight) == (3, 3)
    local = ReadPlan.of(ZarrIterableDataset(store, variables=["x"]), 0, decode_threads=2)
    assert (local.first_in_flight, local.most_in_flight) == (3, 3)  # local: decode threads + 1


def test_the_level_found_is_kept_for_the_next_epochs_workers():
    """Non-persistent workers are new processes every epoch: the level a worker settles on goes to the loader's
    shared state, and the next epoch's worker of that id starts from it (within first and most)."""
    from zarrtorch._workers.shared import EpochState, EpochView

    state = EpochState()
    clock = Clock()
    c = InFlight(8, 64, start=state.level(1), on_change=lambda level: state.remember_level(1, level), clock=clock)
    assert c.level == 8
    run(c, clock, 3000, work=0.001, latency=lambda n: 0.1)
    assert state.level(1) == c.level == 64 and state.level(0) == 0
    state.publish(EpochView(epoch=1, skip=0, rank=0, world_size=1))  # a new epoch keeps the levels
    assert InFlight(8, 64, start=state.level(1)).level == 64
    assert InFlight(8, 40, start=state.level(1)).level == 40 and InFlight(8, 64, start=3).level == 8


def test_start_from_floor_goes_down_to_the_first_level_and_tells_the_loader():
    """A node's warm chunk cache: the next reads wait on no round trip, so an adapted level starts from its floor
    (and the loader remembers it for the next epoch's workers); a fixed setting never moves."""
    changes = []
    adapted = InFlight(8, 256, start=32, on_change=changes.append)
    adapted.start_from_floor()
    assert adapted.level == 8 and changes == [8]
    fixed = InFlight(3, 3)
    fixed.start_from_floor()
    assert fixed.level == 3
