"""The workload every system runs once per round, and the names of the figures it yields.

On a fresh cluster: a warm-up; one caller putting 16-byte and 1 KB values back to back (the
latency figures); the concurrent-caller throughput points for both sizes; linearizable reads
(one caller, then each of the highest caller counts: `Workload.read_clients`); then an optional
extra step (Cellar's failover).
A round is one flat `{figure name: value}` dict; the names carry their units.

The reads read what every system holds alike: before them (unmeasured) each reading caller's
`READ_KEYS_PER_CALLER` keys are written with a 1 KB value, and the gets cycle over those, so
no system's gets read absent keys or 16-byte values because its own puts reached fewer keys.
The warm-up's failures (a cluster still settling) are counted apart (`warmup_failures`), not
in the round's `errors` / `timeouts`, which are the measured phases'.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio

from cellar.bench.peers.kv import KvClient, KvCluster
from cellar.bench.peers.load import (
    Operation,
    PhaseResult,
    get_operation,
    key_for,
    put_operation,
    random_value,
    run_phase,
)

SIZES_BYTES = (16, 1024)
# Past every system's peak on a 2-core machine: PySyncObj ships batching its appends every
# 0.1 s, so its throughput grows with the calls in flight up to about 4,096 (5.8, 8.4, 11.7
# and 12.1 thousand puts/s at 1,024, 2,048, 4,096 and 8,192 callers); stopping at 1,024 had
# measured it at half its peak. Cellar peaks at 4,096 too, etcd between 1,024 and 8,192.
DEFAULT_CLIENTS = (1, 16, 64, 256, 1024, 4096, 8192)
SIZE_LABELS = {16: "16b", 1024: "1kb"}
WARMUP_CALLERS_MAX = 16
READ_KEYS_PER_CALLER = 8  # keys each reading caller cycles over, all written before the reads
READ_VALUE_BYTES = 1024
# Reads are measured at every caller count from here up (or at the highest, if none reaches
# it): a system's read peak need not lie at the most callers (etcd's gets fall past 1024).
READ_CALLERS_FLOOR = 1024
PRELOAD_ATTEMPTS = 5
# Writers of the read keys at once, each taking the next caller's keys: however many callers
# read, no put of the preload waits behind thousands (PySyncObj without batching, 8192 writers
# at once, timed out a put in every round).
PRELOAD_WRITERS_MAX = 256

Extra = Callable[[KvCluster, Sequence[KvClient]], Awaitable[dict[str, float]]]


class RoundFailed(Exception):
    """Every call of a phase failed (or no client could connect): the round is abandoned."""


@dataclass(frozen=True, slots=True)
class Workload:
    clients: tuple[int, ...]  # concurrent callers at each throughput point
    seconds: float  # each throughput and read point
    latency_seconds: float  # each single-caller phase
    warmup_seconds: float
    connections: int  # KvClients the callers share
    timeout_s: float  # one call's limit; beyond it the call counts as a timeout

    @property
    def callers_per_client(self) -> int:
        """The most callers any phase puts on one client (caller i on client i mod n; the
        warm-up and the preload have no more callers than the largest point)."""
        return -(-max(self.clients) // self.connections)

    @property
    def read_callers(self) -> int:
        """The callers whose read keys are written before the reads: the most of any point."""
        return max(self.clients)

    @property
    def read_clients(self) -> tuple[int, ...]:
        """The caller counts the reads are measured at."""
        return tuple(callers for callers in self.clients if callers >= READ_CALLERS_FLOOR) \
            or (self.read_callers,)


def single_name(operation: str) -> str:
    """The prefix of a single-caller phase's figures: "put_16b" -> "put_16b_single"."""
    return f"{operation}_single"


def point_name(operation: str, callers: int) -> str:
    """The prefix of one throughput point's figures: ("put_1kb", 64) -> "put_1kb_c64"."""
    return f"{operation}_c{callers}"


def put_label(size_bytes: int) -> str:
    return f"put_{SIZE_LABELS.get(size_bytes, f'{size_bytes}b')}"


def figures_of(prefix: str, phase: PhaseResult) -> dict[str, float]:
    """`{prefix}_ops_per_s`, and `{prefix}_p50_ms` / `_p99_ms` when any call completed."""
    figures = {f"{prefix}_ops_per_s": phase.ops_per_s}
    if phase.p50_ms is not None and phase.p99_ms is not None:
        figures |= {f"{prefix}_p50_ms": phase.p50_ms, f"{prefix}_p99_ms": phase.p99_ms}
    return figures


async def measure(cluster: KvCluster, workload: Workload, extra: Extra | None) -> dict[
        str, float]:
    """Every figure of one round on `cluster` (already started; the caller stops it).

    Clients are opened and closed in this task, outside any cancel scope, last opened first
    closed: a client may hold a task group of its own (Cellar's does)."""
    clients: list[KvClient] = []
    try:
        for _ in range(workload.connections):
            clients.append(await _connect(cluster, workload.callers_per_client))
        return await _phases(cluster, clients, workload, extra)
    finally:
        for client in reversed(clients):
            await client.aclose()


async def _connect(cluster: KvCluster, callers: int) -> KvClient:
    try:
        return await cluster.connect(callers)
    except Exception as error:
        raise RoundFailed(f"could not connect: {type(error).__name__}: {error}") from error


async def _phases(cluster: KvCluster, clients: Sequence[KvClient], workload: Workload,
                  extra: Extra | None) -> dict[str, float]:
    counts = _Counts(clients, workload.timeout_s)
    values = {size: random_value(size) for size in SIZES_BYTES}
    warmup = await counts.run("warm-up", min(WARMUP_CALLERS_MAX, max(workload.clients)),
                              workload.warmup_seconds, put_operation(values[16]), counted=False)
    figures: dict[str, float] = {"warmup_failures": float(warmup.errors + warmup.timeouts)}
    for size, value in values.items():
        prefix = single_name(put_label(size))
        figures |= figures_of(prefix, await counts.run(
            prefix, 1, workload.latency_seconds, put_operation(value)))
    for size, value in values.items():
        for callers in workload.clients:
            prefix = point_name(put_label(size), callers)
            figures |= figures_of(prefix, await counts.run(
                prefix, callers, workload.seconds, put_operation(value)))
    await preload(clients, workload.read_callers, values[READ_VALUE_BYTES], workload.timeout_s)
    prefix = single_name("get")
    figures |= figures_of(prefix, await counts.run(
        prefix, 1, workload.latency_seconds, get_operation, keys=READ_KEYS_PER_CALLER))
    for callers in workload.read_clients:
        prefix = point_name("get", callers)
        figures |= figures_of(prefix, await counts.run(
            prefix, callers, workload.seconds, get_operation, keys=READ_KEYS_PER_CALLER))
    figures |= {"errors": float(counts.errors), "timeouts": float(counts.timeouts)}
    if extra is not None:
        figures |= await extra(cluster, clients)
    return figures


@dataclass
class _Counts:
    """Runs a round's phases on its clients, summing their failures; a phase in which every
    call failed ends the round."""

    clients: Sequence[KvClient]
    timeout_s: float
    errors: int = 0
    timeouts: int = 0

    async def run(self, label: str, callers: int, seconds: float, operation: Operation, *,
                  keys: int | None = None, counted: bool = True) -> PhaseResult:
        phase = await run_phase(self.clients, callers, seconds, operation,
                                timeout_s=self.timeout_s, keys=keys)
        if counted:
            self.errors += phase.errors
            self.timeouts += phase.timeouts
        if phase.all_failed:
            raise RoundFailed(f"every call of the {label} phase failed ({phase.errors} errors, "
                              f"{phase.timeouts} timeouts; first: {phase.first_error})")
        return phase


async def preload(clients: Sequence[KvClient], callers: int, value: bytes,
                  timeout_s: float) -> None:
    """Write `value` under each of the first `callers` callers' `READ_KEYS_PER_CALLER` read
    keys (unmeasured), by at most `PRELOAD_WRITERS_MAX` writers at once, each put retried a
    few times; RoundFailed if one never succeeds."""
    failures: list[str] = []
    waiting = iter(range(callers))  # the callers whose keys are still to write, shared

    async def write(caller: int) -> None:
        client = clients[caller % len(clients)]
        for number in range(READ_KEYS_PER_CALLER):
            key = key_for(caller, number, READ_KEYS_PER_CALLER)
            for attempt in range(PRELOAD_ATTEMPTS):
                try:
                    with anyio.fail_after(timeout_s):
                        await client.put(key, value)
                    break
                except Exception as error:  # retried, then reported
                    if attempt == PRELOAD_ATTEMPTS - 1:
                        failures.append(f"{key!r}: {type(error).__name__}: {error}")
                        return

    async def writer() -> None:
        for caller in waiting:
            await write(caller)

    async with anyio.create_task_group() as tasks:
        for _ in range(min(callers, PRELOAD_WRITERS_MAX)):
            tasks.start_soon(writer)
    if failures:
        raise RoundFailed(f"could not write the keys the reads read ({len(failures)} callers "
                          f"failed; first: {failures[0]})")
