"""A watch retried on a second replica after the first one hung asks that replica only for the
wait left before the client's deadline: it had asked for its whole wait again while the client
cut the try at its own deadline, so a healthy replica with no news never answered in time, and
the watch ended Unavailable."""

from __future__ import annotations

import anyio
import pytest

from consensus.runtime.client import CellarClient, ClientConfig
from consensus.runtime.client_codec import (
    Cancel,
    Code,
    Request,
    Response,
    Watch,
    encode_response,
)
from tests.consensus.runtime.fake_replicas import ScriptedReplica, SilentReplica

pytestmark = pytest.mark.anyio


class HoldingReplica(ScriptedReplica):
    """A replica with no news: it holds each watch for the wait it asks, then answers with
    the state as it is, at its executed slot (here: the slot asked)."""

    def __init__(self, tasks: anyio.abc.TaskGroup) -> None:
        super().__init__()
        self._tasks = tasks
        self.waits_ms: list[int] = []

    def hear(self, request: Request, frame: bytes) -> None:
        if isinstance(request, Cancel):  # a try given up on: its answer is dropped anyway
            return
        assert isinstance(request, Watch)
        self.waits_ms.append(request.wait_ms)
        self._tasks.start_soon(self._answer_later, request)

    async def _answer_later(self, request: Watch) -> None:
        await anyio.sleep(request.wait_ms / 1000)
        self.answer(encode_response(Response(request.request_id, Code.OK, b"state",
                                             max(request.after_slot, 0))))


async def test_a_watch_moved_off_a_hung_replica_is_answered_by_the_next() -> None:
    config = ClientConfig(attempt_timeout_s=0.05, deadline_s=2.0, retry_backoff_s=0.01)
    wait_s = 1.5  # longer than the deadline's margin, as a ten-minute watch is
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            holding = HoldingReplica(tasks)

            async def connect(endpoint: str) -> SilentReplica | HoldingReplica:
                return SilentReplica(endpoint, []) if endpoint == "a" else holding

            async with CellarClient(["a", "b"], connect, config, first=0) as client:
                started = anyio.current_time()
                result, slot = await client.watch(b"query", 7, wait_s=wait_s)
                # no later than the watch's promise: its wait plus the client's deadline
                assert anyio.current_time() - started <= wait_s + config.deadline_s + 0.2
            tasks.cancel_scope.cancel()
    assert (result, slot) == (b"state", 7)
    assert holding.waits_ms  # b was asked, after a hung
