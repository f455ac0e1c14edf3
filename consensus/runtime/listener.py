"""The client listener: accepts clients over mutual TLS and hands each to a handler.

Each accepted connection runs `handle(identity, connection)` in its own task, where `identity`
comes from the client's certificate (admin, scheduler or node agent; replicas are refused unless
`roles` admits them) and `connection` is a `FramedConnection` with the frame cap applied. The
request protocol is the handler's: the listener only authenticates, bounds and counts.

- At most `connections_max` authenticated clients at once, and at most `handshakes_max`
  connections still in their TLS handshake: a connection beyond either bound is closed at once
  and counted, so a flood of connections that never authenticate holds a bounded number of
  descriptors (and each for at most `handshake_timeout_s`). A host that keeps failing its
  handshakes is barred for a while (`handshake_guard.py`). A failed accept() (out of
  descriptors, a connection reset in the backlog) is retried, never fatal (`accept.py`).
- A failed handshake or a refused identity is closed, counted and logged; nothing else changes.
- A handler may let the connection's own errors escape (the client went away, an oversized or
  truncated frame): they end that connection and are counted. Any other exception is a bug and
  stops the listener.
- With `insecure=True` (local development only) there is no TLS, and every client is
  `insecure_identity` (by default an administrator): anyone who can reach the port can do
  anything. Never use it on a network you do not own.
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import Awaitable, Callable, Collection

import anyio
import anyio.abc

from consensus.codec import MESSAGE_BYTES_MAX
from consensus.runtime.accept import Slots, accept_forever, authenticated, holding, listen_tcp
from consensus.runtime.framing import (
    CONNECTIONS_ACCEPTED,
    CONNECTIONS_LOST,
    CONNECTIONS_REFUSED_LIMIT,
    FRAMES_REFUSED_OVERSIZED,
    FRAMES_TRUNCATED,
    IDENTITY_REFUSED,
    FramedConnection,
    FrameTooLarge,
    Metrics,
    TruncatedFrame,
    check_frame_bytes_max,
)
from consensus.runtime.handshake_guard import HandshakeGuard
from consensus.runtime.tls import (
    CLIENT_ROLES,
    CONNECTION_ERRORS,
    HANDSHAKE_TIMEOUT_S,
    Identity,
    IdentityRole,
    TlsConfig,
    check_security,
    remote_address,
    remote_host,
    tls_handshake,
)

logger = logging.getLogger("cellar.transport")

Address = tuple[str, int]
Handler = Callable[[Identity, FramedConnection], Awaitable[None]]
INSECURE_IDENTITY_DEFAULT = Identity(IdentityRole.ADMIN, "insecure-dev")
CONNECTIONS_MAX_DEFAULT = 1024
HANDSHAKES_MAX_DEFAULT = 128


class ClientListener:
    """Accepts clients; see the module docstring."""

    def __init__(
        self, listen: Address, tls: TlsConfig | None, *, handle: Handler,
        connections_max: int = CONNECTIONS_MAX_DEFAULT, frame_bytes_max: int = MESSAGE_BYTES_MAX,
        metrics: Metrics | None = None, roles: Collection[IdentityRole] = CLIENT_ROLES,
        insecure: bool = False, insecure_identity: Identity = INSECURE_IDENTITY_DEFAULT,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        handshakes_max: int = HANDSHAKES_MAX_DEFAULT, guard: HandshakeGuard | None = None,
    ) -> None:
        check_security(tls, insecure=insecure, what="client listener")
        check_frame_bytes_max(frame_bytes_max)
        for name, value in (("connections_max", connections_max),
                            ("handshakes_max", handshakes_max)):
            if value <= 0:
                raise ValueError(f"{name}: must be positive, got {value}")
        self.listen = listen
        self.tls = tls
        self.handle = handle
        self.connections_max = connections_max
        self.frame_bytes_max = frame_bytes_max
        self.metrics: Metrics = Metrics() if metrics is None else metrics
        self.roles = frozenset(roles)
        self.insecure_identity = insecure_identity
        self.handshake_timeout_s = handshake_timeout_s
        self.address: Address | None = None  # where it listens, once running
        self._clients = Slots(connections_max)  # authenticated clients being served
        self._handshakes = Slots(handshakes_max)  # connections not yet authenticated
        self._guard = HandshakeGuard() if guard is None else guard
        self._context: ssl.SSLContext | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[Address] = anyio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Accept until cancelled; `task_status.started` gets the address bound."""
        self._context = self.tls.server_context() if self.tls else None
        host, port = self.listen
        listener = await listen_tcp(host, port)
        async with listener, anyio.create_task_group() as group:
            bound_port: int = listener.extra(anyio.abc.SocketAttribute.local_port)
            self.address = (host, bound_port)
            group.start_soon(functools.partial(accept_forever, listener, self._serve, group,
                                               what="client listener", metrics=self.metrics))
            logger.info("client listener on %s:%d", host, bound_port)
            task_status.started(self.address)

    @property
    def connections(self) -> int:
        """Clients authenticated and being served now."""
        return self._clients.in_use

    @property
    def handshakes(self) -> int:
        """Connections accepted and not yet authenticated (or refused) now."""
        return self._handshakes.in_use

    async def _serve(self, stream: anyio.abc.SocketStream) -> None:
        try:
            # Full already: no handshake (its CPU, its descriptor held for seconds) for nothing.
            if self.connections >= self.connections_max:
                self.metrics[CONNECTIONS_REFUSED_LIMIT] += 1
                return
            accepted = await authenticated(stream, self._accept, self._handshakes, self.metrics,
                                           guard=self._guard, host=remote_host(stream))
            if accepted is None:
                return
            # Refused if others authenticated meanwhile and took the last place.
            with holding(self._clients, self.metrics, CONNECTIONS_REFUSED_LIMIT) as held:
                if held:
                    identity, connected = accepted
                    self.metrics[CONNECTIONS_ACCEPTED] += 1
                    await self._handle(identity, FramedConnection(
                        connected, frame_bytes_max=self.frame_bytes_max, metrics=self.metrics))
        finally:
            await anyio.aclose_forcefully(stream)

    async def _accept(self, stream: anyio.abc.SocketStream,
                      ) -> tuple[Identity, anyio.abc.ByteStream] | None:
        if self._context is None:
            return self.insecure_identity, stream
        accepted = await tls_handshake(stream, self._context, server_side=True,
                                       metrics=self.metrics, timeout_s=self.handshake_timeout_s)
        if accepted is None:
            return None
        tls_stream, identity = accepted
        if identity.role not in self.roles:
            self.metrics[IDENTITY_REFUSED] += 1
            logger.warning("client listener: refused %s from %s", identity,
                           remote_address(stream))
            await anyio.aclose_forcefully(tls_stream)
            return None
        return identity, tls_stream

    async def _handle(self, identity: Identity, connection: FramedConnection) -> None:
        try:
            await self.handle(identity, connection)
        except FrameTooLarge as error:
            self.metrics[FRAMES_REFUSED_OVERSIZED] += 1
            logger.warning("client %s: %s; closing", identity, error)
        except TruncatedFrame:
            self.metrics[FRAMES_TRUNCATED] += 1
        except anyio.EndOfStream:
            pass
        except CONNECTION_ERRORS:
            self.metrics[CONNECTIONS_LOST] += 1
        finally:
            await anyio.aclose_forcefully(connection.stream)
