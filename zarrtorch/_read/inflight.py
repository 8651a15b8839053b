"""How many chunk reads one process keeps in flight: fixed, or found while it runs.

Over a network every request waits a round trip (20-100 ms to an object store's first byte) before its
bytes come; keeping more requests in flight hides that wait, but each one holds a decoded chunk until it is
consumed, and past a point more requests only queue (for the cores, for the server). A fixed number is
either too few for a far store or too many for a near one.

:class:`InFlight` decides once per window of pieces (at least one round trip), as TCP Vegas does, from
what the window saw: the median time a read took from request to data (``latency``), the quickest such
median so far (``base``: a read without queueing; in a process's first window, which starts with a burst of
reads, its quickest tenth: a server that answers a few at a time answers those first, while the median of a
burst is already queued and would hide the queue), the rate the consumer took pieces and the time it spent
waiting for them.

* ``level x (1 - base / latency)`` of the reads in flight only waited their turn (for the cores, for the
  server): more of them would not come sooner. When the consumer waited for data and fewer than half of the
  reads queued, the round trip held them back: the level grows to what Little's law says the consumer's
  own pace needs (``pieces per second of its busy time x latency``), at most doubled per window, or
  quadrupled when the consumer waited more than half the window (slow start: 8 reaches 128 in two round
  trips; doubling took four, a third of a first epoch of 100,000 rows at 100 ms, ``benchmarks/README.md``).
* When the consumer waited but more than half of the reads queued, a level is tried: x0.75 when more than three
  quarters queued (something else limits the reads: the cores, the server), kept unless the rate fell by 10%;
  otherwise, or after a smaller one failed, x1.5 (latency from a busy event loop or scheduler looks like
  queueing, yet more reads may overlap it), kept if the rate rose by 10%. A trial is judged on the window after
  next; after a larger level failed, the next trial waits twice as many windows (at most 32).
* When the consumer did not wait and the level is more than four times what its rate needs
  (``rate x latency``, the reads in flight on average), the consumer is the bottleneck: it shrinks (x0.75).

The level counts requests on the wire. A reader hands pieces out in order, so a read that finished waits for
the reads before it; counting those too let one slow answer (a tail of 2x the median at 100 ms) empty the wire
for most of a round trip. An adapted reader therefore holds up to ``held`` pieces ahead (``HOLD`` x the level,
at most ``most_held``, which the memory budget counts: ``loader_memory`` stays an upper bound) while no more
than ``level`` are on the wire. The level never passes ``most`` and never goes below ``first`` (local stores
keep their fixed default). A process keeps its level for its next
epochs, and the loader keeps each worker's for the next epoch's workers (``EpochState.remember_level``), so
only the first epoch's first round trips are spent finding it.
"""

from __future__ import annotations

import math
import statistics
import time

WAITED = 0.05  # share of a window's time the consumer waited for data before a larger level is tried
STARVED = 0.5  # share of a window's time the consumer waited for data before the level may quadruple
FEW_QUEUED = 0.5  # grow while fewer than this share of the level queued (or 2 reads)
MANY_QUEUED = 0.75  # shrink when more than this share of the level queued
SPARE = 4  # shrink when the consumer did not wait and the level is more than this times what its rate needs
MIN_PIECES = 8  # pieces in a window, at least
MIN_WINDOW_S = 0.05  # and seconds, besides one round trip
GAIN = 0.1  # a step on trial is kept if the rate rose (grown) or fell (shrunk) by less than this share
MAX_BACKOFF = 32  # windows between trials that did not pay, at most
HOLD = 3  # pieces an adapted reader holds ahead (on the wire or read, waiting their turn) per level, at most


class InFlight:
    """The requests in flight of one reading process (``level``), adapted between ``first`` and ``most``;
    ``most_held``: the pieces its reader may hold ahead, at most (:attr:`held`)."""

    def __init__(
        self, first: int, most: int, *, start: int = 0, on_change=None, clock=time.monotonic, most_held: int = 0
    ):
        self.first, self.most = max(1, int(first)), max(1, int(first), int(most))
        self.most_held = max(self.most, int(most_held))
        self.level = min(self.most, max(self.first, int(start)))  # ``start``: a level found before
        self.on_change = on_change  # called with the level whenever it changes
        self._clock = clock
        self.base: float | None = None  # seconds a read takes without queueing (the quickest window's median)
        self._trial: tuple[int, float, int] | None = None  # a step on trial: level and rate before, windows to wait
        self._pause, self._backoff = 0, 1  # windows before the next trial, and after the next failed one
        self._down = True  # whether a smaller level is tried first when most reads queue
        self._start_window()

    @property
    def fixed(self) -> bool:
        return self.first == self.most

    @property
    def held(self) -> int:
        """Pieces the reader may hold ahead of the consumer now, those on the wire included: the level when
        fixed (the setting means both), else up to ``HOLD`` x the level."""
        return self.level if self.fixed else min(self.most_held, max(self.level, HOLD * self.level))

    def _start_window(self) -> None:
        self._pieces, self._waited, self._latencies, self._since = 0, 0.0, [], self._clock()

    def consumed(self, waited: float, latency: float | None = None) -> None:
        """One piece handed to the consumer; ``waited``: seconds the consumer waited for it (0: its read had
        finished); ``latency``: seconds from its request to its data (``None``: not known, a read started early)."""
        if self.fixed:
            return
        self._pieces += 1
        self._waited += float(waited)
        if latency is not None:
            self._latencies.append(latency)
        elapsed = self._clock() - self._since
        if self._pieces < MIN_PIECES or not self._latencies:
            return
        latency = statistics.median(self._latencies)
        if elapsed < max(MIN_WINDOW_S, latency) or latency <= 0:
            return
        if self.base is None:  # the first window starts with a burst: its quickest reads were not queued
            self.base = min(latency, sorted(self._latencies)[len(self._latencies) // 10])
        else:
            self.base = min(self.base, latency)
        before = self.level
        self.level = self._decide(elapsed, latency)
        if self.level != before and self.on_change is not None:
            self.on_change(self.level)
        self._start_window()

    def _decide(self, elapsed: float, latency: float) -> int:
        """The level for the next window, from this one's ``elapsed`` seconds and median ``latency``."""
        rate = self._pieces / elapsed
        if self._trial is not None:
            before, rate_before, settle = self._trial
            if settle:  # the reads of the new level come back a round trip later: judge the window after
                self._trial = (before, rate_before, settle - 1)
                return self.level
            self._trial = None
            grew = self.level > before
            if rate < rate_before * (1 + GAIN if grew else 1 - GAIN):  # the step did not pay: undo it
                if grew:  # and wait longer before the next try; after a smaller level failed, try a larger one
                    self._pause, self._backoff = self._backoff, min(2 * self._backoff, MAX_BACKOFF)
                self._down = grew
                return before
            self._backoff = 1
        queued = self.level * (1 - self.base / latency)
        waited = min(self._waited, elapsed)
        starved = waited > WAITED * elapsed
        if starved and queued < max(2, FEW_QUEUED * self.level):
            busy = max(elapsed - waited, elapsed / 64)  # the consumer's own time: its pace without waiting
            needed = math.ceil(self._pieces / busy * latency)  # Little's law
            step = 4 if waited > STARVED * elapsed else 2
            return min(self.most, step * self.level, max(self.level + 1, needed))
        if not starved:
            if self.level > SPARE * rate * latency:
                return max(self.first, math.floor(self.level * 0.75))
            return self.level
        if self._pause:
            self._pause -= 1
            return self.level
        smaller = max(self.first, math.floor(self.level * 0.75))
        if queued > MANY_QUEUED * self.level and self._down and smaller < self.level:
            return self._try(smaller, rate)
        # latency that looks like queueing (a busy event loop, a scheduler) may still be overlapped by more reads
        return self._try(min(self.most, math.ceil(self.level * 1.5)), rate)

    def _try(self, level: int, rate: float) -> int:
        """Move to ``level`` on trial: kept if the rate follows, undone (and tried again later) if not."""
        if level != self.level:
            self._trial = (self.level, rate, 1)
        return level

    def start_from_floor(self) -> None:
        """Go down to ``first`` and start a fresh window: the next reads wait on no round trip (a node's warm chunk
        cache holds them), and a level found for the network would only queue them at the decoders, where the
        latency it sees never tells it to shrink. If they do wait, the level grows again as it does."""
        if self.fixed:
            return
        if self.level != self.first:
            self.level = self.first
            if self.on_change is not None:
                self.on_change(self.level)
        self._trial = None
        self._start_window()

    def new_epoch(self) -> None:
        """The next epoch keeps the level found and starts a fresh window (not while the last one drained)."""
        self._trial = None
        self._start_window()
