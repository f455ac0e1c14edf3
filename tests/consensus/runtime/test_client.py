"""The client's own timers, on asyncio and on trio: against replicas that take requests and
never answer, a command ends as OutcomeUnknown and a read as Unavailable at the deadline, each
try moving on to the next replica; nothing is left waiting on a connection afterwards."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from consensus.runtime.client import CellarClient, ClientConfig, OutcomeUnknown, Unavailable
from consensus.runtime.client_codec import decode_request

pytestmark = pytest.mark.anyio


class SilentReplica:
    """A connection that reads every request and answers none."""

    def __init__(self, endpoint: str, heard: list[str]) -> None:
        self._endpoint, self._heard = endpoint, heard
        self._closed = anyio.Event()

    frame_bytes_max = 1 << 20

    async def send(self, frame: bytes) -> None:
        await self.send_many([frame])

    async def send_many(self, frames: Sequence[bytes]) -> None:
        for frame in frames:
            decode_request(frame)  # a well-formed request
            self._heard.append(self._endpoint)

    async def receive(self) -> bytes:
        await self._closed.wait()
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        self._closed.set()


async def test_unanswered_commands_and_reads_end_at_their_deadline() -> None:
    heard: list[str] = []

    async def connect(endpoint: str) -> SilentReplica:
        return SilentReplica(endpoint, heard)

    config = ClientConfig(attempt_timeout_s=0.05, deadline_s=10.0, retry_backoff_s=0.01)
    with anyio.fail_after(10):  # a timer that never fires would hang here
        async with CellarClient(["a", "b"], connect, config, first=0) as client:
            started = anyio.current_time()
            with pytest.raises(OutcomeUnknown):
                await client.propose(b"put", deadline_s=0.4)
            assert 0.4 <= anyio.current_time() - started < 2.0
            with pytest.raises(Unavailable):
                await client.read(b"get", deadline_s=0.2)
            connections = list(client._connections.values())
    assert set(heard) == {"a", "b"}  # no answer from one replica: the next one is tried
    assert all(not connection._waiting for connection in connections)
