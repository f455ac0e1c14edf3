"""The driver's input queue: a bounded FIFO that one task drains, woken by items or a deadline.

Peers' frames, clients' proposals and reads all reach the driver through here. It replaced an
anyio memory stream plus a task that slept to offer a tick: each blocking receive of the stream
took an extra loop turn (its checkpoint), an anyio Event and a generic-alias instantiation, and
the tick task two sleeps per tick: together 40 % of an idle replica's busy samples (py-spy).
Here an offer is a deque append and, only when the consumer sleeps, one wake-up; the consumer
sleeps on a `Doorbell` with a loop timer for its deadline (the driver's next tick), so a tick is
no longer an item at all. An idle replica's CPU fell from 9.5 to 6.8 % of a core.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from consensus.runtime.deadlines import Doorbell

T = TypeVar("T")


class Inbox(Generic[T]):
    """Items in arrival order, at most `items_max` of them. Any task may `offer`; one task
    waits and takes. Made, and used, inside one event loop."""

    def __init__(self, items_max: int) -> None:
        if items_max < 1:
            raise ValueError(f"items_max must be at least 1, got {items_max}")
        self._items: deque[T] = deque()
        self._items_max = items_max
        self._doorbell = Doorbell()

    def __len__(self) -> int:
        return len(self._items)

    def offer(self, item: T) -> bool:
        """Queue `item` and wake the consumer; False (and nothing queued) when full."""
        if len(self._items) >= self._items_max:
            return False
        self._items.append(item)
        self._doorbell.ring()
        return True

    def take(self, items_max: int) -> list[T]:
        """Up to `items_max` items, oldest first, without waiting."""
        items = self._items
        if len(items) <= items_max:
            taken = list(items)
            items.clear()
            return taken
        return [items.popleft() for _ in range(items_max)]

    async def wait(self, timeout_s: float) -> None:
        """Return once an item is queued, or after `timeout_s` with none."""
        if not self._items:
            await self._doorbell.sleep(timeout_s)
