"""The load generator of `cellar bench peers`: callers repeating one operation back to back for
a fixed time over shared `KvClient`s, counting what completed, failed and timed out.

Callers are spread round-robin over a few client connections (the same number for every
system), so each system sees the same concurrency over the same number of connections. Each
caller cycles over its own keys: `KEYS_PER_CALLER`, or fewer with many callers
(`keys_per_caller`), made before the phase's clock starts (formatting a key per call was about a
twelfth of the load generator's process at 4,096 callers, CPU that every system's client
shares with it). A failed call is counted, never raised: the
phase reports how many calls completed per second over its window (from its start to its
deadline), their p50 and p99, and the failures beside them.

The window is the phase's `seconds`, never stretched by the calls still open at the deadline:
a call that completes after it counts towards the throughput for the share of its time that
lay inside the window (`share_in_window`). So a slow but successful last call neither
stretches the divisor (the window had run to the end of the last completed call: one call
begun just before the deadline that took twice the phase's length, within the limit, cut the
rate to a third) nor adds a whole operation for a fraction of its work. Every caller is busy
from the phase's start, so these shares add up to what the callers completed per second of
the window, whatever their latency: neither a system with long calls (whose last ones
straddle the deadline) nor one with a straggler is charged for the drain.

A call that takes longer than the timeout counts as a timeout, not a completed call (whether it
then returns or raises); calls
still open `timeout_s` after the phase's deadline are cut off and count as timeouts too. A
timed-out call still ranks in the phase's percentiles, at the time it took (at least the
timeout): a phase in which more than 1 % of the calls timed out reports a p99 of at least the
timeout, never the p99 of the calls that happened to finish. (A call that failed with an error
is counted beside the figures, not ranked: it has no latency to speak of.) That is one
cancel scope per phase, not one per call: a scope per call was a quarter of this process's CPU
at 256 callers, which every system's client shares with the load generator.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from cellar.bench.peers.kv import KvClient
from cellar.bench.stats import percentile

KEYS_PER_CALLER = 1000
# The most keys one phase's callers cycle over together: past 65 callers each has fewer than
# KEYS_PER_CALLER. A run's puts then reach about 244,000 keys (250 MB of 1 KB values), within
# what every system holds: Cellar's key-value machine refuses puts past 512 MiB (STORE_FULL),
# and with 1,000 keys a caller its batched puts had filled it by 8,192 callers of 1 KB puts.
KEYS_PER_PHASE_MAX = 65_536
ERROR_PAUSE_S = 0.01  # after a failed call, so a refused connection does not spin the loop

Operation = Callable[[KvClient, bytes], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class PhaseResult:
    """What `callers` callers completed in one phase."""

    callers: int
    elapsed_s: float  # the window: from the phase's start to its deadline
    ops: int  # calls completed within the limit, those ending after the deadline included
    ops_in_window: float  # the same, each counted for its share of time inside the window
    errors: int
    timeouts: int
    p50_ms: float | None  # None when no call completed
    p99_ms: float | None
    first_error: str | None

    @property
    def ops_per_s(self) -> float:
        return self.ops_in_window / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def all_failed(self) -> bool:
        return self.ops == 0 and self.errors + self.timeouts > 0


@dataclass
class _Tally:
    """The running counts of one phase, shared by its callers (one event loop: no locks)."""

    latencies_s: list[float] = field(default_factory=list)
    timed_out_s: list[float] = field(default_factory=list)  # how long each timed-out call took
    errors: int = 0
    timeouts: int = 0
    open_calls: int = 0  # calls started and not yet ended
    first_error: str | None = None
    ops_in_window: float = 0.0  # completed calls, each for its share inside the window

    def failed(self, error: Exception, took_s: float) -> None:
        if isinstance(error, TimeoutError):
            self.timeouts += 1
            self.timed_out_s.append(took_s)
        else:
            self.errors += 1
        if self.first_error is None:
            self.first_error = f"{type(error).__name__}: {error}"

    def result(self, callers: int, elapsed_s: float, timeout_s: float) -> PhaseResult:
        ops = len(self.latencies_s)
        # Every timed-out call took at least the timeout (those cut off at the phase's end
        # were open longer than that): it ranks there, not out of the distribution.
        cut_off = self.timeouts - len(self.timed_out_s)
        ordered = sorted([*self.latencies_s, *(max(took_s, timeout_s)
                                               for took_s in self.timed_out_s),
                          *([timeout_s] * cut_off)])
        p50_ms = percentile(ordered, 0.5) * 1000 if ops else None
        p99_ms = percentile(ordered, 0.99) * 1000 if ops else None
        return PhaseResult(callers, elapsed_s, ops, self.ops_in_window, self.errors,
                           self.timeouts,
                           p50_ms, p99_ms, self.first_error)


def share_in_window(began: float, ended: float, deadline: float) -> float:
    """The share of a completed call, begun at `began` (not after `deadline`) and ended at
    `ended`, that lay inside a window ending at `deadline`: 1 when it ended by then."""
    if ended <= deadline:
        return 1.0
    return max(0.0, deadline - began) / (ended - began)


def keys_per_caller(callers: int) -> int:
    """How many keys each of `callers` callers cycles over in a phase."""
    return max(1, min(KEYS_PER_CALLER, KEYS_PER_PHASE_MAX // callers))


def key_for(caller: int, number: int, keys: int = KEYS_PER_CALLER) -> bytes:
    """The `number`th key caller `caller` touches: its own `keys` keys in turn."""
    return b"bench-%05d-%04d" % (caller, number % keys)


def random_value(size_bytes: int) -> bytes:
    return os.urandom(size_bytes)


def put_operation(value: bytes) -> Operation:
    """Put `value` (made once, shared by every call) under each key. (The operations hand
    back the client's own awaitable: no coroutine of theirs per call, for any system.)"""

    def put(client: KvClient, key: bytes) -> Awaitable[None]:
        return client.put(key, value)

    return put


def get_operation(client: KvClient, key: bytes) -> Awaitable[bytes | None]:
    return client.get(key)


@dataclass(frozen=True, slots=True)
class _Phase:
    deadline: float  # time.monotonic() after which callers start no new call
    operation: Operation
    timeout_s: float
    tally: _Tally
    keys: list[list[bytes]]  # each caller's keys, in the order it puts them


async def run_phase(clients: Sequence[KvClient], callers: int, seconds: float,
                    operation: Operation, *, timeout_s: float,
                    keys: int | None = None) -> PhaseResult:
    """`callers` callers repeating `operation` for `seconds`, caller i on clients[i % n],
    each over its own `keys` keys (default: `keys_per_caller(callers)`)."""
    if not clients or callers < 1:
        raise ValueError("a phase needs at least one client and one caller")
    count = keys_per_caller(callers) if keys is None else keys
    callers_keys = [[key_for(caller, number, count) for number in range(count)]
                    for caller in range(callers)]
    started = time.monotonic()
    phase = _Phase(started + seconds, operation, timeout_s, _Tally(), callers_keys)
    with anyio.move_on_after(seconds + timeout_s):
        async with anyio.create_task_group() as tasks:
            for caller in range(callers):
                tasks.start_soon(_caller, phase, clients[caller % len(clients)], caller)
    phase.tally.timeouts += phase.tally.open_calls  # cut off at the end
    # The window is the phase's own length: calls still open at the deadline count for their
    # share inside it, so neither a hung call nor a slow completed one stretches it.
    return phase.tally.result(callers, phase.deadline - started, timeout_s)


async def _caller(phase: _Phase, client: KvClient, caller: int) -> None:
    keys = phase.keys[caller]
    count = len(keys)
    number = 0
    while (began := time.monotonic()) < phase.deadline:
        key = keys[number % count]
        number += 1
        # Not decremented in a `finally`: a call cut off at the phase's end stays counted open.
        phase.tally.open_calls += 1
        try:
            await phase.operation(client, key)
        except Exception as error:  # counted; the phase goes on
            phase.tally.open_calls -= 1
            took_s = time.monotonic() - began
            failure = error
            if took_s > phase.timeout_s:  # over the limit: a timeout, whatever it raised
                failure = TimeoutError(f"a call failed after {took_s:.3f} s: "
                                       f"{type(error).__name__}: {error}")
            phase.tally.failed(failure, took_s)
            await anyio.sleep(ERROR_PAUSE_S)
            continue
        phase.tally.open_calls -= 1
        took_s = time.monotonic() - began
        if took_s > phase.timeout_s:
            phase.tally.failed(TimeoutError(f"a call took {took_s:.3f} s"), took_s)
        else:
            phase.tally.latencies_s.append(took_s)
            phase.tally.ops_in_window += share_in_window(began, began + took_s,
                                                         phase.deadline)
