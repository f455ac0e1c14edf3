"""The client's exactly-once sessions: a fixed pool, one command per session at a time.

A command takes a free session at once when there is one (no checkpoint: this runs per
command). When every one is in use it waits its turn, first come first served, and only until
its deadline: a session given back goes straight to the longest waiter, never to the pool while
one waits, so a newcomer cannot overtake it. A command once waited with no deadline, and its
deadline began only when it had a session: with a thousand callers, 64 sessions and a dead
cluster, a caller asking for a few seconds waited minutes, or for ever as newcomers went first.

On asyncio the waiters' deadlines share one loop timer, armed at the earliest still open (an
`ExpiryHeap`), as a connection's answers do: with more callers than sessions every command
waits here, and a cancel scope per wait (a loop timer armed, disarmed and two clock reads) took
a third of the client's CPU at 8192 callers. On trio each wait keeps its own cancel scope.
"""

from __future__ import annotations

import asyncio
import collections
import math
import secrets
from dataclasses import dataclass

import anyio

from consensus.runtime.deadlines import ExpiryHeap, Waiter, running_asyncio_loop


@dataclass(slots=True)
class Session:
    name: str
    sequence: int = 0  # the last one used


class SessionPool:
    __slots__ = ("_expiries", "_free", "_timer", "_timer_at", "_timer_loop", "_turns")

    def __init__(self, count: int) -> None:
        self._free = [Session(secrets.token_hex(8)) for _ in range(count)]
        # Waiting callers, oldest first; one that gave up is closed and skipped when its turn
        # comes (at most as many as gave up since a session last came back).
        self._turns: collections.deque[Waiter[Session]] = collections.deque()
        # On asyncio: the waiters by deadline (the loop's clock), and the one timer that
        # expires them, armed in `_timer_loop` at `_timer_at` (infinity: none armed).
        self._expiries: ExpiryHeap[Waiter[Session]] = ExpiryHeap(_still_open)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def take_nowait(self) -> Session | None:
        """A free session, or None when every one is in use. (None also while callers wait:
        a session is free only when nobody waits for one.)"""
        return self._free.pop() if self._free else None

    async def take(self, timeout_s: float) -> Session | None:
        """A session, in turn after the callers already waiting; None when none came within
        `timeout_s`."""
        session = self.take_nowait()
        if session is not None:
            return session
        loop = running_asyncio_loop()
        turn: Waiter[Session] = Waiter(loop)
        self._turns.append(turn)
        waited = False
        try:
            if loop is None:
                with anyio.move_on_after(timeout_s):
                    await turn.signal()
            else:
                self._expire_at(loop, loop.time() + timeout_s, turn)
                await turn.signal()  # finished by `give_back`, or by the timer with None
            waited = True
        finally:
            turn.finish(None)  # closed: a session given back from now goes to the next one
            if not waited and turn.answer is not None:  # cancelled once it had one
                self.give_back(turn.answer)
        return turn.answer

    def give_back(self, session: Session) -> None:
        """`session` is free: to the longest waiter, or to the pool when none waits."""
        turns = self._turns
        while turns:
            turn = turns.popleft()
            if turn.open:
                turn.finish(session)
                return
        self._free.append(session)

    def _expire_at(self, loop: asyncio.AbstractEventLoop, deadline: float,
                   turn: Waiter[Session]) -> None:
        """`turn` gives up at `deadline`: the timer is armed earlier if it must be (or anew
        in this loop, when one armed in an earlier loop is left)."""
        self._expiries.push(deadline, turn)
        if deadline < self._timer_at or loop is not self._timer_loop:
            self._arm(loop, min(deadline, self._expiries.earliest_open()))

    def _arm(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at, self._timer_loop = deadline, loop
        self._timer = None if deadline == math.inf else loop.call_at(
            deadline, self._expire_due, loop)

    def _expire_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer fired: every waiter past its deadline gives up (finished with None),
        and the timer is armed again at the next open one. The deadline it was armed for
        counts as come, even when the loop fires it a little early."""
        self._timer = None
        for turn in self._expiries.due(max(loop.time(), self._timer_at)):
            turn.finish(None)
        self._arm(loop, self._expiries.earliest_open())


def _still_open(turn: Waiter[Session]) -> bool:
    return turn.open
