"""The client listener: accepts clients over mutual TLS and hands each to a handler.

Each accepted connection runs `handle(identity, connection)` in its own task, where `identity`
comes from the client's certificate (admin, scheduler or node agent; replicas are refused unless
`roles` admits them) and `connection` is a `FramedConnection` with the frame cap applied. The
request protocol is the handler's: the listener only authenticates, bounds and counts.

- At most `connections_max` authenticated clients at once (and a few administrators more,
  below), and at most `handshakes_max` connections still in their TLS handshake: a connection
  beyond either bound is closed (at once, when even the administrators' places are taken) and
  counted, so a flood of connections that never authenticate holds a bounded number of
  descriptors (and each for at most `handshake_timeout_s`). A host that keeps failing its
  handshakes is barred for a while (`handshake_guard.py`). A failed accept() (out of
  descriptors, a connection reset in the backlog) is retried, never fatal (`accept.py`).
- No one client identity takes every place: a scheduler or node agent identity may hold at
  most `connections_per_principal_max` of them (by default an eighth of `connections_max`,
  and at least 4); one more is closed after its handshake (its identity is known only then),
  counted (`transport.connections_refused_principal`) and logged with the reason, once until
  that identity's count goes down. A node agent holds one connection per replica it talks to,
  a scheduler a few. A compromised agent had opened connection after connection until every
  place was taken, locking out every other client, administrators included.
- Administrators always get in: past `connections_max`, `admin_connections_reserved` more
  places (8 by default) take administrators only. A connection is let into its handshake while
  any place is free (it may be an administrator's) and, once its identity is known, refused if
  the places left are reserved. Administrators have no share of their own: the role is
  trusted with the whole cluster, and the live harness and the benchmarks connect many clients
  under one administrator identity. The price: while other clients hold every ordinary place,
  their further connections each cost a handshake before being refused (bounded by
  `handshakes_max` at a time and by what each such client can pay in handshakes itself).
- A client's frames are capped at `receive_bytes_max` (by default the largest valid request,
  REQUEST_BYTES_MAX, about a megabyte), well below `frame_bytes_max`, which caps the answers
  sent to it: a frame over it ends that connection, so a client cannot make the replica
  buffer eight megabytes per connection of something no request can be.
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
from collections.abc import Awaitable, Callable, Collection

import anyio
import anyio.abc

from consensus.codec import MESSAGE_BYTES_MAX
from consensus.runtime.accept import Slots, accept_forever, authenticated, listen_tcp
from consensus.runtime.client_codec import REQUEST_BYTES_MAX
from consensus.runtime.framing import (
    CONNECTIONS_ACCEPTED,
    CONNECTIONS_LOST,
    CONNECTIONS_REFUSED_LIMIT,
    CONNECTIONS_REFUSED_PRINCIPAL,
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
from consensus.runtime.socket_tuning import tune_socket
from consensus.runtime.tls import (
    CLIENT_ROLES,
    CONNECTION_ERRORS,
    HANDSHAKE_TIMEOUT_S,
    Identity,
    IdentityRole,
    TlsConfig,
    TlsContexts,
    check_security,
    contexts_of,
    remote_address,
    remote_host,
    tls_handshake,
)

logger = logging.getLogger("cellar.transport")

Address = tuple[str, int]
Handler = Callable[[Identity, FramedConnection], Awaitable[None]]
INSECURE_IDENTITY_DEFAULT = Identity(IdentityRole.ADMIN, "insecure-dev")
CONNECTIONS_MAX_DEFAULT = 1024
ADMIN_CONNECTIONS_RESERVED = 8  # places past connections_max that only administrators take
HANDSHAKES_MAX_DEFAULT = 128


def connections_per_principal_default(connections_max: int) -> int:
    """A client identity's share of the places: an eighth, and at least 4."""
    return max(4, connections_max // 8)


class ClientListener:
    """Accepts clients; see the module docstring."""

    def __init__(
        self, listen: Address, tls: TlsConfig | None, *, handle: Handler,
        connections_max: int = CONNECTIONS_MAX_DEFAULT, frame_bytes_max: int = MESSAGE_BYTES_MAX,
        metrics: Metrics | None = None, roles: Collection[IdentityRole] = CLIENT_ROLES,
        insecure: bool = False, insecure_identity: Identity = INSECURE_IDENTITY_DEFAULT,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        handshakes_max: int = HANDSHAKES_MAX_DEFAULT, guard: HandshakeGuard | None = None,
        connections_per_principal_max: int | None = None,
        admin_connections_reserved: int = ADMIN_CONNECTIONS_RESERVED,
        receive_bytes_max: int = REQUEST_BYTES_MAX, contexts: TlsContexts | None = None,
    ) -> None:
        check_security(tls, insecure=insecure, what="client listener")
        check_frame_bytes_max(frame_bytes_max)
        if connections_per_principal_max is None:
            connections_per_principal_max = connections_per_principal_default(connections_max)
        for name, value in (("connections_max", connections_max),
                            ("handshakes_max", handshakes_max),
                            ("connections_per_principal_max", connections_per_principal_max),
                            ("receive_bytes_max", receive_bytes_max)):
            if value <= 0:
                raise ValueError(f"{name}: must be positive, got {value}")
        if admin_connections_reserved < 0:
            raise ValueError(f"admin_connections_reserved: must not be negative, got "
                             f"{admin_connections_reserved}")
        self.listen = listen
        self.tls = tls
        self.handle = handle
        self.connections_max = connections_max
        self.connections_per_principal_max = connections_per_principal_max
        self.admin_connections_reserved = admin_connections_reserved
        self.frame_bytes_max = frame_bytes_max
        self.receive_bytes_max = min(receive_bytes_max, frame_bytes_max)
        self.metrics: Metrics = Metrics() if metrics is None else metrics
        self.roles = frozenset(roles)
        self.insecure_identity = insecure_identity
        self.handshake_timeout_s = handshake_timeout_s
        self.address: Address | None = None  # where it listens, once running
        self._clients = 0  # authenticated clients being served, administrators included
        self._by_identity: dict[Identity, int] = {}  # the others' connections, per identity
        self._warned: set[Identity] = set()  # refused for their share, not yet logged again
        self._handshakes = Slots(handshakes_max)  # connections not yet authenticated
        self._guard = HandshakeGuard() if guard is None else guard
        # The process's contexts (renewed by its CertWatch), or the listener's own, built at
        # `run`; each handshake reads them as it starts.
        self._shared_contexts = contexts
        self._contexts: TlsContexts | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[Address] = anyio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Accept until cancelled; `task_status.started` gets the address bound."""
        self._contexts = contexts_of(self.tls, self._shared_contexts, what="client listener")
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
        return self._clients

    def connections_of(self, identity: Identity) -> int:
        """Connections of `identity` (not an administrator) being served now."""
        return self._by_identity.get(identity, 0)

    @property
    def handshakes(self) -> int:
        """Connections accepted and not yet authenticated (or refused) now."""
        return self._handshakes.in_use

    async def _serve(self, stream: anyio.abc.SocketStream) -> None:
        try:
            # A client whose host vanished (no FIN ever comes) is noticed and its place
            # freed; no user timeout: a client may stop reading (ANSWERS_STALL_S rules).
            tune_socket(stream, user_timeout=False)
            # Full even for an administrator: no handshake (its CPU, its descriptor held for
            # seconds) for nothing.
            if self._clients >= self.connections_max + self.admin_connections_reserved:
                self.metrics[CONNECTIONS_REFUSED_LIMIT] += 1
                return
            accepted = await authenticated(stream, self._accept, self._handshakes, self.metrics,
                                           guard=self._guard, host=remote_host(stream))
            if accepted is None:
                return
            identity, connected = accepted
            if not self._take_place(identity, stream):
                return
            try:
                self.metrics[CONNECTIONS_ACCEPTED] += 1
                await self._handle(identity, FramedConnection(
                    connected, frame_bytes_max=self.frame_bytes_max, metrics=self.metrics,
                    receive_bytes_max=self.receive_bytes_max))
            finally:
                self._give_place_back(identity)
        finally:
            await anyio.aclose_forcefully(stream)

    def _take_place(self, identity: Identity, stream: anyio.abc.SocketStream) -> bool:
        """A place for `identity`'s new connection (True), or False, counted (and logged when
        it is its share that is full); see the module docstring."""
        if identity.role is IdentityRole.ADMIN:
            if self._clients >= self.connections_max + self.admin_connections_reserved:
                self.metrics[CONNECTIONS_REFUSED_LIMIT] += 1
                return False
        elif self._clients >= self.connections_max:  # the rest is kept for administrators
            self.metrics[CONNECTIONS_REFUSED_LIMIT] += 1
            return False
        elif (held := self._by_identity.get(identity, 0)) >= self.connections_per_principal_max:
            self.metrics[CONNECTIONS_REFUSED_PRINCIPAL] += 1
            if identity not in self._warned:  # once, not once per try of a client in a loop
                self._warned.add(identity)
                logger.warning("client listener: refused %s from %s: it has %d connections, "
                               "the most one client identity may (its share of %d places)",
                               identity, remote_address(stream), held, self.connections_max)
            return False
        else:
            self._by_identity[identity] = held + 1
        self._clients += 1
        return True

    def _give_place_back(self, identity: Identity) -> None:
        self._clients -= 1
        held = self._by_identity.pop(identity, 0)
        if held > 1:
            self._by_identity[identity] = held - 1
        self._warned.discard(identity)

    async def _accept(self, stream: anyio.abc.SocketStream,
                      ) -> tuple[Identity, anyio.abc.ByteStream] | None:
        if self._contexts is None:
            return self.insecure_identity, stream
        accepted = await tls_handshake(stream, self._contexts.server, server_side=True,
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
