"""The stamp clock read seldom while its monotonic clock and the wall drift apart slowly, as
NTP's slewing of one and not the other does (up to 500 ppm): the drift is followed, never taken
for a step, and a step being slewed in is still caught up (consensus/runtime/stamp_clock.py)."""

from __future__ import annotations

from consensus.runtime.stamp_clock import StampClock
from tests.consensus.runtime.hand_clocks import START_MS

HOUR_MS = 3_600_000
DRIFT_PPM = 500


class DriftingClocks:
    """A wall clock running `DRIFT_PPM` faster than the monotonic one."""

    def __init__(self) -> None:
        self.wall_ms_exact = float(START_MS)
        self.mono_s = 100.0

    def wall_ms(self) -> int:
        return int(self.wall_ms_exact)

    def monotonic_s(self) -> float:
        return self.mono_s

    def pass_ms(self, ms: int) -> None:
        self.mono_s += ms / 1000
        self.wall_ms_exact += ms * (1 + DRIFT_PPM / 1_000_000)


def test_a_seldom_read_clock_follows_a_slow_drift_and_sees_no_step() -> None:
    clocks = DriftingClocks()
    clock = StampClock(clocks.wall_ms, clocks.monotonic_s)
    for _ in range(100):  # read every 3 hours, 300 hours: 540 s of drift in all
        clocks.pass_ms(3 * HOUR_MS)
        assert clock.now_ms() == clocks.wall_ms()
    assert clock.steps_detected == 0
    assert clock.offset_ms == 0


def test_a_step_slewed_in_by_seldom_readings_is_caught_up_despite_the_drift() -> None:
    clocks = DriftingClocks()
    clock = StampClock(clocks.wall_ms, clocks.monotonic_s)
    clocks.wall_ms_exact += HOUR_MS  # an hour's step forward
    last_ms = clock.now_ms()
    for _ in range(60):  # read every 3 hours: 180 hours, an hour at 1 % takes 100
        clocks.pass_ms(3 * HOUR_MS)
        stamp_ms = clock.now_ms()
        assert stamp_ms >= last_ms
        last_ms = stamp_ms
    assert clock.steps_detected == 1
    assert abs(clock.offset_ms) <= 1_000
