"""A client whose host vanished (power loss, a partition that outlives its
FIN) leaves the replica's end of the connection ESTABLISHED: the server only reads on an idle
connection, and without keepalive (or a user timeout) nothing ever tells the kernel the other
end is gone. Each such connection holds one of the listener's places and one of its identity's
share for the replica's whole life: a node agent whose GPU host is hard-rebooted
`connections_per_principal_max` times is locked out of that replica for good, and enough of
them across the fleet fill `connections_max`. The peer mesh tunes its sockets for exactly this
(socket_tuning.tune_socket); the client listener did not."""

from __future__ import annotations

import socket

import anyio
import anyio.abc
import pytest

from consensus.runtime.connect import connector
from consensus.runtime.framing import FramedConnection
from consensus.runtime.listener import ClientListener
from consensus.runtime.socket_tuning import USER_TIMEOUT_MS
from consensus.runtime.tls import Identity

pytestmark = pytest.mark.anyio
HOST = "127.0.0.1"


async def test_a_client_connection_is_kept_alive_on_the_replica_side() -> None:
    seen: dict[str, int] = {}
    done = anyio.Event()

    async def handle(identity: Identity, connection: FramedConnection) -> None:
        sock = connection.stream.extra(anyio.abc.SocketAttribute.raw_socket)
        seen["keepalive"] = sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        if hasattr(socket, "TCP_KEEPIDLE"):
            seen["idle_s"] = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
        done.set()
        await connection.receive()

    listener = ClientListener((HOST, 0), None, handle=handle, insecure=True)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            address = await group.start(listener.run)
            stream = await anyio.connect_tcp(*address)
            await done.wait()
            await stream.aclose()
            group.cancel_scope.cancel()
    assert seen["keepalive"] == 1, "a vanished client's connection is never noticed"
    if "idle_s" in seen:
        assert seen["idle_s"] <= 60, seen  # not the system's default of two hours


async def test_a_clients_connection_to_a_replica_is_kept_alive_with_a_user_timeout() -> None:
    """And the other way: a client's request to a vanished replica fails the connection (and
    is tried elsewhere) instead of waiting out its deadline at every try."""
    async with await anyio.create_tcp_listener(local_host=HOST) as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        connection = await connector(None, insecure=True)(f"{HOST}:{port}")
        sock = connection.stream.extra(anyio.abc.SocketAttribute.raw_socket)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == \
                USER_TIMEOUT_MS
        await connection.stream.aclose()
