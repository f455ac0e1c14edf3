"""The driver, server and client together, in one process, on trio and on asyncio: three
drivers wired by an in-memory network, a client talking to the replicas over in-memory frame
streams."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import pytest

from consensus.codec import unpack
from consensus.config import ReplicaConfig
from consensus.envelope import Principal, Role
from consensus.prng import Prng
from consensus.records import Record
from consensus.replica import Replica
from consensus.runtime.client import CellarClient, ClientConfig, OutcomeUnknown
from consensus.runtime.driver import Driver, DriverConfig
from consensus.runtime.metrics import Metrics
from consensus.runtime.server import ClientServer
from jepsen.sim.kv_codec import decode_reply, encode_get, encode_put
from tests.consensus.runtime.kv_machine import SessionKv

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@dataclass
class MemoryStore:
    records: list[Record] = field(default_factory=list)
    syncs: int = 0

    def append(self, records: Sequence[Record]) -> None:
        self.records.extend(records)

    def sync(self) -> None:
        self.syncs += 1


class MemoryFrames:
    def __init__(self, send: anyio.abc.ObjectSendStream[bytes],
                 receive: anyio.abc.ObjectReceiveStream[bytes]) -> None:
        self._send, self._receive = send, receive

    async def send_frame(self, frame: bytes) -> None:
        await self._send.send(frame)

    async def receive_frame(self) -> bytes:
        return await self._receive.receive()

    async def aclose(self) -> None:
        await self._send.aclose()
        await self._receive.aclose()


@dataclass
class LocalCluster:
    drivers: list[Driver]
    machines: list[SessionKv]
    down: set[int] = field(default_factory=set)


@asynccontextmanager
async def local_cluster(count: int = 3) -> AsyncIterator[tuple[LocalCluster, CellarClient]]:
    machines = [SessionKv() for _ in range(count)]
    drivers: list[Driver] = []
    cluster = LocalCluster(drivers, machines)

    def sender(source: int):
        def send(target: int, frame: bytes) -> bool:
            if source not in cluster.down and target not in cluster.down:
                drivers[target].deliver(source, frame)
            return True
        return send

    for replica_id in range(count):
        replica = Replica(ReplicaConfig(replica_id=replica_id, replica_count=count),
                          Prng(replica_id))
        drivers.append(Driver(replica, MemoryStore(), machines[replica_id],
                              sender(replica_id), Metrics(),
                              config=DriverConfig(tick_ms=5, snapshot_every_slots=50)))

    async def connect(endpoint: str) -> MemoryFrames:
        replica_id = int(endpoint)
        if replica_id in cluster.down:
            raise OSError(f"replica {replica_id} is down")
        to_server, from_client = anyio.create_memory_object_stream[bytes](100)
        to_client, from_server = anyio.create_memory_object_stream[bytes](100)
        server = ClientServer(drivers[replica_id], now_ms=lambda: 1000)
        tasks.start_soon(server.serve, Principal(Role.SCHEDULER, "tester"),
                         MemoryFrames(to_client, from_client))
        return MemoryFrames(to_server, from_server)

    async with anyio.create_task_group() as tasks:
        for driver in drivers:
            await tasks.start(driver.run)
        config = ClientConfig(attempt_timeout_s=0.5, deadline_s=8.0, sessions=8)
        async with CellarClient([str(index) for index in range(count)], connect,
                                config) as client:
            yield cluster, client
        tasks.cancel_scope.cancel()


async def test_commands_are_replicated_and_reads_see_them() -> None:
    with anyio.fail_after(30):
        async with local_cluster() as (cluster, client):
            for index in range(20):
                reply = unpack(await client.propose(encode_put("k", index)), bytes_max=1 << 20,
                               what="reply")
                assert reply[0] == "scheduler:tester"
            assert decode_reply(await client.read(encode_get("k"))) == (True, 19)
            await anyio.sleep(0.3)
            assert {machine.kv.data.get("k") for machine in cluster.machines} == {19}


async def test_concurrent_commands_are_each_applied_once() -> None:
    expected = sorted(encode_put(f"k{index}", index) for index in range(40))
    with anyio.fail_after(30):
        async with local_cluster() as (cluster, client):
            async with anyio.create_task_group() as tasks:
                for index in range(40):
                    tasks.start_soon(client.propose, encode_put(f"k{index}", index))
            while any(len(machine.applied_bodies) < 40 for machine in cluster.machines):
                await anyio.sleep(0.01)
            await anyio.sleep(0.1)
    for machine in cluster.machines:
        assert sorted(machine.applied_bodies) == expected


async def test_a_replica_failure_is_survived_by_retrying_elsewhere() -> None:
    with anyio.fail_after(40):
        async with local_cluster() as (cluster, client):
            await client.propose(encode_put("a", 1))
            cluster.down.add(0)  # the sequencer stops talking
            await client.propose(encode_put("a", 2))
            assert decode_reply(await client.read(encode_get("a"))) == (True, 2)
            assert cluster.drivers[1].replica.inspect.view > 0


async def test_no_quorum_means_outcome_unknown_not_a_guess() -> None:
    with anyio.fail_after(30):
        async with local_cluster() as (cluster, client):
            await client.propose(encode_put("a", 1))
            cluster.down.update({1, 2})
            with pytest.raises(OutcomeUnknown):
                await client.propose(encode_put("a", 2), deadline_s=1.5)


async def test_watches_resume_from_the_executed_slot() -> None:
    with anyio.fail_after(30):
        async with local_cluster() as (_, client):
            await client.propose(encode_put("w", 1))
            result, slot = await client.watch(encode_get("w"), -1, wait_s=1)
            assert decode_reply(result) == (True, 1) and slot >= 1
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(client.propose, encode_put("w", 2))
                result, later = await client.watch(encode_get("w"), slot, wait_s=5)
            assert later > slot
