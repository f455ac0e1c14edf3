"""A watch answered by a replica behind the slot the caller has seen is not taken: the client
moves on to the next replica within the same deadline, and raises Unavailable if none answers
at or past that slot. A replica cut off from its peers answers, after its wait, its older state
and a slot below `after_slot`; the client returned it, and a caller that takes each answer as
current went back in time."""

from __future__ import annotations

import anyio
import pytest

from consensus.runtime.client import CellarClient, ClientConfig, Unavailable
from consensus.runtime.client_codec import (
    Cancel,
    Code,
    Request,
    Response,
    Watch,
    encode_response,
)
from tests.consensus.runtime.fake_replicas import ScriptedReplica

pytestmark = pytest.mark.anyio
CONFIG = ClientConfig(attempt_timeout_s=0.05, deadline_s=1.0, retry_backoff_s=0.01)
WAIT_S = 0.2


class FrozenReplica(ScriptedReplica):
    """A replica whose state stays at `slot`: it answers a watch past that slot at once, and
    one at or beyond it after the wait it asks, with the state as it is (the driver's
    `local_read`)."""

    def __init__(self, tasks: anyio.abc.TaskGroup, state: bytes, slot: int) -> None:
        super().__init__()
        self._tasks, self._state, self._slot = tasks, state, slot
        self.watches = 0

    def hear(self, request: Request, frame: bytes) -> None:
        if isinstance(request, Cancel):  # a try given up on: its answer is dropped anyway
            return
        assert isinstance(request, Watch)
        self.watches += 1
        self._tasks.start_soon(self._answer, request)

    async def _answer(self, request: Watch) -> None:
        if self._slot <= request.after_slot:
            await anyio.sleep(request.wait_ms / 1000)
        self.answer(encode_response(Response(request.request_id, Code.OK, self._state,
                                             self._slot)))


async def test_a_watch_answered_behind_its_slot_moves_on_to_a_replica_that_is_not() -> None:
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            replicas = {"a": FrozenReplica(tasks, b"old", 3),
                        "b": FrozenReplica(tasks, b"current", 9)}

            async def connect(endpoint: str) -> FrozenReplica:
                return replicas[endpoint]

            async with CellarClient(["a", "b"], connect, CONFIG, first=0) as client:
                answer = await client.watch(b"query", 7, wait_s=WAIT_S)
            tasks.cancel_scope.cancel()
    assert answer == (b"current", 9), "the watch went back before the slot the caller saw"
    assert replicas["a"].watches >= 1  # asked first, and answered behind


async def test_a_watch_no_replica_answers_at_its_slot_is_unavailable() -> None:
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            replica = FrozenReplica(tasks, b"old", 3)

            async def connect(endpoint: str) -> FrozenReplica:
                return replica

            async with CellarClient(["a"], connect, CONFIG, first=0) as client:
                started = anyio.current_time()
                with pytest.raises(Unavailable):
                    await client.watch(b"query", 7, wait_s=WAIT_S)
                # within the watch's promise: its wait plus the client's deadline
                assert anyio.current_time() - started <= WAIT_S + CONFIG.deadline_s + 0.2
            tasks.cancel_scope.cancel()
    assert replica.watches >= 2  # asked again until the deadline


async def test_a_watch_answered_at_its_slot_with_nothing_new_is_taken() -> None:
    """An idle replica that has executed just the slot asked answers it after its wait: not
    behind, so the answer stands (the caller's own linearizable check judges a frozen one)."""
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            replica = FrozenReplica(tasks, b"state", 7)

            async def connect(endpoint: str) -> FrozenReplica:
                return replica

            async with CellarClient(["a"], connect, CONFIG, first=0) as client:
                answer = await client.watch(b"query", 7, wait_s=WAIT_S)
            tasks.cancel_scope.cancel()
    assert answer == (b"state", 7)
    assert replica.watches == 1
