"""A command's UNKNOWN answer stays UNKNOWN when the server sheds it.

The server sheds answers past its byte bounds, putting a short error in their place: UNKNOWN for
a command's reply, OVERLOADED for a query. A command that timed out at the replica (the
driver's OutcomeUnknown: it may still be applied) is answered as an error, and that error, shed,
had gone out as OVERLOADED, which the protocol defines as "not proposed: retrying is safe": the
client then did not count the copy as handed over and could end the command with `Unavailable`
("certainly not applied") or take a later copy's SESSIONS_FULL refusal for "not applied".
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from cellar.kv.machine import KvMachine
from cellar.kv.store import KvStore
from consensus.envelope import Principal, Role
from consensus.runtime import server as server_module
from consensus.runtime.client import CellarClient, ClientConfig, OutcomeUnknown, Unavailable
from consensus.runtime.client_codec import Code, decode_response
from consensus.runtime.driver import OutcomeUnknown as DriverOutcomeUnknown
from consensus.runtime.metrics import Metrics
from consensus.runtime.server import ClientServer
from tests.consensus.runtime.driver_stub import DriverStub
from tests.consensus.runtime.local import MemoryFrames, Sink

pytestmark = pytest.mark.anyio


def test_a_command_timed_out_and_shed_is_still_unknown() -> None:
    budget = server_module._AnswerBudget(1 << 10)
    answers = server_module._Answers(Sink(), anyio.Semaphore(8), Metrics(), budget)
    budget.held_bytes = budget.held_max  # the replica holds all the answers it may
    answers.held_bytes = server_module.ANSWERS_FAIR_BYTES  # this connection its fair share
    done = answers.responder(7, server_module._REPLY)
    done(None, DriverOutcomeUnknown("no result in time; the command may still be applied"))
    [frame] = answers.outbox._frames
    response = decode_response(frame)
    assert response.request_id == 7
    assert response.code is Code.UNKNOWN, (
        f"a command that may still be applied was answered {response.code.name} "
        f"(not proposed, safe to retry)")


class LateApplyingDriver(DriverStub):
    """A replica whose command is applied just after the client's wait ended (the driver
    answers OutcomeUnknown: "no result in time; the command may still be applied")."""

    def __init__(self, machine: KvMachine) -> None:
        super().__init__()
        self.machine = machine

    def submit(self, command: bytes, timeout_s: float,
               done: Callable[[bytes | None, Exception | None], None], *,
               reserved: bool = False, released: Callable[[], None] | None = None) -> None:
        done(None, DriverOutcomeUnknown("no result in time; the command may still be applied"))
        self.machine.apply(command)


async def test_a_put_applied_after_a_shed_unknown_is_never_called_unavailable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The replica is over its answer budget (other clients' large answers wait unread), so
    every answer of this connection is shed. The put was handed to consensus and applied, yet
    the client ends it `Unavailable` ("certainly not applied"): a Jepsen history would record a
    FAIL for a write that took effect."""
    monkeypatch.setattr(server_module, "ANSWERS_FAIR_BYTES", 0)
    machine = KvMachine()
    server = ClientServer(LateApplyingDriver(machine), answers_bytes_max=1)  # type: ignore[arg-type]
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            async def connect(endpoint: str) -> MemoryFrames:
                to_server, from_client = anyio.create_memory_object_stream[bytes](100)
                to_client, from_server = anyio.create_memory_object_stream[bytes](100)
                tasks.start_soon(server.serve, Principal(Role.SCHEDULER, "s"),
                                 MemoryFrames(to_client, from_client))
                return MemoryFrames(to_server, from_server)

            config = ClientConfig(attempt_timeout_s=0.05, deadline_s=0.5, retry_backoff_s=0.01)
            async with CellarClient(["a"], connect, config, first=0) as client:
                outcome: BaseException | None = None
                try:
                    await KvStore(client).put(b"k", b"v")
                except (Unavailable, OutcomeUnknown) as error:
                    outcome = error
            tasks.cancel_scope.cancel()
    assert machine.data.get(b"k") == b"v"  # it was applied
    assert isinstance(outcome, OutcomeUnknown), (
        f"a put that was applied ended {type(outcome).__name__}: {outcome}")
