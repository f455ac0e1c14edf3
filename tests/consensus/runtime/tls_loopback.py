"""A connection over loopback TCP (TLS or plain) for transport tests, and the anyio backends
they run on (asyncio, uvloop, and trio, where anyio's own ways are kept): a test module takes
the fixtures by importing them (`all_backends`, `tls_pair_fixture`)."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import pytest
import trustme
from anyio.abc import ByteStream, SocketAttribute
from anyio.streams.tls import TLSStream

from consensus.runtime.framing import FrameReader, FrameWriter

ASYNCIO_BACKENDS = [pytest.param(("asyncio", {}), id="asyncio"),
                    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")]


ALL_BACKENDS = [*ASYNCIO_BACKENDS, pytest.param(("trio", {}), id="trio")]


@pytest.fixture(name="anyio_backend", params=ALL_BACKENDS)
def all_backends(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """The module's tests run on each of `ALL_BACKENDS` (a test may name fewer, indirect)."""
    return request.param  # type: ignore[no-any-return]


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


@pytest.fixture(name="tls_pair")
async def tls_pair_fixture() -> AsyncIterator[tuple[ByteStream, ByteStream]]:
    async with tls_connection() as pair:
        yield pair


async def exchange(writer: FrameWriter, reader: FrameReader,
                   batches: Sequence[Sequence[bytes]], *, read_after_s: float = 0.0,
                   ) -> list[bytes]:
    """The frames `reader` receives while `writer` sends `batches` (a `send_many` each), the
    reader starting `read_after_s` late, once it has them all."""
    count = sum(map(len, batches))
    received: list[bytes] = []

    async def read_all() -> None:
        if read_after_s:
            await anyio.sleep(read_after_s)
        while len(received) < count:
            received.extend(await reader.receive_batch())

    async with anyio.create_task_group() as group:
        group.start_soon(read_all)
        for batch in batches:
            await writer.send_many(batch)
    return received


def on_asyncio(backend: tuple[str, dict[str, Any]]) -> bool:
    return backend[0] == "asyncio"
