"""A handshake that fails on a connection the peer already closed is logged with the address
the log line promises ("a closed connection"), not "None".

Seen in every `cellar live` run: "TLS handshake with None failed: EndOfStream()". anyio leaves
`remote_address` out of a socket's attributes when getpeername() fails (it does not raise), so
`extra(..., None)` returns None and `str(None)` went into the log line."""

from __future__ import annotations

import socket

import anyio
import pytest

from consensus.runtime.tls import remote_address, remote_host

pytestmark = pytest.mark.anyio


async def test_a_socket_whose_peer_is_gone_is_named_a_closed_connection() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    stream = await anyio.connect_tcp("127.0.0.1", port)
    try:
        raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        raw.shutdown(socket.SHUT_RDWR)  # getpeername() now fails with ENOTCONN
        listener.close()
        assert remote_host(stream) is None
        assert remote_address(stream) == "a closed connection"
    finally:
        await stream.aclose()
