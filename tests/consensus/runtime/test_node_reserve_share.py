"""Each node agent's share of the reserve kept for node agents' commands.

One agent sending commands without waiting had every one of them take the reserve, so it could
hold all of it and starve every other node's heartbeats (the lease lapse the reserve is there to
prevent). Past its share an agent's commands compete for the shared budget; the other agents
keep theirs, and a command the driver lets go of (executed, covered or refused: its `released`
callback) gives its share back."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from consensus.envelope import Principal, Role
from consensus.runtime import server as server_module
from consensus.runtime.client_codec import encode_propose
from consensus.runtime.driver import Done
from consensus.runtime.metrics import Metrics
from consensus.runtime.node_reserve import (
    BYTES_PER_NODE_MAX,
    COMMANDS_PER_NODE_MAX,
    RESERVE_EXCEEDED,
    NodeReserve,
)
from consensus.runtime.server import ClientServer
from tests.consensus.runtime.driver_stub import DriverStub
from tests.consensus.runtime.local import Sink

pytestmark = pytest.mark.anyio


class RecordingDriver(DriverStub):
    """Keeps each submitted command's `released` callback and whether it asked for the
    reserve."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted: list[tuple[Callable[[], None] | None, bool]] = []

    def submit(self, command: bytes, timeout_s: float, done: Done, *,
               reserved: bool = False, released: Callable[[], None] | None = None) -> None:
        self.submitted.append((released, reserved))


def dispatch(server: ClientServer, principal: Principal, count: int, tasks: anyio.abc.TaskGroup,
             body: bytes = b"heartbeat") -> None:
    answers = server_module._Answers(Sink(), anyio.Semaphore(1 << 16), Metrics(),
                                     server_module._AnswerBudget(1 << 30))
    for number in range(count):
        frame = encode_propose(number, "s", number + 1, body, timeout_ms=1000, sent_ms=1)
        server._dispatch(principal, frame, answers, tasks)


async def test_one_agent_flooding_keeps_only_its_share_and_others_keep_theirs() -> None:
    driver = RecordingDriver()
    server = ClientServer(driver)  # type: ignore[arg-type]
    flooder, other = Principal(Role.NODE, "n0"), Principal(Role.NODE, "n1")
    async with anyio.create_task_group() as tasks:
        dispatch(server, flooder, COMMANDS_PER_NODE_MAX + 100, tasks)
        dispatch(server, other, 1, tasks)
        dispatch(server, Principal(Role.SCHEDULER, "s"), 1, tasks)
    flags = [reserved for _, reserved in driver.submitted]
    assert flags[:COMMANDS_PER_NODE_MAX] == [True] * COMMANDS_PER_NODE_MAX
    assert flags[COMMANDS_PER_NODE_MAX:-2] == [False] * 100  # past its share: shared budget
    assert flags[-2:] == [True, False]  # the other agent's heartbeat; a scheduler's never
    assert driver.metrics.snapshot().get(RESERVE_EXCEEDED) == 100
    released, _ = driver.submitted[0]
    assert released is not None
    released()  # the driver let go of its bytes: its share back
    async with anyio.create_task_group() as tasks:
        dispatch(server, flooder, 1, tasks)
    assert driver.submitted[-1][1] is True


def test_the_share_is_bounded_in_bytes_too_and_freed_entries_go() -> None:
    reserve = NodeReserve(Metrics())
    released = reserve.claim("n0", BYTES_PER_NODE_MAX)
    assert released is not None
    assert reserve.claim("n0", 1) is None
    assert reserve.claim("n1", 1) is not None
    released()
    released()  # once only
    assert reserve.held("n0") == (0, 0) and "n0" not in reserve._held
    assert reserve.held("n1") == (1, 1)
