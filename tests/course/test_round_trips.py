"""Lesson 07's check cells compare the learner's answers with ``zarrtorch.course.round_trips`` (so that the
check does not spell the formula out next to the question): the two answers, by their properties."""

from __future__ import annotations

import pytest

from zarrtorch import RetryPolicy
from zarrtorch.course.round_trips import requests_in_flight_for, seconds_until_given_up


@pytest.mark.parametrize(
    ("rows_per_s", "round_trip_s", "chunk_rows"),
    [(5267.0, 0.100, 64), (640.0, 0.100, 64), (100_000.0, 0.020, 32), (1.0, 0.3, 1000), (12_345.6, 0.05, 7)],
)
def test_the_fewest_requests_in_flight_that_keep_the_pace(rows_per_s, round_trip_s, chunk_rows):
    n = requests_in_flight_for(rows_per_s, round_trip_s, chunk_rows)
    assert n * chunk_rows / round_trip_s >= rows_per_s  # n chunks per round trip make the pace
    assert n == 1 or (n - 1) * chunk_rows / round_trip_s < rows_per_s  # one fewer does not


def test_requests_in_flight_for_refuses_a_chunk_of_no_rows():
    with pytest.raises(ValueError, match="chunk_rows"):
        requests_in_flight_for(1000.0, 0.1, 0)


def test_a_silent_server_is_given_up_after_one_chunks_attempts():
    """Lesson 07's exercise 2 (1.8 s for RetryPolicy(0.5, 2, 0.1)), docs/object-storage.md's example (9.75 s) and
    the defaults (123.5 s)."""
    assert seconds_until_given_up(RetryPolicy(timeout_s=0.5, retries=2, backoff_s=0.1)) == pytest.approx(1.8)
    assert seconds_until_given_up(RetryPolicy()) == pytest.approx(123.5)
    assert seconds_until_given_up(RetryPolicy(timeout_s=2.0, retries=0, backoff_s=9.0)) == pytest.approx(2.0)
    assert seconds_until_given_up(RetryPolicy(timeout_s=2, retries=3, backoff_s=0.25)) == pytest.approx(9.75)
