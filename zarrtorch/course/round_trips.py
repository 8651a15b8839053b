"""Lesson 07's two answers, computed where a learner reading the check cells does not see how.

The lesson derives both in its prose and asks for them in its exercises; the check cells compare the learner's
value with these functions instead of spelling the formula out next to the question.
"""

from __future__ import annotations

import math


def requests_in_flight_for(rows_per_s: float, round_trip_s: float, chunk_rows: int) -> int:
    """The fewest requests in flight that bring ``rows_per_s`` rows per second when every request waits
    ``round_trip_s`` seconds and brings one chunk of ``chunk_rows`` rows (Little's law: in flight = rate x
    round trip, counted in chunks)."""
    if rows_per_s < 0 or round_trip_s < 0 or chunk_rows < 1:
        raise ValueError(
            f"rows_per_s={rows_per_s}, round_trip_s={round_trip_s}: not negative; chunk_rows={chunk_rows}: at least 1"
        )
    return max(1, math.ceil(rows_per_s * round_trip_s / chunk_rows))


def seconds_until_given_up(policy) -> float:
    """Seconds from the start of an epoch to the ``ChunkReadError`` when the server never answers, for a
    ``zarrtorch.RetryPolicy``: the policy's own :meth:`~zarrtorch.RetryPolicy.seconds_until_given_up`."""
    return policy.seconds_until_given_up()
