"""How many chunk reads one process keeps in flight: fixed, or found while it runs.

Over a network every request waits a round trip (20-100 ms to an object store's first byte) before its
bytes come; keeping more requests in flight hides that wait, but each one holds a decoded chunk until it is
consumed, and past a point more requests only queue (for the cores, for the server). A fixed number is
either too few for a far store or too many for a near one.

:class:`InFlight` reasons as TCP Vegas does. Over a window of pieces it knows the rate at which the consumer
took them and the time each read took from request to data; the shortest of those times (``base``, the
median of the quickest window) is what a read costs without queueing. Keeping that rate up needs
``rate x base`` reads in flight (Little's law), so ``queued = level - rate x base`` of them only waited their
turn. When the consumer waited for data and at most half the reads in flight queued, latency held the reads
back: the level grows (x1.5). When more than three quarters queued, something else limits the reads (the
cores, the server, the consumer): the level shrinks (x0.75). Otherwise it stays. It never passes ``most``,
which the memory budget counts (``loader_memory`` stays an upper bound), and never goes below ``first``
(local stores are no slower than with the fixed default). The loader keeps each worker's level for the next
epoch's workers (``EpochState.remember_level``).
"""

from __future__ import annotations

import math
import statistics
import time

WAITED = 0.1  # share of a window's pieces the consumer waited for before a larger level is tried
FEW_QUEUED = 0.5  # grow when at most this share of the level queued (or 2 reads)
MANY_QUEUED = 0.75  # shrink when more than this share of the level queued
MIN_WINDOW_S = 0.2


class InFlight:
    """The requests in flight of one reading process (``level``), adapted between ``first`` and ``most``."""

    def __init__(self, first: int, most: int, *, start: int = 0, on_change=None, clock=time.monotonic):
        self.first, self.most = max(1, int(first)), max(1, int(first), int(most))
        self.level = min(self.most, max(self.first, int(start)))  # ``start``: a level found before
        self.on_change = on_change  # called with the level whenever it changes
        self._clock = clock
        self.base: float | None = None  # seconds a read takes without queueing (the quickest window's median)
        self._start_window()

    @property
    def fixed(self) -> bool:
        return self.first == self.most

    def _start_window(self) -> None:
        self._pieces, self._waits, self._latencies, self._since = 0, 0, [], self._clock()

    def consumed(self, waited: bool, latency: float | None = None) -> None:
        """One piece handed to the consumer; ``waited``: its read had not finished when it was asked for;
        ``latency``: seconds from its request to its data (``None``: not known, a read started early)."""
        if self.fixed:
            return
        self._pieces += 1
        self._waits += bool(waited)
        if latency is not None:
            self._latencies.append(latency)
        elapsed = self._clock() - self._since
        if self._pieces < max(16, 2 * self.level) or elapsed < MIN_WINDOW_S or not self._latencies:
            return
        median = statistics.median(self._latencies)
        self.base = median if self.base is None else min(self.base, median)
        queued = self.level - self._pieces / elapsed * self.base
        before = self.level
        if queued > MANY_QUEUED * self.level:
            self.level = max(self.first, math.floor(self.level * 0.75))
        elif self._waits > WAITED * self._pieces and queued <= max(2, FEW_QUEUED * self.level):
            self.level = min(self.most, math.ceil(self.level * 1.5))
        if self.level != before and self.on_change is not None:
            self.on_change(self.level)
        self._start_window()

    def new_epoch(self) -> None:
        """The next epoch keeps the level found and starts a fresh window (not while the last one drained)."""
        self._start_window()
