"""An in-process cluster for runtime tests: drivers wired by an in-memory network, clients
talking to replicas over in-memory frame streams, each client with its own principal."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import anyio.abc

from consensus.codec import MESSAGE_BYTES_MAX
from consensus.config import ReplicaConfig
from consensus.envelope import Principal, Role
from consensus.prng import Prng
from consensus.records import Record
from consensus.replica import Replica
from consensus.runtime.client import CellarClient, ClientConfig
from consensus.runtime.driver import (
    PROPOSAL_BYTES_MAX,
    SNAPSHOT_EVERY_BYTES,
    Driver,
    DriverConfig,
)
from consensus.runtime.metrics import Metrics
from consensus.runtime.server import ClientServer
from consensus.state_machine import StateMachine

SCHEDULER = Principal(Role.SCHEDULER, "tester")


@dataclass
class MemoryStore:
    records: list[Record] = field(default_factory=list)
    syncs: int = 0
    sync_is_long: bool = False  # whether the next sync is too long for the loop (never, here)

    def append(self, records: Sequence[Record]) -> None:
        self.records.extend(records)

    def sync(self) -> None:
        self.syncs += 1


class MemoryFrames:
    def __init__(self, send: anyio.abc.ObjectSendStream[bytes],
                 receive: anyio.abc.ObjectReceiveStream[bytes], *,
                 frame_bytes_max: int = MESSAGE_BYTES_MAX) -> None:
        self._send, self._receive = send, receive
        self.frame_bytes_max = frame_bytes_max

    async def send(self, frame: bytes) -> None:
        await self.send_many([frame])

    async def send_many(self, frames: Sequence[bytes]) -> None:
        for frame in frames:  # as FrameWriter: an oversized frame is the caller's bug
            if len(frame) > self.frame_bytes_max:
                raise ValueError(f"frame of {len(frame)} bytes, more than "
                                 f"{self.frame_bytes_max}")
        for frame in frames:
            await self._send.send(frame)

    async def receive(self) -> bytes:
        return await self._receive.receive()

    async def aclose(self) -> None:
        await self._send.aclose()
        await self._receive.aclose()


class Sink:
    """A client connection as the server sees it, for a test that calls the server's parts
    directly: it takes every frame and sends none."""

    frame_bytes_max = 1 << 20

    async def send_many(self, frames: Sequence[bytes]) -> None:
        pass

    async def send(self, frame: bytes) -> None:
        pass

    async def receive(self) -> bytes:
        await anyio.sleep_forever()
        raise AssertionError

    async def aclose(self) -> None:
        pass


@dataclass
class LocalCluster:
    drivers: list[Driver]
    machines: list[StateMachine]
    down: set[int] = field(default_factory=set)
    connect: Callable[[str], Awaitable[MemoryFrames]] | None = None

    def client(self, principal: Principal, config: ClientConfig | None = None, *,
               first: int | None = None) -> CellarClient:
        """A client whose connections carry `principal` (use it in `async with`)."""
        assert self.connect is not None
        suffix = f"@{principal.role.value}:{principal.name}"
        return CellarClient([f"{index}{suffix}" for index in range(len(self.drivers))],
                            self.connect,
                            config or ClientConfig(attempt_timeout_s=0.5, deadline_s=8.0),
                            first=first)


NODE_N1 = Principal(Role.NODE, "n1")


@asynccontextmanager
async def serving(driver: Driver, principal: Principal = NODE_N1
                  ) -> AsyncIterator[tuple[anyio.abc.ObjectSendStream[bytes],
                                           anyio.abc.ObjectReceiveStream[bytes]]]:
    """`driver` running with a `ClientServer` for one client connection: the streams a test
    sends request frames on and receives answer frames from."""
    to_server, from_client = anyio.create_memory_object_stream[bytes](10)
    to_client, from_server = anyio.create_memory_object_stream[bytes](10)
    async with anyio.create_task_group() as tasks:
        await tasks.start(driver.run)
        tasks.start_soon(ClientServer(driver).serve, principal,
                         MemoryFrames(to_client, from_client))
        yield to_server, from_server
        tasks.cancel_scope.cancel()


@asynccontextmanager
async def local_cluster(make_machine: Callable[[], StateMachine], count: int = 3, *,
                        principal: Principal = SCHEDULER,
                        system_command: Callable[[int], bytes] | None = None,
                        frame_bytes_max: int = MESSAGE_BYTES_MAX,
                        proposal_bytes_max: int = PROPOSAL_BYTES_MAX,
                        snapshot_every_slots: int = 50,
                        snapshot_every_bytes: int = SNAPSHOT_EVERY_BYTES,
                        ) -> AsyncIterator[tuple[LocalCluster, CellarClient]]:
    """`frame_bytes_max`: the cap on the frames each replica's server sends a client;
    `proposal_bytes_max`: each driver's budget of command bytes; `snapshot_every_slots` and
    `snapshot_every_bytes`: each driver's snapshot periods."""
    machines = [make_machine() for _ in range(count)]
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
                              config=DriverConfig(tick_ms=5, system_every_ms=200,
                                                  snapshot_every_slots=snapshot_every_slots,
                                                  snapshot_every_bytes=snapshot_every_bytes,
                                                  proposal_bytes_max=proposal_bytes_max),
                              system_command=system_command))

    async def connect(endpoint: str) -> MemoryFrames:
        replica, _, who = endpoint.partition("@")
        replica_id = int(replica)
        role, _, name = who.partition(":")
        speaker = Principal(Role(role), name) if who else principal
        if replica_id in cluster.down:
            raise OSError(f"replica {replica_id} is down")
        to_server, from_client = anyio.create_memory_object_stream[bytes](100)
        to_client, from_server = anyio.create_memory_object_stream[bytes](100)
        server = ClientServer(drivers[replica_id])  # stamps the wall clock, as Ticks do
        tasks.start_soon(server.serve, speaker, MemoryFrames(to_client, from_client,
                                                             frame_bytes_max=frame_bytes_max))
        return MemoryFrames(to_server, from_server)

    cluster.connect = connect
    async with anyio.create_task_group() as tasks:
        for driver in drivers:
            await tasks.start(driver.run)
        config = ClientConfig(attempt_timeout_s=0.5, deadline_s=8.0, sessions=8)
        async with CellarClient([str(index) for index in range(count)], connect,
                                config) as client:
            yield cluster, client
        tasks.cancel_scope.cancel()
