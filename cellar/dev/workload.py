"""The dev cluster's clients: a fleet of simulated node agents and a scheduler.

Each simulated node talks to the store as a real node agent would, under its own node
identity: it registers with its inventory, heartbeats, watches its effects, acknowledges pod
starts, runs each pod for a while and reports its exit, obeys kill effects, and now and then
reports a GPU failing and recovering. The scheduler keeps gangs of mixed shapes, tenants and
priorities in flight: it submits them, binds their pods once placed, and releases them once
their pods have exited (or were killed by a preemption). Every call's latency is recorded.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, aclosing
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from cellar.dev.spec import TENANTS, inventory
from consensus.envelope import Principal, Role
from consensus.runtime.client import ClientError
from consensus.runtime.metrics import Histogram
from statemachine.commands import HealthReport, HealthStatus
from statemachine.errors import Code, Rejection
from statemachine.results import NodeRegistered
from statemachine.store import GpuStore

StoreFor = Callable[[Principal], AbstractAsyncContextManager[GpuStore]]
SCHEDULER = Principal(Role.SCHEDULER, "dev-scheduler")
# (pods, GPUs per pod), weight
SHAPES = (((1, 1), 30), ((1, 2), 15), ((1, 4), 15), ((1, 8), 20), ((2, 8), 12), ((4, 8), 8))


@dataclass
class Activity:
    """What the clients did, for the live view and the summary."""

    counts: Counter[str] = field(default_factory=Counter)
    latency: Histogram = field(default_factory=Histogram)
    rejections: Counter[str] = field(default_factory=Counter)
    started_at: float = field(default_factory=time.monotonic)

    async def timed(self, name: str, call: Any, *, rejection_ok: bool = False) -> Any:
        started = time.monotonic()
        try:
            result = await call
        except ClientError:
            self.counts[f"{name}.unknown"] += 1
            return None
        self.latency.observe(time.monotonic() - started)
        self.counts[name] += 1
        if isinstance(result, Rejection) and not rejection_ok:
            self.rejections[result.code.value] += 1
        return result


class SimulatedNode:
    def __init__(self, name: str, activity: Activity, rng: random.Random, *,
                 pod_seconds: tuple[float, float] = (3.0, 12.0)) -> None:
        self.name = name
        self.activity = activity
        self.rng = rng
        self.pod_seconds = pod_seconds
        self.incarnation = 0
        self.running: dict[str, anyio.CancelScope] = {}

    async def run(self, store_for: StoreFor) -> None:
        async with store_for(Principal(Role.NODE, self.name)) as store:
            while True:
                registered = await self.activity.timed("register", store.register_node(
                    self.name, f"boot-{self.rng.getrandbits(32):08x}", inventory(self.name)))
                if isinstance(registered, NodeRegistered):
                    self.incarnation = registered.incarnation
                    break
                await anyio.sleep(1)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._heartbeats, store)
                tasks.start_soon(self._health, store)
                await self._watch(store, tasks)

    async def _watch(self, store: GpuStore, tasks: anyio.abc.TaskGroup) -> None:
        """Hand each of this node's effects to `_effect`, forever. A watch that fails (no
        quorum past the client's deadline: replicas down) is counted as a call of unknown
        outcome and resumed after the last effect handed out, as an agent would: it must not
        end the run with a traceback."""
        after = 0
        while True:
            try:
                async with aclosing(store.watch_effects(self.name, after, wait_s=2)) as effects:
                    async for effect in effects:
                        after = max(after, int(effect["index"]))
                        tasks.start_soon(self._effect, store, effect)
            except ClientError:
                self.activity.counts["watch.unknown"] += 1
                await anyio.sleep(1)

    async def _heartbeats(self, store: GpuStore) -> None:
        while True:
            await self.activity.timed("heartbeat", store.heartbeat(self.name, self.incarnation))
            await anyio.sleep(1 + self.rng.random())

    async def _health(self, store: GpuStore) -> None:
        """Now and then a GPU fails for a while, then reports pass until it recovers."""
        while True:
            await anyio.sleep(20 + 40 * self.rng.random())
            uuid = f"GPU-{self.name}-{self.rng.randrange(8)}"
            await self._report(store, uuid, HealthStatus.FAIL, "xid 79: fell off the bus")
            await anyio.sleep(5 + 5 * self.rng.random())
            for _ in range(3):
                await self._report(store, uuid, HealthStatus.PASS, "recovered")
                await anyio.sleep(1)

    async def _report(self, store: GpuStore, uuid: str, status: HealthStatus,
                      reason: str) -> None:
        await self.activity.timed("health", store.report_health(
            self.name, self.incarnation, [HealthReport(uuid=uuid, status=status,
                                                       reason=reason)]))

    async def _effect(self, store: GpuStore, effect: dict[str, Any]) -> None:
        pod, group = effect.get("pod_uid", ""), effect.get("group", "")
        if effect["kind"] == "start_pod" and pod not in self.running:
            await self.activity.timed("ack_start", store.ack_pod_started(
                self.name, self.incarnation, group, pod, effect.get("gpu_uuids", [])))
            with anyio.CancelScope() as scope:
                self.running[pod] = scope
                await anyio.sleep(self.rng.uniform(*self.pod_seconds))
            self.running.pop(pod, None)
            code = 137 if scope.cancelled_caught else 0
            await self.activity.timed("exit", store.report_pod_exit(
                self.name, self.incarnation, group, pod, code))
        elif effect["kind"] == "kill_pod" and pod in self.running:
            self.activity.counts["killed"] += 1
            self.running[pod].cancel()


class Scheduler:
    def __init__(self, activity: Activity, rng: random.Random, *, in_flight: int,
                 pending_s_max: float = 15.0) -> None:
        self.activity = activity
        self.rng = rng
        self.in_flight = in_flight
        self.pending_s_max = pending_s_max  # a gang that waits longer is withdrawn
        self.gangs: dict[str, float] = {}  # group -> when submitted
        self.submitted = 0

    async def run(self, store_for: StoreFor) -> None:
        async with store_for(SCHEDULER) as store:
            while True:
                while len(self.gangs) < self.in_flight:
                    await self._submit(store)
                for group in sorted(self.gangs):
                    await self._advance(store, group)
                await anyio.sleep(0.3)

    async def _submit(self, store: GpuStore) -> None:
        self.submitted += 1
        group = f"gang-{self.submitted:05d}"
        tenant = self.rng.choice(TENANTS)
        priority = -1 if tenant == "batch" else self.rng.choice((10, 50, 100, 500))
        shapes, weights = zip(*SHAPES, strict=True)
        pods, gpus = self.rng.choices(shapes, weights)[0]
        result = await self.activity.timed("submit", store.submit_gang(
            group, tenant, priority, [(pods, gpus)], lazy_preemption=self.rng.random() < 0.3))
        if result is not None and not isinstance(result, Rejection):
            self.gangs[group] = time.monotonic()

    async def _advance(self, store: GpuStore, group: str) -> None:
        status = await self.activity.timed("status", store.gang(group), rejection_ok=True)
        if isinstance(status, Rejection):
            # The state machine completes a gang once every pod exited: it is gone.
            self.activity.counts["finished" if status.code is Code.UNKNOWN_GROUP else
                                 "lost"] += 1
            self.gangs.pop(group, None)
            return
        if status is None:
            return
        pods = status.get("pods", [])
        if status["phase"] == "allocated":
            for pod in pods:
                if pod["phase"] == "unbound":
                    await self.activity.timed("bind", store.bind_pod(
                        group, pod["member"], f"{group}-{pod['member']}-{pod['index']}"))
        finished = pods and all(pod["phase"] == "exited" for pod in pods)
        waited_too_long = status["phase"] == "pending" and \
            time.monotonic() - self.gangs[group] > self.pending_s_max
        if finished or status.get("evicting") or waited_too_long:
            if waited_too_long:
                self.activity.counts["withdrawn"] += 1
            await self.activity.timed("release", store.release_gang(group))
            self.gangs.pop(group, None)
