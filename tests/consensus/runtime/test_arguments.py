"""The command lines' number types: what they take, and that what they refuse is named."""

from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consensus.runtime.arguments import at_least, seconds


@given(st.integers(-10**6, 10**6), st.integers(-5, 5))
def test_at_least_takes_exactly_the_whole_numbers_from_its_bound(value: int, least: int) -> None:
    parse = at_least(least)
    if value >= least:
        assert parse(str(value)) == value
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=f"at least {least}, not {value}"):
            parse(str(value))


@pytest.mark.parametrize("text", ["", "x", "1.5", "1e3", "0x10"])
def test_at_least_refuses_what_is_not_a_whole_number(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a whole number"):
        at_least(0)(text)


@given(st.floats(allow_nan=True, allow_infinity=True), st.booleans())
def test_seconds_takes_exactly_the_finite_durations(value: float, zero_ok: bool) -> None:
    parse = seconds(zero_ok=zero_ok)
    if math.isfinite(value) and (value > 0 or (value == 0 and zero_ok)):
        assert parse(repr(value)) == value
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="and finite, not"):
            parse(repr(value))


def test_seconds_refuses_words() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a number: 'soon'"):
        seconds()("soon")


def test_seconds_can_be_bounded_above() -> None:
    parse = seconds(most=45.0)
    assert parse("45") == 45.0
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be at most 45, not 45\.5"):
        parse("45.5")
