"""The client's exactly-once sessions: a fixed pool, one command per session at a time.

A command takes a free session at once when there is one (no checkpoint: this runs per
command). When every one is in use it waits its turn, first come first served, and only until
its deadline: a session given back goes straight to the longest waiter, never to the pool while
one waits, so a newcomer cannot overtake it. A command once waited with no deadline, and its
deadline began only when it had a session: with a thousand callers, 64 sessions and a dead
cluster, a caller asking for a few seconds waited minutes, or for ever as newcomers went first.
"""

from __future__ import annotations

import collections
import secrets
from dataclasses import dataclass

import anyio

from consensus.runtime.deadlines import Waiter, running_asyncio_loop


@dataclass(slots=True)
class Session:
    name: str
    sequence: int = 0  # the last one used


class SessionPool:
    __slots__ = ("_free", "_turns")

    def __init__(self, count: int) -> None:
        self._free = [Session(secrets.token_hex(8)) for _ in range(count)]
        # Waiting callers, oldest first; one that gave up is closed and skipped when its turn
        # comes (at most as many as gave up since a session last came back).
        self._turns: collections.deque[Waiter[Session]] = collections.deque()

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
        turn: Waiter[Session] = Waiter(running_asyncio_loop())
        self._turns.append(turn)
        waited = False
        try:
            with anyio.move_on_after(timeout_s):
                await turn.signal()
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
