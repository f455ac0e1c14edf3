"""A client that sends its requests in one burst and then neither reads nor sends.

`server.py` promises that a client whose answers stay over ANSWERS_QUEUED_BYTES_MAX with no
write going through for ANSWERS_STALL_S is dropped. The check ran only in the reader's loop,
between requests: over real TCP every frame of one read is dispatched before any answer is
queued, and the reader then waits in `receive()` for a request that never comes. Its answers
(up to ANSWERS_HELD_FACTOR times the bound, 256 MiB at the defaults) and its share of the
server-wide budget were held for as long as the client's kernel kept the connection open, and
every other client holding more than its fair share was paused and shed meanwhile.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import anyio
import pytest

from consensus.config import ReplicaConfig
from consensus.prng import Prng
from consensus.replica import Replica
from consensus.runtime import server as server_module
from consensus.runtime.client_codec import Watch, encode_request
from consensus.runtime.driver import Driver, DriverConfig
from consensus.runtime.framing import FramedConnection, encode_frames
from consensus.runtime.listener import ClientListener
from consensus.runtime.metrics import Metrics
from consensus.runtime.server import ClientServer
from consensus.runtime.tls import Identity
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.local import NODE_N1, MemoryStore

pytestmark = pytest.mark.anyio
ANSWER = 1 << 20
BOUND = 2 << 20
REQUESTS = 24
STALL_S = 0.3


class MegabyteAnswers(SessionKv):
    def query(self, query: bytes) -> bytes:
        return b"x" * ANSWER if query == b"big" else super().query(query)


async def test_a_client_silent_after_one_burst_is_dropped_and_its_answers_freed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "ANSWERS_QUEUED_BYTES_MAX", BOUND)
    monkeypatch.setattr(server_module, "ANSWERS_STALL_S", STALL_S)
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(1))
    driver = Driver(replica, MemoryStore(), MegabyteAnswers(), lambda peer, frame: True,
                    Metrics(), config=DriverConfig(tick_ms=5))
    server = ClientServer(driver)

    async def serve(identity: Identity, connection: FramedConnection) -> None:
        await server.serve(identity.principal(), connection)

    listener = ClientListener(("127.0.0.1", 0), None, insecure=True, handle=serve)
    burst = encode_frames(encode_request(Watch(request_id, b"big", -1, 0))
                          for request_id in range(1, REQUESTS + 1))
    with anyio.fail_after(20):
        async with anyio.create_task_group() as node:
            await node.start(driver.run)
            host, port = await node.start(listener.run)
            silent = socket.socket()
            silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a shut window
            silent.setblocking(False)
            try:
                await anyio.to_thread.run_sync(silent.connect_ex, (host, port))
                await anyio.wait_writable(silent)
                silent.sendall(burst)  # one write; then nothing read, nothing sent
                while server.answers_held_bytes <= BOUND:
                    await anyio.sleep(0.01)
                # Ten times the stall: the client should long be dropped.
                with anyio.move_on_after(10 * STALL_S):
                    while listener.connections:
                        await anyio.sleep(0.01)
                held, connections = server.answers_held_bytes, listener.connections
                dropped = driver.metrics.counter("server.slow_clients_dropped")
            finally:
                silent.close()
            node.cancel_scope.cancel()
    assert (dropped, connections, held) == (1, 0, 0), (
        f"a client silent after one burst: {connections} connection still served, {held} "
        f"bytes of its answers held, {dropped} dropped")


class SlowReader:
    """A client that sends one burst and reads every answer, a megabyte every 0.1 s."""

    frame_bytes_max = 32 << 20

    def __init__(self, frames: list[bytes]) -> None:
        self._frames = frames
        self.answers = 0

    async def receive(self) -> bytes:
        if self._frames:
            return self._frames.pop(0)
        await anyio.sleep_forever()
        raise AssertionError

    async def send(self, frame: bytes) -> None:
        await self.send_many([frame])

    async def send_many(self, frames: Sequence[bytes]) -> None:
        for frame in frames:
            await anyio.sleep(0.1 * len(frame) / ANSWER)
            self.answers += 1

    async def aclose(self) -> None:
        pass


async def test_a_slow_reader_of_a_burst_over_the_bound_is_not_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its answers go out a megabyte at a time, each write heard of (outbox.py): a write of
    all of them at once went through only at its end, past the stall."""
    monkeypatch.setattr(server_module, "ANSWERS_QUEUED_BYTES_MAX", BOUND)
    monkeypatch.setattr(server_module, "ANSWERS_STALL_S", STALL_S)
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(1))
    driver = Driver(replica, MemoryStore(), MegabyteAnswers(), lambda peer, frame: True,
                    Metrics(), config=DriverConfig(tick_ms=5))
    requests = 2 * BOUND // ANSWER + 6  # within the connection's hold, far over its bound
    client = SlowReader([encode_request(Watch(request_id, b"big", -1, 0))
                         for request_id in range(1, requests + 1)])
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)
            tasks.start_soon(ClientServer(driver).serve, NODE_N1, client)
            while client.answers < requests and \
                    not driver.metrics.counter("server.slow_clients_dropped"):
                await anyio.sleep(0.01)
            tasks.cancel_scope.cancel()
    assert driver.metrics.counter("server.slow_clients_dropped") == 0
    assert client.answers == requests
