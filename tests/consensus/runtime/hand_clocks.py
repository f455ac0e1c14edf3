"""A wall clock and a monotonic clock moved by hand, for the stamp clock's tests."""

from __future__ import annotations

from consensus.runtime.stamp_clock import StampClock

START_MS = 1_700_000_000_000


class Clocks:
    """A wall clock and a monotonic one, moved by hand."""

    def __init__(self) -> None:
        self.wall = START_MS
        self.mono_s = 100.0

    def wall_ms(self) -> int:
        return self.wall

    def monotonic_s(self) -> float:
        return self.mono_s

    def pass_ms(self, ms: int) -> None:  # real time passes: both clocks move
        self.wall += ms
        self.mono_s += ms / 1000

    def clock(self) -> StampClock:
        return StampClock(self.wall_ms, self.monotonic_s)
