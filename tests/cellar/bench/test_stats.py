"""The benchmarks' summaries: the nearest-rank percentile against its definition, and spreads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellar.bench.stats import Spread, percentile


def smallest_covering(samples: list[int], percent: int) -> int:
    """The definition, naively: the smallest sample with at least `percent` per cent of the
    samples at or below it (integer arithmetic: no rounding anywhere)."""
    for candidate in sorted(samples):
        if 100 * sum(sample <= candidate for sample in samples) >= percent * len(samples):
            return candidate
    raise AssertionError("the largest sample covers every percentage")


@given(st.lists(st.integers(-1000, 1000), min_size=1, max_size=300), st.integers(1, 100))
def test_percentile_is_the_smallest_sample_covering_the_fraction(samples: list[int],
                                                                  percent: int) -> None:
    assert percentile(sorted(samples), percent / 100) == smallest_covering(samples, percent)


@pytest.mark.parametrize(("count", "fraction", "expected"), [
    (5, 0.5, 3),  # rank ceil(2.5) = 3; rounding gave 2
    (9, 0.5, 5),
    (60, 0.99, 60),  # rank ceil(59.4) = 60, the largest; rounding gave the second largest
    (150, 0.99, 149),  # ceil(148.5) = 149; rounding half to even gave 148
    (16, 0.9, 15),  # ceil(14.4) = 15; rounding gave 14
    (1, 0.5, 1),
    (100, 0.07, 7),  # 0.07 * 100 is 7.000000000000001 in floats: still rank 7, not 8
    (10, 1.0, 10),
])
def test_the_reviewers_examples(count: int, fraction: float, expected: int) -> None:
    assert percentile(list(range(1, count + 1)), fraction) == expected


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.01, float("nan")])
def test_a_fraction_outside_zero_to_one_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="fraction"):
        percentile([1.0, 2.0], fraction)


def test_no_samples_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        percentile([], 0.5)


def test_a_spread_is_minimum_median_and_maximum() -> None:
    spread = Spread.of([3.0, 1.0, 2.0, 10.0])
    assert (spread.minimum, spread.median, spread.maximum, spread.runs) == (1.0, 2.5, 10.0, 4)
