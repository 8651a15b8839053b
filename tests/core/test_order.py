"""The chunk order (zarrtorch.order): a permutation of the chunks, computed one position at a time, that
equals the reference model's plain-integer account of the same network, and is as well mixed as a random
permutation by the measures lesson 03 uses (neighbours kept together, where a chunk lands)."""

from __future__ import annotations

import numpy as np
import pytest
from behaviour.loader_model import keyed_order  # tests/core is on sys.path under pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zarrtorch.order import ChunkOrder, half_bits_for


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3000), st.integers(0, 2**32 - 1), st.integers(0, 50))
def test_a_permutation_with_its_inverse(n, seed, epoch):
    order = ChunkOrder(n, seed=seed, epoch=epoch)
    whole = order.to_array()
    np.testing.assert_array_equal(np.sort(whole), np.arange(n))
    np.testing.assert_array_equal(order.position_of(whole), np.arange(n))
    if n:
        picks = np.random.default_rng(seed).integers(0, n, 20)
        np.testing.assert_array_equal(order[picks], whole[picks])  # any positions, in any order
        assert int(order[int(picks[0])]) == whole[picks[0]]  # a scalar too
    np.testing.assert_array_equal(ChunkOrder(n, seed=seed, epoch=epoch, shuffle=False).to_array(), np.arange(n))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 16, 17, 63, 64, 65, 1000])
def test_equals_the_models_plain_integer_network(n):
    for seed, epoch in [(0, 0), (7, 3), (2**32 - 1, 11)]:
        assert ChunkOrder(n, seed=seed, epoch=epoch).to_array().tolist() == (
            keyed_order(n, seed, epoch) if n > 1 else [0]
        )


def test_the_domain_is_at_most_four_times_the_chunks():
    for n in range(2, 5000):
        h = half_bits_for(n)
        assert 4**h >= n and (h == 1 or 4 ** (h - 1) < n)


def test_positions_outside_are_refused():
    with pytest.raises(IndexError, match=r"\[0, 10\)"):
        ChunkOrder(10, seed=0, epoch=0)[10]
    with pytest.raises(IndexError):
        ChunkOrder(10, seed=0, epoch=0).position_of([-1])


@pytest.mark.parametrize("n", [8, 40, 300])
def test_mixed_like_a_random_permutation(n):
    """Over 400 (seed, epoch) keys: chunks that follow each other in the store follow each other in the order
    about as often as in a uniform permutation (2/n of the neighbours), and every chunk lands in each
    quarter of the order about a quarter of the time."""
    keys = [(seed, epoch) for seed in range(100) for epoch in range(4)]
    kept, quarter = [], np.zeros((n, 4))
    for seed, epoch in keys:
        order = ChunkOrder(n, seed=seed, epoch=epoch).to_array()
        kept.append(np.mean(np.abs(np.diff(order)) == 1))
        quarter[order, np.arange(n) * 4 // n] += 1
    expected = 2 / n
    spread = np.sqrt(expected / (n - 1) / len(keys))  # binomial spread of the mean, about
    assert abs(np.mean(kept) - expected) < 5 * spread + 0.002
    share = quarter / len(keys)
    assert np.abs(share - 0.25).max() < 0.12  # 400 draws: a share's spread is about 0.02
