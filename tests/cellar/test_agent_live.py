"""`cellar agent` as a process beside a live 3-replica cluster (mutual TLS, synced storage), on
the fake GPU backend: it registers its node, and a binding made just before the sequencer is
killed with SIGKILL still starts exactly once, is acknowledged and reports its exit."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import pytest

from cellar.dev.spec import dev_spec
from cellar.local_cluster import AgentProcess, Layout, ProcessCluster
from consensus.runtime.client import ClientConfig
from consensus.runtime.tls import IdentityRole
from statemachine.errors import Rejection
from statemachine.results import GroupPhase, GroupStatus
from statemachine.store import GpuStore

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(150)]
NODE = "node-00"
CLIENT = ClientConfig(attempt_timeout_s=1.0, deadline_s=30.0, sessions=8)


@contextmanager
def cluster_with_agent(tmp_path: pathlib.Path) -> Iterator[tuple[ProcessCluster, AgentProcess]]:
    layout = Layout(tmp_path / "cluster", 3, loop="asyncio")
    layout.write(admins=["root"], schedulers=["sched"], nodes=[NODE])
    cluster = ProcessCluster(layout)
    agent = AgentProcess(layout, NODE)
    cluster.start()
    try:
        cluster.wait_ports()
        yield cluster, agent
    finally:
        assert agent.stop() in (0, None), agent.log_path.read_text()[-3000:]
        cluster.stop()


@asynccontextmanager
async def store(cluster: ProcessCluster, role: IdentityRole, name: str
                ) -> AsyncIterator[GpuStore]:
    async with cluster.layout.client(role, name, CLIENT) as client:
        yield GpuStore(client)


async def until(probe: Any, what: str, timeout_s: float = 30.0) -> Any:
    with anyio.move_on_after(timeout_s):
        while True:
            found = await probe()
            if found is not None:
                return found
            await anyio.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")


async def sequencer_of(cluster: ProcessCluster, admin: GpuStore) -> int:
    for replica, endpoint in enumerate(cluster.layout.endpoints):
        status = await admin.client.status(endpoint)
        if status.get("is_sequencer"):
            return replica
    raise AssertionError("no sequencer")


async def test_a_binding_survives_a_sequencer_kill(tmp_path: pathlib.Path) -> None:
    marks = tmp_path / "started"
    job = [sys.executable, "-c", f"import os, time; open({str(marks)!r}, 'a').write("
                                 "f'{os.getpid()}\\n'); time.sleep(1)"]
    with cluster_with_agent(tmp_path) as (cluster, agent), anyio.fail_after(120):
        async with store(cluster, IdentityRole.ADMIN, "root") as admin, \
                store(cluster, IdentityRole.SCHEDULER, "sched") as scheduler:
            assert not isinstance(await admin.apply_config(0, dev_spec(4)), Rejection)
            agent.start()

            async def registered() -> bool | None:
                answer: Any = await admin.node(NODE)
                gpus = [] if isinstance(answer, Rejection) else answer["gpus"]
                return True if gpus and all(gpu["status"] == "pass" for gpu in gpus) else None

            await until(registered, "the agent registered its GPUs, all healthy")
            placed = await scheduler.submit_gang("train", "research", 10, [(2, 4)])
            assert isinstance(placed, GroupStatus) and placed.phase is GroupPhase.ALLOCATED
            victim = await sequencer_of(cluster, admin)
            assert not isinstance(await scheduler.bind_pod("train", 0, "train-0", job),
                                  Rejection)
            cluster.processes[victim].kill()

            async def exited() -> dict[str, Any] | None:
                answer: Any = await scheduler.gang("train")
                pods = [] if isinstance(answer, Rejection) else answer["pods"]
                done = [pod for pod in pods if pod["pod_uid"] == "train-0"
                        and pod["phase"] == "exited"]
                return done[0] if done else None

            pod = await until(exited, "the job ran and its exit reached the store", 60)
            assert pod["exit_code"] == 0, pod
            assert len(marks.read_text(encoding="ascii").splitlines()) == 1  # started once
            cluster.processes[victim].start()
