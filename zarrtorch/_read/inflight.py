"""How many chunk reads one process keeps in flight: fixed, or found while it runs.

Over a network every request waits a round trip (20-100 ms to an object store's first byte) before its
bytes come; keeping more requests in flight hides that wait, but each one holds a decoded chunk until it is
consumed. A fixed number is either too few for a far store or too many for a near one. :class:`InFlight`
starts where the fixed default did and tries a larger level (x1.5) when the consumer had to wait for data
in a window of pieces. After a change it lets the new level fill the pipeline (``level`` pieces), then
measures a window: it keeps the level if that window consumed pieces at least 10 % faster than the one
before the change, and goes back otherwise, trying that level again only in a later epoch. A window is at
least ``max(16, 2 x level)`` pieces and ``MIN_WINDOW_S`` long, so that one slow request does not decide. It
never passes ``most``, which the memory budget counts (``loader_memory`` stays an upper bound), and never
goes below ``first`` (local stores are no slower than with the fixed default). The loader keeps each
worker's level for the next epoch's workers (``EpochState.remember_level``).
"""

from __future__ import annotations

import math
import time

GAIN = 1.10  # a larger level must raise the rate by this much to be kept
WAITED = 0.1  # share of a window's pieces the consumer waited for before a larger level is tried
MIN_WINDOW_S = 0.2


class InFlight:
    """The requests in flight of one reading process (``level``), adapted between ``first`` and ``most``."""

    def __init__(self, first: int, most: int, *, start: int = 0, on_change=None, clock=time.monotonic):
        self.first, self.most = max(1, int(first)), max(1, int(first), int(most))
        self.level = min(self.most, max(self.first, int(start)))  # ``start``: a level found before
        self.on_change = on_change  # called with the level whenever it changes
        self._clock = clock
        self._ceiling = self.most + 1  # the smallest level tried and refused in this epoch
        self._trial: tuple[int, float] | None = None  # (level before, its rate) while a larger one is tried
        self._settle = 0  # pieces to let pass before the next window (the pipeline filling)
        self._start_window()

    @property
    def fixed(self) -> bool:
        return self.first == self.most

    def _start_window(self) -> None:
        self._pieces, self._waits, self._since = 0, 0, self._clock()

    def consumed(self, waited: bool) -> None:
        """One piece handed to the consumer; ``waited``: its read had not finished when it was asked for."""
        if self.fixed:
            return
        if self._settle:
            self._settle -= 1
            if not self._settle:
                self._start_window()
            return
        self._pieces += 1
        self._waits += bool(waited)
        elapsed = self._clock() - self._since
        if self._pieces < max(16, 2 * self.level) or elapsed < MIN_WINDOW_S:
            return
        rate = self._pieces / max(elapsed, 1e-9)
        before = self.level
        if self._trial is not None:
            previous, previous_rate = self._trial
            if rate < previous_rate * GAIN:  # no better: back, and not this high again in this epoch
                self._ceiling, self.level = self.level, previous
            self._trial = None
        elif self._waits > WAITED * self._pieces:
            larger = min(self.most, math.ceil(self.level * 1.5))
            if self.level < larger < self._ceiling:
                self._trial, self.level = (self.level, rate), larger
        self._settle = self.level if self.level != before else 0
        if self.level != before and self.on_change is not None:
            self.on_change(self.level)
        self._start_window()

    def new_epoch(self) -> None:
        """The next epoch keeps the level found, may try larger ones again, and starts a fresh window."""
        self._trial, self._settle, self._ceiling = None, 0, self.most + 1
        self._start_window()
