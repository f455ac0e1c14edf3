"""Connecting a client to a replica: TCP, mutual TLS, a check that the server is a replica of
the cluster, and framing. The client library calls the `Connect` this returns per endpoint.

A refused handshake says why (the replica's certificate expired, or is of another CA). A client
whose own certificate has ended does not dial: under TLS 1.3 its handshake completes before the
replica checks the certificate, and the replica's alert never comes back (it closes), so the
connection would only end, with no reason given. The refusal names the file and the date.
A long-running client (the node agent) passes its process's `TlsContexts`: a renewed pair its
`CertWatch` takes serves its next dial, and lifts that refusal."""

from __future__ import annotations

import datetime
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable

import anyio

from consensus.codec import MESSAGE_BYTES_MAX
from consensus.runtime.framing import FramedConnection
from consensus.runtime.socket_tuning import tune_socket
from consensus.runtime.tls import (
    IdentityRole,
    TlsConfig,
    TlsContexts,
    check_security,
    contexts_of,
    tls_handshake,
)

CONNECT_TIMEOUT_S = 5.0


class ConnectRefused(OSError):
    """The endpoint is not a replica of this cluster (wrong certificate or identity)."""


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    # the same rule as a configuration file's addresses (config_fields.address): a port out
    # of range passed here and ended in an OverflowError from deep in the connect
    if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"{endpoint!r} is not HOST:PORT with a port in 1..65535")
    return host.strip("[]"), int(port)


def connector(tls: TlsConfig | None, *, insecure: bool = False,
              frame_bytes_max: int = MESSAGE_BYTES_MAX,
              contexts: TlsContexts | None = None) -> Callable[[str], Awaitable[
                  FramedConnection]]:
    """A `Connect` for `CellarClient`: plain TCP only when `insecure` says so (it warns).

    `contexts`: the process's, which its `CertWatch` renews (a node agent's); each dial takes
    the client context current then. By default the connector's own, built now and kept."""
    check_security(tls, insecure=insecure, what="client")
    metrics: Counter[str] = Counter()
    current = contexts_of(tls, contexts, what="client")

    async def connect(endpoint: str) -> FramedConnection:
        host, port = split_endpoint(endpoint)
        if current is not None and current.ends <= datetime.datetime.now(datetime.UTC):
            raise ConnectRefused(f"{endpoint}: not dialed: this client's certificate "
                                 f"{current.tls.cert_file} expired at "
                                 f"{current.ends:%Y-%m-%d %H:%M} UTC and no replica accepts "
                                 f"it; issue a new one (`cellar certs issue`) into its place")
        with anyio.fail_after(CONNECT_TIMEOUT_S):
            stream: anyio.abc.ByteStream = await anyio.connect_tcp(host, port)
        tune_socket(stream)  # a vanished replica fails the connection, not each deadline
        try:
            if current is not None:
                stream = await secure(endpoint, stream, current.client, metrics)
            return FramedConnection(stream, frame_bytes_max=frame_bytes_max, metrics=metrics)
        except BaseException:  # refused, failed or cancelled: the socket is closed, not leaked
            await anyio.aclose_forcefully(stream)
            raise

    return connect


async def secure(endpoint: str, stream: anyio.abc.ByteStream, context: ssl.SSLContext,
                 metrics: Counter[str]) -> anyio.abc.ByteStream:
    """`stream` under TLS, once the server proved to be a replica; raises ConnectRefused."""
    reasons: list[str] = []
    secured = await tls_handshake(stream, context, server_side=False, metrics=metrics,
                                  reasons=reasons)
    if secured is None:
        raise ConnectRefused(f"{endpoint}: the TLS handshake failed: {'; '.join(reasons)}")
    tls_stream, identity = secured
    if identity.role is not IdentityRole.REPLICA:
        await anyio.aclose_forcefully(tls_stream)
        raise ConnectRefused(f"{endpoint} presented {identity}, not a replica")
    return tls_stream
