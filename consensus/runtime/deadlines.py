"""Many waiting requests, one timer: a deadline for each without a cancel scope for each.

A client with hundreds of requests in flight on one connection used to wait for each answer in
a cancel scope of its own; entering and leaving one arms and disarms a loop timer and reads the
clock twice, and under load that was a fifth of the client's CPU (py-spy). Here a connection's
requests wait in an `Awaited`, by request id, with their deadlines (anyio's clock) in an
`ExpiryHeap`; one task sleeps until the earliest deadline and expires every request past it.
The driver keeps its callbacks' deadlines in an `ExpiryHeap` too, polled from its loop.

On asyncio a request waits on a bare future of the running loop, which its answer settles:
anyio's `Event` wraps an asyncio `Event`, whose creation and wait were another fifth of the
client's CPU, and a `Waiter` object of our own per request a few percent more. On any other
backend (trio) it waits on a `Waiter`, which sleeps on an anyio `Event`. Either wait is
cancelled like any other. A `Doorbell` is the same wait for one task woken again and again, by
a ring or a timeout: the deadline task, the driver's inbox and the outboxes sleep on one; the
session pool's callers waiting their turn wait on Waiters, given up on asyncio by a
`WaiterDeadlines`: one loop timer, no task.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import math
from collections.abc import Awaitable, Callable, Generator
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

    def earliest_open(self) -> float:
        """The first deadline of an item still open (infinity when none), the entries of
        items that ended early before it dropped. A timer armed at `earliest` instead woke
        for each of them in turn: at one caller, once a request, for requests long answered."""
        still_open, queue, heap = self._still_open, self._queue, self._heap
        while queue and not still_open(queue[0][1]):
            queue.popleft()
        while heap and not still_open(heap[0][2]):
            heapq.heappop(heap)
        return self.earliest

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

    def __await__(self) -> Generator[object, None, T | None]:
        """`await waiter` is `await waiter.wait()`, the coroutine made only once awaited."""
        return self.wait().__await__()

    def signal(self) -> Awaitable[object]:
        """What to await before reading `answer`: on asyncio the bare future itself, so a
        caller on the hot path spends no coroutine of its own on the wait."""
        if self._future is not None:
            return self._future
        assert self._event is not None
        return self._event.wait()


class WaiterDeadlines(Generic[T]):
    """Waiters on one asyncio loop, each given up (finished with None) at its deadline (the
    loop's clock) by one loop timer, armed at the earliest deadline of a waiter still open:
    no cancel scope per wait. A waiter finished earlier is dropped when its deadline comes or
    the heap is rebuilt. A timer left armed in a loop now gone is armed anew in the next."""

    __slots__ = ("_heap", "_timer", "_timer_at", "_timer_loop")

    def __init__(self) -> None:
        self._heap: ExpiryHeap[Waiter[T]] = ExpiryHeap(_waiter_open)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf  # infinity: none armed
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def add(self, loop: asyncio.AbstractEventLoop, deadline: float, waiter: Waiter[T]) -> None:
        """`waiter` gives up at `deadline` unless finished before."""
        self._heap.push(deadline, waiter)
        if deadline < self._timer_at or loop is not self._timer_loop:
            self._arm(loop, self._heap.earliest_open())

    def _arm(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at, self._timer_loop = deadline, loop
        self._timer = None if deadline == math.inf else loop.call_at(
            deadline, self._expire_due, loop)

    def _expire_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer fired: every waiter past its deadline gives up, and the timer is armed
        again at the next open one. The deadline it was armed for counts as come, even when
        the loop fires it a little early."""
        self._timer = None
        for waiter in self._heap.due(max(loop.time(), self._timer_at)):
            waiter.finish(None)
        self._arm(loop, self._heap.earliest_open())


def _waiter_open(waiter: Waiter[T]) -> bool:
    return waiter.open


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


class Awaited(Generic[T]):
    """Answers awaited by key (a connection's request ids), each given up at its deadline:
    `wait` hands back what to await, `answer` settles it, `run` is the one task that expires
    them. On asyncio each key waits on a bare future of the loop, kept in one dict and settled
    through it (a `Waiter` per request, its own heap entry and a call to ask whether it was
    still open had been a tenth of the client's CPU under load); on another backend (trio) on
    a Waiter. Made, and used, inside one event loop."""

    def __init__(self) -> None:
        self._loop = running_asyncio_loop()
        self._now = loop_clock()
        self._open: dict[int, asyncio.Future[T | None] | Waiter[T]] = {}
        # A key answered (or forgotten) leaves `_open`, and the heap drops it when rebuilt.
        self._heap: ExpiryHeap[int] = ExpiryHeap(self._open.__contains__)
        self._armed_until = math.inf  # when `run` next wakes on its own
        self._rearm = Doorbell()  # rung when `run` must wake before then
        self._closed = False

    def __len__(self) -> int:
        """Heap entries, keys answered and not yet dropped included."""
        return len(self._heap)

    @property
    def waiting(self) -> int:
        """Keys awaited now."""
        return len(self._open)

    def wait(self, key: int, deadline: float) -> Awaitable[T | None]:
        """What to await for `key`'s answer: it, or None once `deadline` (anyio.current_time's
        clock) passed or the answers were closed. `forget(key)` once done with it. A key may
        wait once at a time."""
        if self._closed:
            closed: Waiter[T] = Waiter(None)
            closed.finish(None)
            return closed
        loop = self._loop
        if loop is not None:
            future: asyncio.Future[T | None] = loop.create_future()
            self._open[key] = future
            awaited: Awaitable[T | None] = future
        else:
            waiter: Waiter[T] = Waiter(None)
            self._open[key] = waiter
            awaited = waiter
        self._heap.push(deadline, key)
        if deadline < self._armed_until:
            self._rearm.ring()
        return awaited

    def answer(self, key: int, answer: T | None) -> None:
        """Wake `key`'s waiter with `answer`; nothing when it waits no longer."""
        waiting = self._open.pop(key, None)
        if waiting is None:
            return
        if isinstance(waiting, Waiter):
            waiting.finish(answer)
        elif not waiting.done():  # done: its waiter was cancelled
            waiting.set_result(answer)

    def forget(self, key: int) -> None:
        """`key` is no longer awaited (answered, expired or its waiter cancelled)."""
        self._open.pop(key, None)

    def close(self) -> None:
        """Wake every waiter with None now and end `run`; later keys get None at once."""
        self._closed = True
        self._armed_until = -math.inf
        for key in list(self._open):
            self.answer(key, None)
        self._rearm.ring()

    def expire_due(self, now: float) -> None:
        """Wake, with None, every waiter whose deadline is at or before `now`."""
        for key in self._heap.due(now):
            self.answer(key, None)

    async def run(self) -> None:
        """Expire waiters as their deadlines pass, until closed (or cancelled)."""
        while not self._closed:
            now = self._now()
            self.expire_due(now)
            self._armed_until = self._heap.earliest_open()
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
