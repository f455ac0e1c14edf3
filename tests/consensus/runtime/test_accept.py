"""The accept loop, on asyncio and on trio.

Goal: an accept() that fails for want of descriptors or buffers (EMFILE, ENFILE, ENOBUFS,
ENOMEM), or because one connection went away in the backlog (ECONNABORTED), is counted, logged
once per burst and retried: the listener keeps serving, where anyio's `Listener.serve` ended and
took the replica with it. Any other failure still ends the loop.

Method: a fake listener that fails as scripted, then hands out streams; and a real client
listener whose socket's accept() is made to fail with EMFILE before a real client connects."""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.streams.stapled import MultiListener

from consensus.runtime.accept import ACCEPT_ERRORS, Slots, accept_forever, retried_errno
from consensus.runtime.framing import FramedConnection, Metrics
from consensus.runtime.listener import ClientListener
from consensus.runtime.tls import Identity

pytestmark = pytest.mark.anyio
HOST = "127.0.0.1"
TIME_LIMIT_S = 10


def failure(code: int) -> OSError:
    return OSError(code, f"scripted {errno.errorcode[code]}")


def trio_style(code: int) -> anyio.BrokenResourceError:
    """How anyio's trio backend reports a failed accept(): caused by the OSError."""
    try:
        raise anyio.BrokenResourceError from failure(code)
    except anyio.BrokenResourceError as error:
        return error


class ScriptedListener(anyio.abc.Listener[str]):
    """Fails or hands out a stream (here a name) as scripted, then waits for ever."""

    def __init__(self, script: list[BaseException | str]) -> None:
        self.script = script

    async def accept(self) -> str:
        await anyio.lowlevel.checkpoint()
        if not self.script:
            await anyio.sleep_forever()
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    async def serve(self, handler: Callable[[str], Any],
                    task_group: anyio.abc.TaskGroup | None = None) -> None:
        raise AssertionError("the loop accepts by itself")

    async def aclose(self) -> None:
        pass

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return {}


async def test_capacity_and_connection_failures_are_retried_and_serving_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    listener = ScriptedListener([failure(errno.EMFILE), trio_style(errno.ENFILE), "first",
                                 failure(errno.ECONNABORTED), "second"])
    served: list[str] = []
    metrics = Metrics()

    async def handler(stream: str) -> None:
        served.append(stream)

    with anyio.fail_after(TIME_LIMIT_S), caplog.at_level(logging.WARNING, "cellar.transport"):
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: accept_forever(listener, handler, group, what="test",
                                                    metrics=metrics, backoff_s=0.001))
            while len(served) < 2:
                await anyio.sleep(0.001)
            group.cancel_scope.cancel()
    assert served == ["first", "second"]
    assert metrics[ACCEPT_ERRORS] == 3
    messages = [record.getMessage() for record in caplog.records]
    assert messages == ["test: accept() failed: EMFILE; going on (logged once per burst)",
                        "test: accepting again after 2 failed accept() calls",
                        "test: accept() failed: ECONNABORTED; going on (logged once per burst)",
                        "test: accepting again after 1 failed accept() calls"]


@pytest.mark.parametrize("make", [lambda: failure(errno.EBADF),
                                  lambda: trio_style(errno.EINVAL), anyio.ClosedResourceError])
async def test_any_other_failure_still_ends_the_loop(make: Callable[[], Exception]) -> None:
    error = make()
    listener = ScriptedListener([error])

    async def handler(stream: str) -> None:
        raise AssertionError("nothing to serve")

    with anyio.fail_after(TIME_LIMIT_S), pytest.RaisesGroup(type(error), flatten_subgroups=True):
        async with anyio.create_task_group() as group:
            await accept_forever(listener, handler, group, what="test", metrics=Metrics())


def test_which_errors_are_retried() -> None:
    assert retried_errno(failure(errno.ENOBUFS)) == errno.ENOBUFS
    assert retried_errno(trio_style(errno.ENOMEM)) == errno.ENOMEM
    assert retried_errno(failure(errno.EBADF)) is None
    assert retried_errno(anyio.BrokenResourceError()) is None


def test_slots_shed_beyond_the_limit() -> None:
    slots = Slots(2)
    assert [slots.take(), slots.take(), slots.take()] == [True, True, False]
    slots.release()
    assert slots.take()
    assert slots.in_use == 2
    with pytest.raises(ValueError):
        Slots(0)


class FailingFirst(anyio.abc.Listener[anyio.abc.SocketStream]):
    """A real socket listener whose first `failures` accept() calls fail with EMFILE, as a
    process out of descriptors sees them."""

    def __init__(self, real: anyio.abc.Listener[anyio.abc.SocketStream], failures: int) -> None:
        self.real = real
        self.failures = failures

    async def accept(self) -> anyio.abc.SocketStream:
        await anyio.lowlevel.checkpoint()
        if self.failures:
            self.failures -= 1
            raise failure(errno.EMFILE)
        return await self.real.accept()  # type: ignore[attr-defined, no-any-return]

    async def serve(self, handler: Callable[[anyio.abc.SocketStream], Any],
                    task_group: anyio.abc.TaskGroup | None = None) -> None:
        """anyio's own loop (which the first EMFILE ends)."""
        await anyio.abc.SocketListener.serve(self, handler, task_group)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self.real.aclose()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return self.real.extra_attributes


async def test_a_client_listener_out_of_descriptors_serves_once_it_has_some(
        monkeypatch: pytest.MonkeyPatch) -> None:
    create = anyio.create_tcp_listener

    async def flaky(**options: Any) -> MultiListener[anyio.abc.SocketStream]:
        real = await create(**options)
        return MultiListener([FailingFirst(one, failures=2) for one in real.listeners])

    monkeypatch.setattr(anyio, "create_tcp_listener", flaky)

    async def echo(identity: Identity, connection: FramedConnection) -> None:
        await connection.send(await connection.receive())

    listener = ClientListener((HOST, 0), None, handle=echo, insecure=True)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            _, port = await group.start(listener.run)
            client = FramedConnection(await anyio.connect_tcp(HOST, port),
                                      frame_bytes_max=1024, metrics=Metrics())
            await client.send(b"still serving")
            assert await client.receive() == b"still serving"
            await client.aclose()
            group.cancel_scope.cancel()
    assert listener.metrics[ACCEPT_ERRORS] == 2
