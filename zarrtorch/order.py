"""The epoch's chunk order as a function of the position: ``order[i]`` without building ``order``.

A shuffled array of 10^7 chunk numbers costs 80 MB and a fraction of a second in every process of every
rank, every epoch, although a rank reads a thousandth of it. A *keyed bijection* gives the same service
one position at a time: a Feistel network on ``2 * half_bits`` bits (the smallest even width that holds
``n`` values) scrambles a number in a few rounds of "swap the halves, mix one into the other" and can be
run backwards, so both ``order[i]`` and its inverse (where chunk ``c`` lies in the stream) cost a few
integer operations. Numbers that land outside ``[0, n)`` are sent through the network again ("cycle
walking") until they land inside: the result is still a permutation of ``range(n)``, because the network
is one on its larger domain.

The round keys come from ``(seed, epoch)`` through NumPy's ``SeedSequence``, so every process of a job
computes the same order with no communication; the mixing function is SplitMix64's finaliser.
"""

from __future__ import annotations

import numpy as np
from numpy.random import SeedSequence

from zarrtorch._util.random_streams import CHUNK_ORDER

ROUNDS = 6
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, on uint64 arrays (products wrap modulo 2**64, as intended)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def round_keys(seed: int, epoch: int) -> np.ndarray:
    """The network's ``ROUNDS`` keys for ``(seed, epoch)``: identical in every process."""
    return SeedSequence([int(seed), int(epoch), CHUNK_ORDER]).generate_state(ROUNDS, dtype=np.uint64)


def half_bits_for(n: int) -> int:
    """Bits of each half: the smallest ``h >= 1`` with ``4**h >= n`` (so cycle walking makes fewer than
    four passes on average)."""
    return max(1, (max(n - 1, 1).bit_length() + 1) // 2)


class ChunkOrder:
    """A permutation of ``range(n)`` from ``(seed, epoch)`` (identity without ``shuffle``), indexable by
    position; :meth:`position_of` is its inverse. Both take arrays and cost O(len(argument))."""

    def __init__(self, n: int, *, seed: int, epoch: int, shuffle: bool = True):
        if n < 0:
            raise ValueError(f"the number of chunks must be >= 0, got {n}")
        self.n, self.shuffle = int(n), bool(shuffle)
        self._keys = round_keys(seed, epoch)
        self._half = np.uint64(half_bits_for(self.n))
        self._mask = np.uint64((1 << half_bits_for(self.n)) - 1)

    def __len__(self) -> int:
        return self.n

    def _forward(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for key in self._keys:
            left, right = right, left ^ (_mix(right ^ key) & self._mask)
        return (left << self._half) | right

    def _backward(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for key in self._keys[::-1]:
            left, right = right ^ (_mix(left ^ key) & self._mask), left
        return (left << self._half) | right

    def _walk(self, values: np.ndarray, step) -> np.ndarray:
        shape = np.shape(values)
        x = np.atleast_1d(np.asarray(values, dtype=np.int64)).ravel()
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"positions and chunks lie in [0, {self.n}), got {x.min()}..{x.max()}")
        if not self.shuffle or self.n <= 1:
            return x.reshape(shape)
        y = step(x.astype(np.uint64))
        outside = np.nonzero(y >= np.uint64(self.n))[0]
        while outside.size:  # cycle walking: the cycle through x comes back into [0, n) at the latest at x
            y[outside] = step(y[outside])
            outside = outside[y[outside] >= np.uint64(self.n)]
        return y.astype(np.int64).reshape(shape)

    def __getitem__(self, positions) -> np.ndarray:
        """The chunks at stream ``positions`` (an int, array or slice)."""
        if isinstance(positions, slice):
            positions = np.arange(*positions.indices(self.n))
        return self._walk(positions, self._forward)

    def position_of(self, chunks) -> np.ndarray:
        """Where ``chunks`` lie in the order: ``order[order.position_of(c)] == c``."""
        return self._walk(chunks, self._backward)

    def to_array(self) -> np.ndarray:
        """The whole order (for small ``n``: lessons, tests)."""
        return self[0 : self.n]
