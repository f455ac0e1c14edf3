"""The live run's clients: processes that put unique values to a few keys and read them back,
each operation recorded as it happens for the linearizability checker.

A process runs one operation at a time through a client of its own, which starts at replica
`slot mod N` (so every replica leads commands and serves reads) and moves on when that replica
fails it; a put retried on another replica still applies once (its session). Outcomes are
recorded as Jepsen's clients record them:

- a put answered is `ok`; one refused by the store, or taken by no replica (`Unavailable`:
  certainly not applied), is `fail`; one whose fate is unknown (`OutcomeUnknown`, a broken
  connection) is `info`, and the process goes on under a new id, since the put may still
  take effect at any later time;
- a read answered is `ok` with the value seen; a read with no answer is `fail` (it changed
  nothing).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import anyio

from cellar.kv.store import KvRefused, KvStore
from consensus.errors import ConsensusError
from consensus.runtime.client import Unavailable
from jepsen.history import EventType, HistoryRecorder


@dataclass
class Outcomes:
    """When each operation was invoked (the loop's clock) and how it ended."""

    started_s: float = 0.0  # when the run's clients started
    invoked_s: list[float] = field(default_factory=list)
    types: list[EventType] = field(default_factory=list)

    def add(self, invoked_s: float, kind: EventType) -> None:
        self.invoked_s.append(invoked_s)
        self.types.append(kind)

    def count(self, kind: EventType, *, invoked_after_s: float = float("-inf")) -> int:
        return sum(1 for at, seen in zip(self.invoked_s, self.types, strict=True)
                   if seen is kind and at >= invoked_after_s)


class Workload:
    def __init__(self, stores: list[KvStore], recorder: HistoryRecorder, *, keys: int,
                 read_fraction: float, seed: int) -> None:
        self._stores = stores  # one per process slot
        self._recorder = recorder
        self._keys = [f"k{number}" for number in range(keys)]
        self._next_process = len(stores)  # a process that saw `info` goes on under a new id
        self._read_fraction = read_fraction
        self._random = random.Random(seed)  # which key and which operation, not timing
        self._writes = 0
        self.outcomes = Outcomes()

    async def run(self, until_s: float) -> None:
        """Every process, until the loop's clock reaches `until_s`."""
        async with anyio.create_task_group() as group:
            for slot in range(len(self._stores)):
                group.start_soon(self._process, slot, until_s)

    async def _process(self, slot: int, until_s: float) -> None:
        process, store = slot, self._stores[slot]
        while anyio.current_time() < until_s:
            key = self._random.choice(self._keys)
            if self._random.random() < self._read_fraction:
                await self._get(store, process, key)
            else:
                process = await self._put(store, process, key)

    async def _get(self, store: KvStore, process: int, key: str) -> None:
        invoked_s = anyio.current_time()
        handle = self._recorder.invoke(process, "get", None, key=key)
        try:
            value = await store.get(key.encode())
        except ConsensusError:
            self._recorder.fail(handle)
            self.outcomes.add(invoked_s, EventType.FAIL)
            return
        self._recorder.ok(handle, None if value is None else value.decode())
        self.outcomes.add(invoked_s, EventType.OK)

    async def _put(self, store: KvStore, process: int, key: str) -> int:
        """The put's outcome recorded; returns the id the process goes on under."""
        self._writes += 1
        value = f"{process}.{self._writes}"
        invoked_s = anyio.current_time()
        handle = self._recorder.invoke(process, "put", value, key=key)
        try:
            await store.put(key.encode(), value.encode())
        except (KvRefused, Unavailable):
            kind = EventType.FAIL
        except (ConsensusError, OSError):
            kind = EventType.INFO
        else:
            kind = EventType.OK
        self._recorder.complete(handle, kind)
        self.outcomes.add(invoked_s, kind)
        if kind is not EventType.INFO:
            return process
        self._next_process += 1
        return self._next_process - 1
