"""The live run's clients: processes that put unique values to a few keys and read them back,
each operation recorded as it happens for the linearizability checker.

A process runs one operation at a time through a client shared by all of them (each put runs
in a session of its own, so a put retried on another replica still applies once). Outcomes
are recorded as Jepsen's clients record them:

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
    def __init__(self, store: KvStore, recorder: HistoryRecorder, *, keys: int,
                 processes: int, read_fraction: float, seed: int) -> None:
        self._store = store
        self._recorder = recorder
        self._keys = [f"k{number}" for number in range(keys)]
        self._processes = processes
        self._next_process = processes  # a process that saw `info` goes on under a new id
        self._read_fraction = read_fraction
        self._random = random.Random(seed)  # which key and which operation, not timing
        self._writes = 0
        self.outcomes = Outcomes()

    async def run(self, until_s: float) -> None:
        """Every process, until the loop's clock reaches `until_s`."""
        async with anyio.create_task_group() as group:
            for process in range(self._processes):
                group.start_soon(self._process, process, until_s)

    async def _process(self, process: int, until_s: float) -> None:
        while anyio.current_time() < until_s:
            key = self._random.choice(self._keys)
            if self._random.random() < self._read_fraction:
                await self._get(process, key)
            else:
                process = await self._put(process, key)

    async def _get(self, process: int, key: str) -> None:
        invoked_s = anyio.current_time()
        handle = self._recorder.invoke(process, "get", None, key=key)
        try:
            value = await self._store.get(key.encode())
        except ConsensusError:
            self._recorder.fail(handle)
            self.outcomes.add(invoked_s, EventType.FAIL)
            return
        self._recorder.ok(handle, None if value is None else value.decode())
        self.outcomes.add(invoked_s, EventType.OK)

    async def _put(self, process: int, key: str) -> int:
        """The put's outcome recorded; returns the id the process goes on under."""
        self._writes += 1
        value = f"{process}.{self._writes}"
        invoked_s = anyio.current_time()
        handle = self._recorder.invoke(process, "put", value, key=key)
        try:
            await self._store.put(key.encode(), value.encode())
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
