"""The load generator's throughput window is the phase's own length: a call that completes
after the deadline, slowly but within the limit, must not stretch the window that every other
completed call is divided by (the drain is not measured), and counts only for its share of
time inside the window."""

from __future__ import annotations

import anyio
import pytest

from cellar.bench.peers.load import PhaseResult, put_operation, run_phase, share_in_window


class OneSlowLastCall:
    """Fast calls; the first call begun `slow_after_s` into the phase takes `slow_s`."""

    def __init__(self, slow_after_s: float, slow_s: float) -> None:
        self.started = anyio.current_time()
        self.slow_after_s, self.slow_s = slow_after_s, slow_s
        self.slow_done = False

    async def put(self, key: bytes, value: bytes) -> None:
        if not self.slow_done and anyio.current_time() - self.started >= self.slow_after_s:
            self.slow_done = True
            await anyio.sleep(self.slow_s)
            return
        await anyio.sleep(0.002)

    async def get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


def test_a_slow_completed_call_after_the_deadline_does_not_stretch_the_window() -> None:
    """4 callers for 0.3 s; one call begun near the deadline completes 0.6 s later, under the
    0.9 s limit. The window was stretched to about 0.85 s, dividing the other callers' work
    by nearly three times its length."""

    async def phase_of() -> PhaseResult:
        return await run_phase([OneSlowLastCall(0.25, 0.6)], 4, 0.3, put_operation(b"v"),
                               timeout_s=0.9)

    phase = anyio.run(phase_of)
    assert phase.timeouts == 0 and phase.errors == 0
    assert phase.elapsed_s == pytest.approx(0.3)
    # The slow call completed (it ranks in the percentiles) but counts only for its share.
    assert phase.ops_in_window < phase.ops
    assert phase.ops_per_s == pytest.approx(phase.ops_in_window / 0.3)


@pytest.mark.parametrize(("began", "ended", "deadline", "share"), [
    (0.0, 1.0, 2.0, 1.0),  # ended before the deadline: a whole operation
    (0.0, 2.0, 2.0, 1.0),  # ended at it
    (1.0, 3.0, 2.0, 0.5),  # half of it inside the window
    (1.5, 3.5, 2.0, 0.25),
    (2.0, 3.0, 2.0, 0.0),  # begun at the deadline: none of it inside
])
def test_share_in_window(began: float, ended: float, deadline: float, share: float) -> None:
    assert share_in_window(began, ended, deadline) == pytest.approx(share)


def test_shares_add_up_to_the_rate_whatever_the_latency() -> None:
    """One caller busy from 0 with calls of `latency` each: the shares inside a window of
    length 1 add up to 1 / latency, though the last call straddles the deadline."""
    for latency in (0.3, 0.4, 0.7, 1.5):
        began, total = 0.0, 0.0
        while began < 1.0:
            total += share_in_window(began, began + latency, 1.0)
            began += latency
        assert total == pytest.approx(1.0 / latency)
