"""What `ClientServer` needs of a driver, for tests that fake the replicated log behind it:
each subclass says what `submit` does. It never takes the turn on the server's task
(`claim_turn`): that belongs to the real driver, tested with it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from consensus.runtime.metrics import Metrics
from consensus.runtime.stamp_clock import wall_clock_ms


class DriverStub:
    running = True

    def __init__(self) -> None:
        self.metrics = Metrics()

    def submit(self, command: bytes, timeout_s: float,
               done: Callable[[bytes | None, Exception | None], None], *,
               reserved: bool = False, released: Callable[[], None] | None = None) -> None:
        raise NotImplementedError

    def status(self) -> dict[str, Any]:
        return {}

    def stamp_ms(self) -> int:  # the replica's stamp clock (consensus/runtime/stamp_clock.py)
        return wall_clock_ms()

    def claim_turn(self) -> bool:
        return False

    async def turn_here(self) -> None:
        raise AssertionError("no turn was claimed")
