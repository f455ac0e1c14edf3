"""Connecting a client to a replica, on asyncio and on trio: a dial given up during the TLS
handshake (the caller's deadline, the client closing) closes its socket; before, the TCP
stream stayed open for the process's lifetime, holding a place at the replica.

Method: a listener that accepts TCP and never answers the TLS handshake; the test cancels the
dial and waits for the listener to see the connection end."""

from __future__ import annotations

import pathlib

import anyio
import anyio.abc
import pytest

from consensus.runtime.certs import identities, init_directory
from consensus.runtime.connect import connector
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig

pytestmark = pytest.mark.anyio
HOST = "127.0.0.1"
CONNECTION_ENDED = (anyio.EndOfStream, anyio.BrokenResourceError, OSError)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("certs")
    init_directory(directory, identities(replicas=1, admins=["alice"]))
    return directory


async def test_a_dial_cancelled_during_the_tls_handshake_closes_its_socket(
        certificates: pathlib.Path) -> None:
    connect = connector(TlsConfig.in_directory(certificates,
                                               Identity(IdentityRole.ADMIN, "alice")))
    ended = anyio.Event()

    async def mute(stream: anyio.abc.SocketStream) -> None:
        """Read the ClientHello and answer nothing; note when the client closes."""
        try:
            while True:
                await stream.receive()
        except CONNECTION_ENDED:
            ended.set()

    with anyio.fail_after(10):  # without the fix: the socket stays open, `ended` never set
        listener = await anyio.create_tcp_listener(local_host=HOST)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener, anyio.create_task_group() as group:
            group.start_soon(listener.serve, mute)
            with anyio.move_on_after(0.3) as scope:  # the caller gives up mid-handshake
                await connect(f"{HOST}:{port}")
            assert scope.cancelled_caught
            await ended.wait()
            group.cancel_scope.cancel()
