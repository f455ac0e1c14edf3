"""The seeded generator: same seed, same stream; ranges respected; no bias in `below`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consensus.prng import Prng


def test_same_seed_gives_the_same_stream() -> None:
    first, second = Prng(42), Prng(42)
    assert [first.next_u64() for _ in range(100)] == [second.next_u64() for _ in range(100)]


def test_the_stream_is_pinned_across_versions() -> None:
    # Golden values: a change here would break the replay of every recorded simulator seed.
    generator = Prng(0)
    assert [generator.next_u64() for _ in range(3)] == [
        0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    generator = Prng(7)
    assert [generator.below(1000) for _ in range(5)] == [855, 725, 208, 875, 517]


def test_different_seeds_differ() -> None:
    assert Prng(1).next_u64() != Prng(2).next_u64()


@given(st.integers(0, 2**64), st.integers(1, 10**12))
def test_below_stays_in_range(seed: int, bound: int) -> None:
    generator = Prng(seed)
    assert all(0 <= generator.below(bound) < bound for _ in range(20))


@given(st.integers(0, 2**32), st.integers(-50, 50), st.integers(0, 100))
def test_int_inclusive_covers_its_bounds(seed: int, low: int, width: int) -> None:
    generator = Prng(seed)
    assert all(low <= generator.int_inclusive(low, low + width) <= low + width
               for _ in range(20))


def test_below_is_roughly_uniform() -> None:
    generator = Prng(3)
    counts = [0] * 6
    for _ in range(60_000):
        counts[generator.below(6)] += 1
    assert all(9_400 < count < 10_600 for count in counts), counts


def test_chance_ppm_extremes() -> None:
    generator = Prng(5)
    assert not any(generator.chance_ppm(0) for _ in range(1000))
    assert all(generator.chance_ppm(1_000_000) for _ in range(1000))
    with pytest.raises(ValueError, match="ppm"):
        generator.chance_ppm(1_000_001)


def test_shuffle_is_a_permutation_and_deterministic() -> None:
    first, second = list(range(50)), list(range(50))
    Prng(9).shuffle(first)
    Prng(9).shuffle(second)
    assert first == second and sorted(first) == list(range(50)) and first != list(range(50))


def test_fork_gives_independent_streams() -> None:
    parent = Prng(11)
    child_a, child_b = parent.fork(1), parent.fork(2)
    assert child_a.next_u64() != child_b.next_u64()


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="seed"):
        Prng(-1)
    with pytest.raises(ValueError, match="bound"):
        Prng(1).below(0)
    with pytest.raises(ValueError, match="empty"):
        Prng(1).choice([])
