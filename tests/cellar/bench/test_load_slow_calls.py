"""The load generator's accounting of slow failures and stuck calls: a call that fails after
the limit is a timeout (it ranks in the percentiles), and one hung call does not stretch the
phase's window."""

from __future__ import annotations

import math

import anyio

from cellar.bench.peers.load import PhaseResult, put_operation, run_phase


class SlowFailure:
    """Every call waits `delay_s`, then fails with an error (a client's own deadline, say)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    async def put(self, key: bytes, value: bytes) -> None:
        await anyio.sleep(self.delay_s)
        raise RuntimeError("deadline exceeded")

    async def get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


class OneStuckCall:
    """Fast calls, except the very first call of caller 0's key 0, which never returns."""

    def __init__(self) -> None:
        self.stuck = False

    async def put(self, key: bytes, value: bytes) -> None:
        if not self.stuck:
            self.stuck = True
            await anyio.sleep(math.inf)
        await anyio.sleep(0.001)

    async def get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


def test_a_call_that_fails_after_the_timeout_within_the_phase_is_a_timeout() -> None:
    """A call over the limit is a timeout (load.py's docstring), whether it then returns or
    raises: one that raises after 0.12 s under a 0.05 s limit was counted as an error, so
    left out of the p50/p99 (a client's own deadline: Cellar's 20 s, etcd's 10 s)."""

    async def phase_of() -> PhaseResult:
        return await run_phase([SlowFailure(0.12)], 1, 0.3, put_operation(b"v"),
                               timeout_s=0.05)

    phase = anyio.run(phase_of)
    assert phase.errors == 0 and phase.timeouts >= 2, phase


def test_one_stuck_call_does_not_stretch_the_throughput_window() -> None:
    """16 callers, one of whose calls never returns: the other 15 worked for 0.3 s; the phase
    must not divide their ops by 0.3 + timeout_s (here 1.0 s: a third of the real rate)."""

    async def phase_of() -> PhaseResult:
        return await run_phase([OneStuckCall()], 16, 0.3, put_operation(b"v"), timeout_s=0.7)

    phase = anyio.run(phase_of)
    assert phase.timeouts == 1
    assert phase.elapsed_s < 0.5, phase  # 0.3 s of work, plus the last calls' tail
