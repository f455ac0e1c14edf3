"""The load generator's figures must not flatter a system that fails calls.

- A call that times out is a call that took at least the timeout: it must rank in the phase's
  percentiles, so a phase in which 10 % of the calls timed out cannot report a p99 below the
  timeout.
- Linearizable gets must read the same thing on every system: keys that exist, with values of
  one size, not whatever fraction the system's own puts happened to reach.
- The warm-up is not measured: its failures (a cluster still settling) are not the round's.
"""

from __future__ import annotations

import anyio

from cellar.bench.peers.kv import Durability
from cellar.bench.peers.load import PhaseResult, put_operation, run_phase
from cellar.bench.peers.workload import Workload, measure
from tests.cellar.bench.test_bench_peers import FakeClient


class EveryTenthSlow:
    """Every tenth call takes `slow_s`, the others `fast_s`."""

    def __init__(self, fast_s: float, slow_s: float) -> None:
        self.calls = 0
        self.fast_s, self.slow_s = fast_s, slow_s

    async def put(self, key: bytes, value: bytes) -> None:
        self.calls += 1
        await anyio.sleep(self.slow_s if self.calls % 10 == 0 else self.fast_s)

    async def get(self, key: bytes) -> bytes | None:
        return None

    async def aclose(self) -> None:
        pass


def test_timeouts_rank_in_the_p99() -> None:
    timeout_s = 0.05

    async def phase_of() -> PhaseResult:
        return await run_phase([EveryTenthSlow(0.001, 0.08)], 1, 0.6, put_operation(b"v" * 16),
                               timeout_s=timeout_s)

    phase = anyio.run(phase_of)
    assert phase.ops > 0 and phase.timeouts >= 1
    assert phase.timeouts / (phase.ops + phase.timeouts) > 0.05  # far more than 1 %
    assert phase.p99_ms is not None
    # 99 % of the calls did NOT finish within p99_ms if p99_ms < the timeout.
    assert phase.p99_ms >= timeout_s * 1000


class SlowWriterClient:
    """Puts take `put_s`, gets are instant: a system that writes slowly but reads fast."""

    def __init__(self, store: dict[bytes, bytes], gets: list[bytes | None],
                 put_s: float) -> None:
        self.store, self.gets, self.put_s = store, gets, put_s
        self.failing = False

    async def put(self, key: bytes, value: bytes) -> None:
        await anyio.sleep(self.put_s)
        self.store[key] = value

    async def get(self, key: bytes) -> bytes | None:
        await anyio.sleep(0.0005)
        value = self.store.get(key)
        self.gets.append(value)
        return value

    async def aclose(self) -> None:
        pass


class SlowWriterCluster:
    name = "slow-writer"
    replicas = 1
    durability = Durability(False, "a dict")

    def __init__(self, put_s: float) -> None:
        self.store: dict[bytes, bytes] = {}
        self.gets: list[bytes | None] = []
        self.put_s = put_s

    async def connect(self, callers: int = 1) -> SlowWriterClient:
        return SlowWriterClient(self.store, self.gets, self.put_s)

    def stop(self) -> None:
        pass


WORKLOAD = Workload(clients=(1, 3), seconds=0.1, latency_seconds=0.1, warmup_seconds=0.02,
                    connections=2, timeout_s=1.0)


def test_gets_read_existing_values_of_one_size_whatever_the_write_speed() -> None:
    cluster = SlowWriterCluster(put_s=0.01)
    anyio.run(measure, cluster, WORKLOAD, None)
    assert cluster.gets
    absent = sum(value is None for value in cluster.gets)
    sizes = {len(value) for value in cluster.gets if value is not None}
    assert absent == 0, f"{absent} of {len(cluster.gets)} gets read a key never written"
    assert len(sizes) == 1, f"gets read values of sizes {sizes}"


class FailsWhileSettling(FakeClient):
    """Every call fails for the first `settle_s` after the cluster starts, then all succeed."""

    def __init__(self, started: float, settle_s: float) -> None:
        super().__init__({}, delay_s=0.0005)
        self.started, self.settle_s = started, settle_s

    async def _call(self) -> None:
        await super()._call()
        if anyio.current_time() - self.started < self.settle_s:
            raise ConnectionError("no leader yet")


class SettlingCluster:
    name = "settling"
    replicas = 1
    durability = Durability(False, "a dict")
    started: float | None = None

    async def connect(self, callers: int = 1) -> FailsWhileSettling:
        if self.started is None:
            self.started = anyio.current_time()
        return FailsWhileSettling(self.started, 0.02)

    def stop(self) -> None:
        pass


def test_warm_up_failures_are_not_counted_as_the_measured_phases() -> None:
    workload = Workload(clients=(1, 2), seconds=0.05, latency_seconds=0.05, warmup_seconds=0.1,
                        connections=1, timeout_s=1.0)
    figures = anyio.run(measure, SettlingCluster(), workload, None)
    assert figures["errors"] == 0 and figures["timeouts"] == 0, figures
