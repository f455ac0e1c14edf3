"""The pending queue: gangs waiting for GPUs, in one deterministic order.

Order is (priority descending, submission index ascending), the submission index being a
counter in the replicated state; the group id breaks no tie in practice but makes the key total.
The scheduling pass walks this order with a step budget (a Tick's pass from where the last one
ran out of it, around to the head); a gang that cannot be placed does not block smaller ones
behind it (backfill), and is not retried until capacity is freed.
"""

from __future__ import annotations

import bisect

from statemachine.journal import Journal

QueueKey = tuple[int, int, str]


class PendingQueue:
    __slots__ = ("_journal", "keys")

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self.keys: list[QueueKey] = []

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, key: QueueKey) -> None:
        self._insert(key)
        self._journal.record(lambda: self._delete(key))

    def remove(self, key: QueueKey) -> None:
        self._delete(key)
        self._journal.record(lambda: self._insert(key))

    def position(self, key: QueueKey) -> int:
        return bisect.bisect_left(self.keys, key)

    def _insert(self, key: QueueKey) -> None:
        position = bisect.bisect_left(self.keys, key)
        assert position == len(self.keys) or self.keys[position] != key
        self.keys.insert(position, key)

    def _delete(self, key: QueueKey) -> None:
        position = bisect.bisect_left(self.keys, key)
        assert self.keys[position] == key
        del self.keys[position]
