"""The dev workload against an in-process cluster of real state-machine replicas: nodes
register and run pods, the scheduler places, binds and releases gangs."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from cellar.dev.spec import dev_spec, node_names
from cellar.dev.workload import Activity, Scheduler, SimulatedNode
from consensus.envelope import Principal, Role
from statemachine.codec import encode_command
from statemachine.commands import Tick
from statemachine.errors import Rejection
from statemachine.machine import Machine
from statemachine.store import GpuStore
from tests.consensus.runtime.local import LocalCluster, local_cluster


def stores(cluster: LocalCluster):
    @asynccontextmanager
    async def store_for(principal: Principal) -> AsyncIterator[GpuStore]:
        async with cluster.client(principal) as client:
            yield GpuStore(client)
    return store_for


@pytest.mark.anyio
async def test_nodes_and_scheduler_keep_gangs_moving() -> None:
    activity = Activity()
    rng = random.Random(3)
    with anyio.fail_after(60):
        async with local_cluster(Machine, system_command=lambda now: encode_command(Tick())
                                 ) as (cluster, _):
            store_for = stores(cluster)
            async with store_for(Principal(Role.ADMIN, "dev")) as admin:
                assert not isinstance(await admin.apply_config(0, dev_spec(4)), Rejection)
            scheduler = Scheduler(activity, rng, in_flight=6, pending_s_max=2)
            async with anyio.create_task_group() as tasks:
                for name in node_names(4):
                    tasks.start_soon(SimulatedNode(name, activity, rng, pod_seconds=(0.2, 0.6)).run,
                                     store_for)
                tasks.start_soon(scheduler.run, store_for)
                # A gang can be seen finished before its last exit report has returned.
                while activity.counts["finished"] < 5 or activity.counts["exit"] < 5:
                    await anyio.sleep(0.2)
                tasks.cancel_scope.cancel()
    assert activity.counts["register"] == 4
    assert activity.counts["bind"] >= 5 and activity.counts["ack_start"] >= 5
    assert activity.counts["exit"] >= 5
    assert activity.latency.count > 20
