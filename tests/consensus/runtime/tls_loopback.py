"""A connection over loopback TCP (TLS or plain) for transport tests, and the anyio backends
they run on (asyncio, uvloop, and trio, where anyio's own ways are kept)."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
import trustme
from anyio.abc import ByteStream, SocketAttribute
from anyio.streams.tls import TLSStream

ASYNCIO_BACKENDS = [pytest.param(("asyncio", {}), id="asyncio"),
                    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")]


ALL_BACKENDS = [*ASYNCIO_BACKENDS, pytest.param(("trio", {}), id="trio")]


@contextlib.asynccontextmanager
async def tls_connection(*, tls: bool = True) -> AsyncIterator[tuple[ByteStream, ByteStream]]:
    """(dialer's stream, listener's stream) over loopback TCP, with TLS (the default) or
    without."""
    ca = trustme.CA()
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("localhost").configure_cert(server_context)
    client_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(client_context)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(SocketAttribute.local_port)
    accepted: list[ByteStream] = []
    async with listener, anyio.create_task_group() as group:
        async def accept() -> None:
            raw = await listener.listeners[0].accept()  # type: ignore[attr-defined]
            accepted.append(await TLSStream.wrap(raw, server_side=True,
                                                 ssl_context=server_context) if tls else raw)
        group.start_soon(accept)
        dialed: ByteStream = await (
            anyio.connect_tcp("127.0.0.1", port, ssl_context=client_context,
                              tls_hostname="localhost") if tls
            else anyio.connect_tcp("127.0.0.1", port))
        while not accepted:
            await anyio.sleep(0.001)
    try:
        yield dialed, accepted[0]
    finally:
        await anyio.aclose_forcefully(dialed)
        await anyio.aclose_forcefully(accepted[0])


def on_asyncio(backend: tuple[str, dict[str, Any]]) -> bool:
    return backend[0] == "asyncio"
