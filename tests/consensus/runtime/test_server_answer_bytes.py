"""The bytes of answers a client that never reads can make a replica hold.

`server.py` promises that while more than ANSWERS_QUEUED_BYTES_MAX of answers wait unwritten
it takes no new request from that client. But the check runs only between frames, and over a
real connection the frames one read brought are handed out without yielding: a client that
sends `inflight_max` (1024) requests in one burst has every one of them dispatched before any
answer is queued, so the answers waiting reach inflight_max times the answer size (up to the
connection's 32 MiB frame cap each), not the bound. One client identity holds up to an eighth
of the listener's places, each with its own budget.
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
from consensus.runtime.client_codec import Watch, encode_request
from consensus.runtime.driver import Driver, DriverConfig
from consensus.runtime.metrics import Metrics
from consensus.runtime.server import ClientServer
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

