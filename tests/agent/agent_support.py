"""Running the real agent against an in-process cluster of real state-machine replicas, on a
fake GPU backend: configurations, a running agent, and waiting for the store to agree."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio

from agent.config import AgentConfig, Intervals
from agent.daemon import Agent
from agent.fake_backend import FakeGpuBackend
from agent.job_limits import JobLimits
from consensus.envelope import Principal, Role
from consensus.runtime.config_fields import Address
from statemachine.codec import encode_command
from statemachine.commands import Tick
from statemachine.errors import Rejection
from statemachine.machine import Machine
from statemachine.store import GpuStore
from tests.consensus.runtime.local import LocalCluster, local_cluster
from tests.statemachine.builders import rack_spec, vc

T = TypeVar("T")
ADMIN = Principal(Role.ADMIN, "ops")
SCHEDULER = Principal(Role.SCHEDULER, "sched")
FAST = Intervals(heartbeat_ms=50, poll_ms=40, event_wait_ms=20, retry_ms_max=200)
QUICK_JOBS = JobLimits(grace_s=0.3, kill_wait_s=1.0, gpu_release_timeout_s=1.0,
                       gpu_poll_s=0.02, exit_poll_s=0.05)


def agent_config(node: str, state_dir: pathlib.Path, **changes: Any) -> AgentConfig:
    settings: dict[str, Any] = {"node": node, "store": (Address("memory", 1),),
                                "state_dir": state_dir, "tls": None, "insecure": True,
                                "intervals": FAST, "jobs": QUICK_JOBS, **changes}
    return AgentConfig(**settings)


@asynccontextmanager
async def configured_cluster() -> AsyncIterator[LocalCluster]:
    """Three replicas with one rack of two 8-GPU A100 nodes, n0 and n1 (tests.statemachine);
    tenant a is guaranteed one node, tenant b runs opportunistically."""
    async with local_cluster(Machine, system_command=lambda now: encode_command(Tick())
                             ) as (cluster, _), store(cluster, ADMIN) as admin:
        spec = rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)), vc("b")))
        applied = await admin.apply_config(0, spec)
        assert not isinstance(applied, Rejection), applied
        yield cluster


@asynccontextmanager
async def store(cluster: LocalCluster, principal: Principal) -> AsyncIterator[GpuStore]:
    async with cluster.client(principal) as client:
        yield GpuStore(client)


@asynccontextmanager
async def running_agent(cluster: LocalCluster, node: str, backend: FakeGpuBackend,
                        state_dir: pathlib.Path, **changes: Any) -> AsyncIterator[Agent]:
    """The agent for `node`, registered and reconciled; stopped (its jobs left running) when
    the block ends."""
    async with store(cluster, Principal(Role.NODE, node)) as node_store, \
            anyio.create_task_group() as tasks:
        agent = Agent(agent_config(node, state_dir, **changes), backend, node_store)
        await tasks.start(agent.run)
        yield agent
        tasks.cancel_scope.cancel()


async def eventually(probe: Callable[[], Awaitable[T | None]], *, timeout_s: float = 10.0,
                     what: str = "the condition") -> T:
    """Poll `probe` until it returns something other than None."""
    with anyio.move_on_after(timeout_s):
        while True:
            found = await probe()
            if found is not None:
                return found
            await anyio.sleep(0.02)
    raise AssertionError(f"{what} did not hold within {timeout_s} s")


async def gpu_view(admin: GpuStore, node: str, uuid: str) -> dict[str, Any]:
    answer: Any = await admin.node(node)
    assert not isinstance(answer, Rejection), answer
    return next(gpu for gpu in answer["gpus"] if gpu["uuid"] == uuid)
