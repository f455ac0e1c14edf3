"""A small seeded pseudo-random generator, the only source of randomness in Cellar's pure code.

The protocol core draws its randomized timeouts from it and the simulator draws every fault from
it. It is SplitMix64 written out here, so that a seed gives the same stream on every Python
version and platform: `random.Random` promises that only for `random()` itself, not for
`randrange`, `choice` or `shuffle`. Integer arithmetic only; probabilities are given as parts per
million so that no float decides anything.
"""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from typing import TypeVar

_MASK_64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
PARTS_PER_MILLION = 1_000_000

T = TypeVar("T")


def _mix64(value: int) -> int:
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK_64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK_64
    return value ^ (value >> 31)


class Prng:
    """A deterministic stream of 64-bit integers from one seed."""

    __slots__ = ("_state",)

    def __init__(self, seed: int) -> None:
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        self._state = _mix64(seed & _MASK_64)

    def next_u64(self) -> int:
        self._state = (self._state + _GOLDEN_GAMMA) & _MASK_64
        return _mix64(self._state)

    def below(self, bound: int) -> int:
        """A uniform integer in [0, bound), without modulo bias."""
        if bound <= 0:
            raise ValueError(f"bound must be positive, got {bound}")
        limit = _MASK_64 + 1 - ((_MASK_64 + 1) % bound)
        while True:
            value = self.next_u64()
            if value < limit:
                return value % bound

    def int_inclusive(self, low: int, high: int) -> int:
        """A uniform integer in [low, high]."""
        if high < low:
            raise ValueError(f"empty range [{low}, {high}]")
        return low + self.below(high - low + 1)

    def chance_ppm(self, parts_per_million: int) -> bool:
        """True with probability parts_per_million / 1,000,000."""
        if not 0 <= parts_per_million <= PARTS_PER_MILLION:
            raise ValueError(f"probability must lie in [0, 1e6] ppm, got {parts_per_million}")
        return self.below(PARTS_PER_MILLION) < parts_per_million

    def choice(self, items: Sequence[T]) -> T:
        if not items:
            raise ValueError("cannot choose from an empty sequence")
        return items[self.below(len(items))]

    def shuffle(self, items: MutableSequence[T]) -> None:
        """Fisher-Yates, in place."""
        for index in range(len(items) - 1, 0, -1):
            other = self.below(index + 1)
            items[index], items[other] = items[other], items[index]

    def fork(self, label: int) -> Prng:
        """An independent generator derived from this one and `label` (e.g. a replica id)."""
        return Prng(_mix64(self.next_u64() ^ _mix64(label & _MASK_64)))
