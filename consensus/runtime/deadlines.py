"""Many waiting requests, one timer: a deadline for each without a cancel scope for each.

A client with hundreds of requests in flight on one connection used to wait for each answer in
a cancel scope of its own; entering and leaving one arms and disarms a loop timer and reads the
clock twice, and under load that was a fifth of the client's CPU (py-spy). Here a request waits
on a `Waiter` whose deadline (anyio's clock) sits in an `ExpiryHeap`; one task sleeps until the
earliest deadline and expires every waiter past it. The driver keeps its callbacks' deadlines
in an `ExpiryHeap` too, polled from its loop.

On asyncio a waiter sleeps on a bare future of the running loop: anyio's `Event` wraps an
asyncio `Event`, whose creation and wait were another fifth of the client's CPU. On any other
backend (trio) it sleeps on an anyio `Event`. Either wait is cancelled like any other. A
`Doorbell` is the same wait for one task woken again and again, by a ring or a timeout: the
deadline task, the driver's inbox and the outboxes sleep on one.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import math
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import anyio

T = TypeVar("T")
COMPACT_ENTRIES_MIN = 1024  # below this many entries the heap is never rebuilt


class ExpiryHeap(Generic[T]):
    """Items by deadline, expired lazily: `due` pops the items whose deadline passed. An item
    that ends early stays until its deadline comes; the entries are rebuilt from the items
    `still_open` keeps whenever they double, so there are never more than twice the most items
    ever open at once (or COMPACT_ENTRIES_MIN).

    Deadlines mostly come in order (a connection's requests share one timeout), and those go
    to the back of a queue: an append, where a push onto a heap of many thousand entries was
    4 % of the client's CPU at 1024 callers. A deadline earlier than the last queued goes into
    a heap beside it; `due` takes from whichever holds the earliest."""

    def __init__(self, still_open: Callable[[T], bool]) -> None:
        self._still_open = still_open
        self._queue: collections.deque[tuple[float, T]] = collections.deque()
        self._heap: list[tuple[float, int, T]] = []
        self._pushed = 0  # a tie-breaker: items never compare
        self._compact_at = COMPACT_ENTRIES_MIN

    def __len__(self) -> int:
        """Entries, items that ended early and are not yet dropped included."""
        return len(self._queue) + len(self._heap)

    @property
    def earliest(self) -> float:
        """The first deadline (infinity when empty)."""
        return min(self._queue[0][0] if self._queue else math.inf,
                   self._heap[0][0] if self._heap else math.inf)

    def push(self, deadline: float, item: T) -> None:
        queue = self._queue
        if not queue or deadline >= queue[-1][0]:
            queue.append((deadline, item))
        else:
            self._pushed += 1
            heapq.heappush(self._heap, (deadline, self._pushed, item))
        if len(queue) + len(self._heap) >= self._compact_at:
            self._compact()

    def _compact(self) -> None:
        still_open = self._still_open
        self._queue = collections.deque(
            entry for entry in self._queue if still_open(entry[1]))
        self._heap = [entry for entry in self._heap if still_open(entry[2])]
        heapq.heapify(self._heap)
        self._compact_at = max(COMPACT_ENTRIES_MIN, 2 * len(self))

    def due(self, now: float) -> list[T]:
        """Remove and return the items whose deadline is at or before `now`, earliest first."""
        queue, heap = self._queue, self._heap
        found: list[T] = []
        while queue or heap:
            if heap and (not queue or heap[0][0] < queue[0][0]):  # the heap holds the earliest
                if heap[0][0] > now:
                    break
                found.append(heapq.heappop(heap)[2])
            else:
                if queue[0][0] > now:
                    break
                found.append(queue.popleft()[1])
        return found


class Waiter(Generic[T]):
    """One request's answer to come: `finish` with it, or the deadline expires it (None)."""

    __slots__ = ("_event", "_future", "answer", "open")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._future = loop.create_future() if loop is not None else None
        self._event = anyio.Event() if loop is None else None
        self.answer: T | None = None
        self.open = True

    def finish(self, answer: T | None) -> None:
        """Wake the waiter with `answer` (None: it ends without one). Later calls do nothing."""
        if self.open:
            self.open = False
            self.answer = answer
            if self._future is not None:
                if not self._future.done():  # done: its waiter was cancelled
                    self._future.set_result(None)
            else:
                assert self._event is not None
                self._event.set()

    async def wait(self) -> T | None:
        """The answer, or None once the deadline passed or the waiter ended without one."""
        await self.signal()
        return self.answer

    def signal(self) -> Awaitable[object]:
        """What to await before reading `answer`: on asyncio the bare future itself, so a
        caller on the hot path spends no coroutine of its own on the wait."""
        if self._future is not None:
            return self._future
        assert self._event is not None
        return self._event.wait()


class Doorbell:
    """One task sleeps until another rings, or until a timeout; cheaper than an anyio Event
    made per sleep (a bare future on asyncio, the loop looked up once). Made, and used, inside
    one event loop."""

    __slots__ = ("_loop", "_loop_known", "_sleeper")

    def __init__(self) -> None:
        self._sleeper: Waiter[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_known = False

    def ring(self) -> None:
        """Wake the sleeper, if one sleeps (a ring with none asleep is not remembered)."""
        sleeper = self._sleeper
        if sleeper is not None:
            self._sleeper = None
            sleeper.finish(None)

    async def sleep(self, timeout_s: float = math.inf) -> bool:
        """Sleep until rung, or `timeout_s` passed; True if rung."""
        if not self._loop_known:
            self._loop, self._loop_known = running_asyncio_loop(), True
        loop = self._loop
        sleeper: Waiter[None] = Waiter(loop)
        self._sleeper = sleeper
        try:
            if loop is None:
                with anyio.move_on_after(timeout_s):
                    await sleeper.wait()
            elif timeout_s == math.inf:
                await sleeper.wait()
            else:
                timer = loop.call_later(max(0.0, timeout_s), sleeper.finish, None)
                try:
                    await sleeper.wait()
                finally:
                    timer.cancel()
            return self._sleeper is not sleeper  # `ring` took it; a timeout left it
        finally:
            if self._sleeper is sleeper:
                self._sleeper = None


class Deadlines(Generic[T]):
    """Expires waiters at their deadlines; `run` is the one task that does it. Made, and
    used, inside one event loop."""

    def __init__(self) -> None:
        self._loop = running_asyncio_loop()
        self._now = loop_clock()
        self._heap: ExpiryHeap[Waiter[T]] = ExpiryHeap(lambda waiter: waiter.open)
        self._armed_until = math.inf  # when `run` next wakes on its own
        self._rearm = Doorbell()  # rung when `run` must wake before then
        self._closed = False

    def close(self) -> None:
        """Expire every waiter now and end `run`; later waiters expire as soon as made."""
        self._closed = True
        self._armed_until = -math.inf
        self.expire_due(math.inf)
        self._rearm.ring()

    def waiter(self, deadline: float) -> Waiter[T]:
        """A new waiter, expired at `deadline` (anyio.current_time's clock) unless finished
        first."""
        waiter: Waiter[T] = Waiter(self._loop)
        if self._closed:
            waiter.finish(None)
            return waiter
        self._heap.push(deadline, waiter)
        if deadline < self._armed_until:
            self._rearm.ring()
        return waiter

    def __len__(self) -> int:
        """Heap entries, finished waiters not yet dropped included."""
        return len(self._heap)

    def expire_due(self, now: float) -> None:
        """Finish, without an answer, every waiter whose deadline is at or before `now`."""
        for waiter in self._heap.due(now):
            waiter.finish(None)

    async def run(self) -> None:
        """Expire waiters as their deadlines pass, until closed (or cancelled)."""
        while not self._closed:
            now = self._now()
            self.expire_due(now)
            self._armed_until = self._heap.earliest
            await self._rearm.sleep(self._armed_until - now)


def loop_clock() -> Callable[[], float]:
    """anyio.current_time's clock, looked up once: on asyncio the running loop's own `time`
    (anyio finds the backend anew on every call, which costs twenty times the read)."""
    loop = running_asyncio_loop()
    return loop.time if loop is not None else anyio.current_time


def running_asyncio_loop() -> asyncio.AbstractEventLoop | None:
    """The asyncio loop this runs in, or None under another backend (trio)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
