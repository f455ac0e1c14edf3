"""The bytes of answers a client that never reads can make a replica hold.

`server.py` promises that while more than ANSWERS_QUEUED_BYTES_MAX of answers wait unwritten
it takes no new request from that client. But the check runs only between frames, and over a
real connection the frames one read brought are handed out without yielding: a client that
sends `inflight_max` (1024) requests in one burst has every one of them dispatched before any
answer is queued, so the answers waiting reach inflight_max times the answer size (up to the
connection's 32 MiB frame cap each), not the bound. One client identity holds up to an eighth
of the listener's places, each with its own budget: 128 silent connections held 128 times the
per-connection cap (32 GiB at the defaults), so the server bounds the answers of all its
connections together too (`answers_bytes_max`), each connection keeping a small fair share.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import anyio
import pytest

from consensus.config import ReplicaConfig
from consensus.prng import Prng
from consensus.replica import Replica
from consensus.runtime import outbox as outbox_module
from consensus.runtime import server as server_module
from consensus.runtime.client_codec import Code, Watch, decode_response, encode_request
from consensus.runtime.driver import Driver, DriverConfig
from consensus.runtime.metrics import Metrics
from consensus.runtime.server import ClientServer
from jepsen.sim.kv_codec import encode_get
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.local import NODE_N1, MemoryStore

pytestmark = pytest.mark.anyio
ANSWER = 64 << 10
BOUND = 1 << 20
REQUESTS = 256


class BigAnswers(SessionKv):
    def query(self, query: bytes) -> bytes:
        return b"x" * ANSWER if query == b"big" else super().query(query)


class BurstThenSilent:
    """A FrameStream as FramedConnection is: frames one read brought are returned without a
    yield; the client never reads what is sent to it (its TCP window is shut)."""

    frame_bytes_max = 32 << 20

    def __init__(self, frames: list[bytes]) -> None:
        self._frames = collections.deque(frames)

    async def receive(self) -> bytes:
        if self._frames:
            return self._frames.popleft()
        await anyio.sleep_forever()
        raise AssertionError

    async def send(self, frame: bytes) -> None:
        await anyio.sleep_forever()

    async def send_many(self, frames: Sequence[bytes]) -> None:
        await anyio.sleep_forever()

    async def aclose(self) -> None:
        pass


async def test_answers_held_for_a_silent_client_stay_near_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "ANSWERS_QUEUED_BYTES_MAX", BOUND)
    peak = [0]
    put = outbox_module.Outbox.put

    def counting_put(self: outbox_module.Outbox, frame: bytes) -> None:
        put(self, frame)
        held = self.queued_bytes + sum(len(f) for f in getattr(self, "_writing", ()))
        peak[0] = max(peak[0], held)

    monkeypatch.setattr(outbox_module.Outbox, "put", counting_put)
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(1))
    driver = Driver(replica, MemoryStore(), BigAnswers(), lambda peer, frame: True, Metrics(),
                    config=DriverConfig(tick_ms=5))
    frames = [encode_request(Watch(request_id, b"big", -1, 0))
              for request_id in range(1, REQUESTS + 1)]
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)
            tasks.start_soon(ClientServer(driver).serve, NODE_N1, BurstThenSilent(frames))
            await anyio.sleep(0.5)
            tasks.cancel_scope.cancel()
    # Held within a small multiple of the bound (server.ANSWERS_HELD_FACTOR), plus one answer
    # and the short errors that replace the rest.
    assert peak[0] <= 4 * BOUND + ANSWER + REQUESTS * 256, (
        f"{peak[0]} bytes of answers queued for a client that reads nothing; the bound is "
        f"{BOUND}")



CONNECTIONS = 8
SERVER_BYTES = 512 << 10  # the server's budget, for all its connections together
FAIR = 64 << 10  # each connection's share that the budget never holds up


def big_answers_driver() -> Driver:
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(1))
    return Driver(replica, MemoryStore(), BigAnswers(), lambda peer, frame: True, Metrics(),
                  config=DriverConfig(tick_ms=5))


async def test_answers_held_for_many_silent_connections_stay_near_the_server_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each connection within its own bound (1 MiB here, 4 MiB held), eight of them held
    eight times that; the server's budget holds them all to a small multiple of it, plus a
    fair share each, and every request is still answered (a shed answer is an error)."""
    monkeypatch.setattr(server_module, "ANSWERS_QUEUED_BYTES_MAX", BOUND)
    monkeypatch.setattr(server_module, "ANSWERS_FAIR_BYTES", FAIR)
    held, answered = [0], [0]  # nothing is ever written: every frame put is held
    put = outbox_module.Outbox.put

    def counting_put(self: outbox_module.Outbox, frame: bytes) -> None:
        put(self, frame)
        held[0] += len(frame)
        answered[0] += 1

    monkeypatch.setattr(outbox_module.Outbox, "put", counting_put)
    driver = big_answers_driver()
    server = ClientServer(driver, answers_bytes_max=SERVER_BYTES)
    requests = 80  # 5 MiB of answers each, over its own cap of 4 MiB
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)
            for _ in range(CONNECTIONS):
                frames = [encode_request(Watch(request_id, b"big", -1, 0))
                          for request_id in range(1, requests + 1)]
                tasks.start_soon(server.serve, NODE_N1, BurstThenSilent(frames))
            while answered[0] < CONNECTIONS * requests:
                await anyio.sleep(0.01)
            tasks.cancel_scope.cancel()
    bound = server_module.ANSWERS_HELD_FACTOR * SERVER_BYTES + CONNECTIONS * FAIR + ANSWER
    assert held[0] <= bound + CONNECTIONS * requests * 256, (
        f"{held[0]} bytes of answers held for {CONNECTIONS} clients that read nothing; the "
        f"server's budget is {SERVER_BYTES}")
    assert driver.metrics.counter("server.answers_shed") > 0


class PacedThenSilent(BurstThenSilent):
    """A client that sends its requests one at a time and never reads; counts those taken."""

    def __init__(self, frames: list[bytes]) -> None:
        super().__init__(frames)
        self.taken = 0

    async def receive(self) -> bytes:
        await anyio.sleep(0.002)
        frame = await super().receive()
        self.taken += 1
        return frame


class PacedReader(PacedThenSilent):
    """A client that sends its requests one at a time and reads every answer."""

    def __init__(self, frames: list[bytes]) -> None:
        super().__init__(frames)
        self.answers: list[bytes] = []

    async def send_many(self, frames: Sequence[bytes]) -> None:
        self.answers.extend(frames)


async def test_past_the_server_budget_a_connection_over_its_share_takes_no_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A silent client stops being read once the server's budget is spent and it holds more
    than its fair share (well within its own bound); a client with small answers beside it is
    still served in full; the budget comes back when the silent client's connection ends."""
    monkeypatch.setattr(server_module, "ANSWERS_FAIR_BYTES", FAIR)
    driver = big_answers_driver()
    server = ClientServer(driver, answers_bytes_max=SERVER_BYTES)
    requests = 40  # 2.5 MiB of answers, far under the connection's own bound
    silent = PacedThenSilent([encode_request(Watch(request_id, b"big", -1, 0))
                              for request_id in range(1, requests + 1)])
    reader = PacedReader([encode_request(Watch(request_id, encode_get("k"), -1, 0))
                          for request_id in range(1, requests + 1)])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)
            async with anyio.create_task_group() as silent_connection:
                silent_connection.start_soon(server.serve, NODE_N1, silent)
                await anyio.sleep(0.3)
                tasks.start_soon(server.serve, NODE_N1, reader)
                while len(reader.answers) < requests:
                    await anyio.sleep(0.01)
                assert server.answers_held_bytes > SERVER_BYTES
                silent_connection.cancel_scope.cancel()
            assert server.answers_held_bytes == 0  # given back when the connection ended
            tasks.cancel_scope.cancel()
    assert silent.taken <= SERVER_BYTES // ANSWER + 2, (
        f"{silent.taken} of {requests} requests taken from a client that reads nothing while "
        f"the server's budget of {SERVER_BYTES} bytes was spent")
    assert all(decode_response(answer).code == Code.OK for answer in reader.answers)
    assert driver.metrics.counter("server.slow_clients_dropped") == 0
