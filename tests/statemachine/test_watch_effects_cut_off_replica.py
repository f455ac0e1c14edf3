"""An agent following its effects through a replica that is cut off from its peers (the
agent's own connection to it still up). That replica's watches answer, after each wait, from its
frozen state; the page showed nothing after the cursor and was believed, so the follower stayed
on that replica and missed every effect made meanwhile, for as long as the partition lasted (a
GpuStore that only watches never sends a command that would fail and move the client on). A
watch that saw no slot progress over its whole wait is now checked by a linearizable read."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from consensus.envelope import Principal, Role
from statemachine.codec import encode_command
from statemachine.commands import Tick
from statemachine.errors import Rejection
from statemachine.machine import Machine
from statemachine.results import NodeRegistered, PodBound
from statemachine.store import GpuStore
from tests.consensus.runtime.local import local_cluster
from tests.statemachine.builders import inventory, rack_spec, vc

pytestmark = pytest.mark.anyio
ADMIN = Principal(Role.ADMIN, "root")
SCHEDULER = Principal(Role.SCHEDULER, "sched")
N0 = Principal(Role.NODE, "n0")


async def test_effects_made_while_the_watched_replica_is_cut_off_reach_the_agent() -> None:
    spec = rack_spec(1, quota=[vc("team", ("A100-RACK", "A100-NODE", 2))])
    seen: list[dict[str, Any]] = []
    with anyio.fail_after(60):
        async with local_cluster(Machine, system_command=lambda now: encode_command(Tick())
                                 ) as (cluster, _):
            async with cluster.client(ADMIN, first=0) as admin_client:
                assert not isinstance(await GpuStore(admin_client).apply_config(0, spec),
                                      Rejection)
            async with cluster.client(N0, first=0) as register_client:
                registered = await GpuStore(register_client).register_node(
                    "n0", "boot-1", inventory("n0"))
                assert isinstance(registered, NodeRegistered)
            async with cluster.client(SCHEDULER, first=0) as scheduler_client, \
                    cluster.client(N0, first=2) as watch_client:
                scheduler = GpuStore(scheduler_client)
                await scheduler.submit_gang("job-1", "team", 10, [(1, 4)])
                assert isinstance(await scheduler.bind_pod("job-1", 0, "pod-a"), PodBound)

                async def follow() -> None:
                    async for effect in GpuStore(watch_client).watch_effects(
                            "n0", 0, wait_s=1.0):
                        seen.append(effect)

                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(follow)
                    while not any(e.get("pod_uid") == "pod-a" for e in seen):
                        await anyio.sleep(0.05)
                    await anyio.sleep(1.5)  # the follower is idle, watching replica 2
                    cluster.down.add(2)  # replica 2 cut off from its peers
                    await scheduler.submit_gang("job-2", "team", 10, [(1, 4)])
                    bound = await scheduler.bind_pod("job-2", 0, "pod-b")
                    assert isinstance(bound, PodBound), bound
                    with anyio.move_on_after(10):
                        while not any(e.get("pod_uid") == "pod-b" for e in seen):
                            await anyio.sleep(0.05)
                    tasks.cancel_scope.cancel()
    assert any(e.get("pod_uid") == "pod-b" for e in seen), (
        f"pod-b's start never reached the agent: {[e.get('pod_uid') for e in seen]}")
