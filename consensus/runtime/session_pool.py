"""The client's exactly-once sessions: a fixed pool, one command per session at a time.

A command takes a free session at once when there is one (no checkpoint: this runs per
command). When every one is in use it waits its turn, first come first served, and only until
its deadline: a session given back goes straight to the longest waiter, never to the pool while
one waits, so a newcomer cannot overtake it. A command once waited with no deadline, and its
deadline began only when it had a session: with a thousand callers, 64 sessions and a dead
cluster, a caller asking for a few seconds waited minutes, or for ever as newcomers went first.

On asyncio the waiters' deadlines share one loop timer (`WaiterDeadlines`), as a connection's
answers share one task: with more callers than sessions every command waits here, and a cancel
scope per wait (a loop timer armed, disarmed and two clock reads) took a third of the client's
CPU at 8192 callers. On trio each wait keeps its own cancel scope.
"""

from __future__ import annotations

import collections
import secrets
from dataclasses import dataclass

import anyio

from consensus.runtime.deadlines import Waiter, WaiterDeadlines, running_asyncio_loop


@dataclass(slots=True)
class Session:
    name: str
    sequence: int = 0  # the last one used


class SessionPool:
    __slots__ = ("_deadlines", "_free", "_turns")

    def __init__(self, count: int) -> None:
        self._free = [Session(secrets.token_hex(8)) for _ in range(count)]
        # Waiting callers, oldest first; one that gave up is closed and skipped when its turn
        # comes (at most as many as gave up since a session last came back).
        self._turns: collections.deque[Waiter[Session]] = collections.deque()
        self._deadlines: WaiterDeadlines[Session] = WaiterDeadlines()  # on asyncio

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
                self._deadlines.add(loop, loop.time() + timeout_s, turn)
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

