"""A copy of a command that reaches a replica long after its client moved on (a partition TCP
rode out, a replica stopped for minutes) was stamped on arrival, so the session layer's stamp
window took it for a fresh command: it opened the session it belonged to, forgotten meanwhile,
and ran a second time. The replica now stamps it no later than the client's send time allows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from cellar.kv.codec import encode_put
from cellar.kv.machine import KvMachine
from cellar.kv.store import KvStore
from consensus.codec import encode_envelope
from consensus.envelope import Envelope, Principal, Role
from consensus.runtime.client import CellarClient, ClientConfig
from consensus.runtime.driver import Done
from consensus.runtime.server import SENT_MS_SLACK_MS, ClientServer
from statemachine.limits import SESSIONS_PER_PRINCIPAL_MAX
from statemachine.sessions import STAMP_WINDOW_MS
from tests.consensus.runtime.driver_stub import DriverStub
from tests.consensus.runtime.local import MemoryFrames

pytestmark = pytest.mark.anyio
SCHEDULER = Principal(Role.SCHEDULER, "sched")


class ApplyingDriver(DriverStub):
    """The replicated log, reduced to what the server needs: a command submitted is executed
    on the one (replicated) machine at once, in submission order."""

    def __init__(self, machine: KvMachine) -> None:
        super().__init__()
        self.machine = machine

    def submit(self, command: bytes, timeout_s: float, done: Done, *,
               reserved: bool = False, released: Callable[[], None] | None = None) -> None:
        done(self.machine.apply(command), None)


class HeldFrames(MemoryFrames):
    """The replica's end of a connection whose bytes are in transit (a partition that TCP
    retransmission rides out, or a replica stopped for a while): nothing arrives before
    `released` is set."""

    def __init__(self, *args: Any, released: anyio.Event, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._released = released

    async def receive(self) -> bytes:
        await self._released.wait()
        return await super().receive()


async def test_a_copy_delivered_after_its_session_expired_is_not_applied_again() -> None:
    machine = KvMachine()
    clock_ms = [1_000]
    released = anyio.Event()
    async with anyio.create_task_group() as tasks:
        servers = {name: ClientServer(ApplyingDriver(machine),  # type: ignore[arg-type]
                                      now_ms=lambda: clock_ms[0]) for name in "ab"}

        async def connect(endpoint: str) -> MemoryFrames:
            to_server, from_client = anyio.create_memory_object_stream[bytes](100)
            to_client, from_server = anyio.create_memory_object_stream[bytes](100)
            server_end: MemoryFrames = (
                HeldFrames(to_client, from_client, released=released) if endpoint == "a"
                else MemoryFrames(to_client, from_client))
            tasks.start_soon(servers[endpoint].serve, SCHEDULER, server_end)
            return MemoryFrames(to_server, from_server)

        config = ClientConfig(attempt_timeout_s=0.05, deadline_s=5.0, retry_backoff_s=0.01,
                              sessions=1)
        async with CellarClient(["a", "b"], connect, config, first=0,
                                wall_ms=lambda: clock_ms[0]) as client:
            # "a" never hears the put in time; "b" applies it: the put succeeded, once.
            await KvStore(client).put(b"k", b"first")
            assert machine.data[b"k"] == b"first"
            # Someone else overwrites k later.
            machine.apply(encode_envelope(Envelope(
                principal=Principal(Role.ADMIN, "other"), session="o", sequence=1,
                now_ms=2_000, body=encode_put(b"k", b"second"))))
            # The scheduler keeps opening sessions (a fleet of processes under one identity),
            # so its share of the table fills, at 2 s, all expiring before the copy arrives.
            for index in range(SESSIONS_PER_PRINCIPAL_MAX - 1):
                machine.apply(encode_envelope(Envelope(
                    principal=SCHEDULER, session=f"f{index}", sequence=1, now_ms=2_000,
                    body=encode_put(b"f", b""))))
            # 11 minutes on (the session of the put expired, idle for more than 600 s), the
            # copy that went to "a" is delivered, while the client lives on.
            clock_ms[0] = 1_000 + 660_000
            # Meanwhile the scheduler opened a session, which expired the idle ones.
            machine.apply(encode_envelope(Envelope(
                principal=SCHEDULER, session="new", sequence=1, now_ms=clock_ms[0] - 1,
                body=encode_put(b"f", b""))))
            released.set()
            await anyio.sleep(0.2)
            assert machine.data[b"k"] == b"second", \
                "the put, answered OK 11 minutes ago, was applied a second time"
        tasks.cancel_scope.cancel()


def test_the_stamp_slack_is_well_inside_the_sessions_stamp_window() -> None:
    """A copy stamped at its send time plus the slack must be too old to open a session once
    the session it belongs to was forgotten (idle a lifetime, at least twice the window)."""
    assert SENT_MS_SLACK_MS < STAMP_WINDOW_MS // 2
