"""The stamp clock: the time a replica stamps on what it proposes, which a wall-clock step
does not move at once.

A replica stamps the sequencer's periodic Tick (driver.py) and every client command it serves
(server.py) with its clock, and the state machine judges leases, preemption deadlines and
sessions by those stamps: logical time never goes back, and a Tick moves it freely
(statemachine/logical_time.py). Stamped with the raw time of day, a sequencer whose clock was
stepped an hour forward (an admin's `date`, a bad NTP step) expired every node lease and
session with its next Tick, and clients were locked out until real time caught up; one stepped
back stalled every expiry for as long as the step.

So a replica's stamps follow the time that passed, by a monotonic clock that counts a
suspended machine's sleep (`BOOT_CLOCK`), anchored to the wall clock at start. Each reading
compares them with the wall clock:

- within `STEP_DETECT_MS` of it, plus `DRIFT_PPM_MAX` of the time since the last reading
  (ordinary drift, NTP's own slewing, jitter), the stamp is the wall clock's reading, as
  before, held at the last one should the wall be a little behind. The allowance grows with
  the time passed: a clock read seldom (an idle follower, read again once it is sequencer)
  whose monotonic clock runs at another rate than the wall (NTP slewing one and not the
  other, up to 500 ppm) would otherwise see every reading as a new step, never slew, and fall
  behind the wall by more at each;
- farther, a step: the stamp does not jump, it slews toward the wall clock by at most
  `SLEW_PPM` of the time passed (10 ms a second), running faster toward a wall ahead and
  slower toward one behind, never backwards, from the reading that saw the step on. A WARNING
  is logged once per step, saying how far apart the clocks are and how long catching up takes;
  an INFO once caught up.

`SLEW_PPM` is 1 %: every duration the state machine judges by stamps (a 10 s lease, agents'
2 s heartbeats, a 20 s Down grace) is off by at most 1 % while slewing, 100 ms of a lease, far
inside the margins between them; an hour's step is caught up in 100 hours, so a correction
(a clock that was wrong and is set right) is taken within days, not the 83 days of NTP's own
500 ppm; and a sequencer whose wall clock was set wrongly ahead takes 8 hours to lead the
other replicas' stamps by the 300 s past which the sessions refuse their new commands as too
old (statemachine/sessions.py: STAMP_WINDOW_MS), time to see the warning and the gauge
(`offset_ms`, the wall clock less the stamps, on the replica's metrics page) and fix it.

One clock per replica process: the driver owns it and the client server stamps by it
(`Driver.stamp_ms`), so a Tick and a command served at the same instant carry one time. Both
clocks are injectable (`wall_ms`, `monotonic_s`), and a reading is a pure function of what
they return, so tests and simulations are deterministic. Not thread-safe: read it from the
replica's event loop.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

logger = logging.getLogger("cellar.stamp_clock")

# Counts the time a suspended machine slept (CLOCK_BOOTTIME on Linux), as the wall clock does:
# a machine resumed after an hour asleep did spend that hour, and must not slew it in.
BOOT_CLOCK: Callable[[], float] = (
    functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME)
    if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic)
STEP_DETECT_MS = 1_000  # wall and stamps farther apart than this: a step, slewed (docstring)
DRIFT_PPM_MAX = 500  # how fast the two clocks may drift apart unstepped: NTP's slew bound
SLEW_PPM = 10_000  # how much faster or slower than real time the stamps run while slewing
PPM = 1_000_000


def wall_clock_ms() -> int:
    """The time of day, in milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


class StampClock:
    """A replica's stamps: the wall clock, with its steps slewed (module docstring)."""

    __slots__ = ("_catching_up", "_gap_left_ms", "_monotonic_s", "_seen_s", "_stamp_ms",
                 "_wall_ms", "offset_ms", "slew_ppm", "step_detect_ms", "steps_detected")

    def __init__(self, wall_ms: Callable[[], int] = wall_clock_ms,
                 monotonic_s: Callable[[], float] = BOOT_CLOCK, *,
                 step_detect_ms: int = STEP_DETECT_MS, slew_ppm: int = SLEW_PPM) -> None:
        assert step_detect_ms >= 0 and 0 < slew_ppm < PPM, (step_detect_ms, slew_ppm)
        self._wall_ms = wall_ms
        self._monotonic_s = monotonic_s
        self.step_detect_ms = step_detect_ms
        self.slew_ppm = slew_ppm
        self._seen_s = monotonic_s()
        # the latest stamp, never lowered; anchored to the wall clock at start
        self._stamp_ms = float(wall_ms())
        self._catching_up = False  # slewing toward the wall clock
        self._gap_left_ms = 0.0  # while slewing: the gap the next reading should find
        self.offset_ms = 0  # the wall clock less the stamps, at the latest reading
        self.steps_detected = 0

    def now_ms(self) -> int:
        """The stamp for now: never less than any before it."""
        wall_ms = self._wall_ms()
        seen_s = self._monotonic_s()
        passed_ms = max(0.0, (seen_s - self._seen_s) * 1000)
        self._seen_s = max(self._seen_s, seen_s)
        free_ms = self._stamp_ms + passed_ms  # the stamps, had nothing corrected them
        gap_ms = wall_ms - free_ms
        # the gap the clocks' drift alone may open since the last reading (docstring)
        detect_ms = self.step_detect_ms + passed_ms * DRIFT_PPM_MAX / PPM
        if abs(gap_ms) <= detect_ms:
            stamp_ms = float(wall_ms)
            if self._catching_up:
                self._catching_up = False
                logger.info("the stamps are back within %d ms of the wall clock",
                            self.step_detect_ms)
        else:
            stepped = not self._catching_up or \
                abs(gap_ms - self._gap_left_ms) > detect_ms
            # Slewing runs from the reading that saw the step: the time before it passed
            # while the clocks still agreed, as far as this clock knows (a replica read
            # seldom, an idle follower, would otherwise take 1 % of days at once).
            room_ms = 0.0 if stepped else passed_ms * self.slew_ppm / PPM
            correction_ms = max(-room_ms, min(room_ms, gap_ms))
            stamp_ms = free_ms + correction_ms
            if stepped:
                self._step(gap_ms)
            self._catching_up = True
            self._gap_left_ms = gap_ms - correction_ms
        self._stamp_ms = max(self._stamp_ms, stamp_ms)
        stamped_ms = int(self._stamp_ms)
        self.offset_ms = wall_ms - stamped_ms
        return stamped_ms

    def _step(self, gap_ms: float) -> None:
        self.steps_detected += 1
        catch_up_h = abs(gap_ms) / (self.slew_ppm / PPM) / 3_600_000
        logger.warning(
            "the wall clock stepped: it is %+.3f s from this replica's stamps (an admin's "
            "`date`, an NTP step?); the stamps will not jump, they slew toward it at %d ppm "
            "(%.0f ms a second) and catch up in about %.1f hours. Check NTP on this machine",
            gap_ms / 1000, self.slew_ppm, self.slew_ppm / 1000, catch_up_h)
