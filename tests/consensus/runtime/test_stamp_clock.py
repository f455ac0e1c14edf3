"""The stamp clock (consensus/runtime/stamp_clock.py): a step of the wall clock is slewed in at
a bounded rate, never taken at once and never backwards, and the driver and the server stamp
by it. Both clocks are injected: every reading here is deterministic."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consensus.runtime.stamp_clock import PPM, SLEW_PPM, STEP_DETECT_MS
from tests.consensus.runtime.hand_clocks import START_MS, Clocks

HOUR_MS = 3_600_000


def test_without_steps_the_stamps_are_the_wall_clock() -> None:
    clocks = Clocks()
    clock = clocks.clock()
    assert clock.now_ms() == START_MS
    for _ in range(100):
        clocks.pass_ms(1000)
        assert clock.now_ms() == clocks.wall
    assert clock.offset_ms == 0 and clock.steps_detected == 0


def test_jitter_under_the_threshold_follows_the_wall_and_never_goes_back() -> None:
    clocks = Clocks()
    clock = clocks.clock()
    clocks.pass_ms(1000)
    clocks.wall += STEP_DETECT_MS - 1  # a step just under the threshold: taken
    assert clock.now_ms() == clocks.wall
    taken = clocks.wall
    clocks.pass_ms(100)
    clocks.wall -= 600  # back, behind the last stamp: held there, not gone back
    assert clock.now_ms() == taken
    clocks.pass_ms(1000)  # the wall passes the stamps again: followed
    assert clock.now_ms() == clocks.wall
    assert clock.steps_detected == 0


def test_a_forward_step_of_an_hour_is_slewed_in_at_the_bounded_rate(
        caplog: pytest.LogCaptureFixture) -> None:
    clocks = Clocks()
    clock = clocks.clock()
    clocks.pass_ms(1000)
    before = clock.now_ms()
    clocks.wall += HOUR_MS  # an admin's `date`
    with caplog.at_level(logging.WARNING, logger="cellar.stamp_clock"):
        previous = before
        for _ in range(600):  # ten minutes of Ticks, one a second
            clocks.pass_ms(1000)
            stamp = clock.now_ms()
            assert 1000 <= stamp - previous <= 1000 + 1000 * SLEW_PPM // PPM + 1
            previous = stamp
    assert previous - before <= 601_000 * (PPM + SLEW_PPM) // PPM + 1  # not an hour on
    assert clock.offset_ms > HOUR_MS - 10_000  # still catching up
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and clock.steps_detected == 1  # once for the step
    assert "+3600" in warnings[0].getMessage() and "100.0 hours" in warnings[0].getMessage()


def test_a_backward_step_never_takes_the_stamps_back_and_slews_back() -> None:
    clocks = Clocks()
    clock = clocks.clock()
    clocks.pass_ms(1000)
    before = clock.now_ms()
    clocks.wall -= HOUR_MS  # a bad NTP step
    previous = before
    for _ in range(600):
        clocks.pass_ms(1000)
        stamp = clock.now_ms()
        assert 1000 * (PPM - SLEW_PPM) // PPM - 1 <= stamp - previous <= 1000  # slower
        previous = stamp
    assert previous > before and clock.offset_ms < -(HOUR_MS - 10_000)
    assert clock.steps_detected == 1


def test_a_step_is_caught_up_and_then_the_wall_is_followed_again() -> None:
    clocks = Clocks()
    clock = clocks.clock()
    clocks.wall += 10_000  # ten seconds ahead: 1000 s of slewing at 1 %
    for _ in range(1100):
        clocks.pass_ms(1000)
        clock.now_ms()
    assert clock.now_ms() == clocks.wall and clock.offset_ms == 0
    clocks.wall -= 10_000  # and a step back: a new step, warned of again
    clocks.pass_ms(1000)
    clock.now_ms()
    assert clock.steps_detected == 2


def test_a_second_step_while_slewing_is_warned_of_again() -> None:
    clocks = Clocks()
    clock = clocks.clock()
    clocks.wall += HOUR_MS
    for _ in range(10):
        clocks.pass_ms(1000)
        clock.now_ms()
    assert clock.steps_detected == 1  # slewing on: no new warning each reading
    clocks.wall -= 2 * HOUR_MS
    clocks.pass_ms(1000)
    clock.now_ms()
    assert clock.steps_detected == 2


@given(st.lists(st.tuples(st.integers(-HOUR_MS, HOUR_MS), st.integers(0, 60_000)),
                max_size=60))
def test_the_stamps_never_go_back_and_lead_real_time_by_at_most_the_slew(
        moves: list[tuple[int, int]]) -> None:
    """Whatever the wall clock does (steps of either sign, jitter), each stamp is at least the
    one before, and the stamps move at most the time passed at the slew rate plus one step
    under the threshold each reading."""
    clocks = Clocks()
    clock = clocks.clock()
    previous = clock.now_ms()
    for step_ms, passed_ms in moves:
        clocks.wall += step_ms
        clocks.pass_ms(passed_ms)
        stamp = clock.now_ms()
        assert stamp >= previous
        assert stamp - previous <= passed_ms * (PPM + SLEW_PPM) // PPM + STEP_DETECT_MS + 1
        previous = stamp


def test_a_step_seen_after_a_long_silence_is_slewed_from_then_on() -> None:
    """A replica that read its clock seldom (an idle follower, later the sequencer) does not
    take 1 % of the whole silence at once when it sees a step."""
    clocks = Clocks()
    clock = clocks.clock()
    clocks.pass_ms(100 * HOUR_MS)  # four days without a reading
    clocks.wall += HOUR_MS
    first = clock.now_ms()
    assert first == clocks.wall - HOUR_MS  # the time passed, none of the step yet
    clocks.pass_ms(1000)
    assert clock.now_ms() - first <= 1000 * (PPM + SLEW_PPM) // PPM + 1
