"""The client listener over real loopback sockets, on asyncio and on trio.

Goal: a client's identity (and so the principal its commands carry) comes from its certificate;
a client without a valid one, or with a replica's, is refused and counted; a client that sends
an absurd frame (anything over the largest request) loses its own connection only; connections
beyond the bound are refused and counted, beyond one identity's share too, and administrators
still get in when others hold every place; plain TCP only when asked for, with a warning and
the configured default identity."""

from __future__ import annotations

import logging
import pathlib
import ssl

import anyio
import anyio.abc
import pytest
from anyio.streams.tls import TLSStream

from consensus.envelope import Principal, Role
from consensus.runtime.certs import identities, init_directory
from consensus.runtime.client_codec import REQUEST_BYTES_MAX
from consensus.runtime.framing import (
    CONNECTIONS_ACCEPTED,
    CONNECTIONS_REFUSED_LIMIT,
    CONNECTIONS_REFUSED_PRINCIPAL,
    FRAMES_REFUSED_OVERSIZED,
    HANDSHAKES_REFUSED_BARRED,
    HANDSHAKES_REFUSED_LIMIT,
    IDENTITY_REFUSED,
    TLS_REFUSED,
    FramedConnection,
    Metrics,
    encode_frames,
)
from consensus.runtime.handshake_guard import HandshakeGuard
from consensus.runtime.listener import INSECURE_IDENTITY_DEFAULT, ClientListener
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig

pytestmark = pytest.mark.anyio
HOST = "127.0.0.1"
TIME_LIMIT_S = 15
NODE = Identity(IdentityRole.NODE, "gpu-node-17")
OTHER_NODE = Identity(IdentityRole.NODE, "gpu-node-18")
ADMIN = Identity(IdentityRole.ADMIN, "alice")
CONNECTION_ENDED = (OSError, anyio.BrokenResourceError, anyio.EndOfStream,
                    anyio.ClosedResourceError)



@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("certs")
    init_directory(directory, identities(replicas=1, admins=["alice"],
                                         nodes=["gpu-node-17", "gpu-node-18"]))
    return directory


class EchoService:
    """A handler that answers each frame with the principal's name and the frame."""

    def __init__(self) -> None:
        self.principals: list[Principal] = []

    async def __call__(self, identity: Identity, connection: FramedConnection) -> None:
        principal = identity.principal()
        self.principals.append(principal)
        for _ in range(1000):
            frame = await connection.receive()
            await connection.send(f"{principal}: ".encode() + frame)


async def connect(port: int, context: ssl.SSLContext | None) -> FramedConnection:
    stream: anyio.abc.ByteStream = await anyio.connect_tcp(HOST, port)
    if context is not None:
        stream = await TLSStream.wrap(stream, server_side=False, ssl_context=context,
                                      standard_compatible=False)
    return FramedConnection(stream, frame_bytes_max=1 << 20, metrics=Metrics())


async def refused(port: int, context: ssl.SSLContext) -> bool:
    """Whether a client connecting with `context` is closed without an answer (refused
    after its handshake, or during it)."""
    try:
        connection = await connect(port, context)
        await connection.send(b"let me in")
        return await hung_up(connection)
    except CONNECTION_ENDED:
        return True


async def hung_up(connection: FramedConnection) -> bool:
    try:
        await connection.receive()
    except CONNECTION_ENDED:
        return True
    return False


def context_for(certificates: pathlib.Path, identity: Identity | None) -> ssl.SSLContext:
    if identity is not None:
        return TlsConfig.in_directory(certificates, identity).client_context()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cafile=str(certificates / "ca.pem"))
    return context


def listener_for(certificates: pathlib.Path | None, service: EchoService,
                 **options: object) -> ClientListener:
    tls = (TlsConfig.in_directory(certificates, Identity.replica(0)) if certificates
           else None)
    options.setdefault("frame_bytes_max", 1024)
    return ClientListener((HOST, 0), tls, handle=service, insecure=certificates is None,
                          **options)  # type: ignore[arg-type]


async def test_each_client_is_known_by_its_certificate(certificates: pathlib.Path) -> None:
    service = EchoService()
    listener = listener_for(certificates, service)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            _, port = await group.start(listener.run)
            node = await connect(port, context_for(certificates, NODE))
            admin = await connect(port, context_for(certificates, ADMIN))
            await node.send_many([b"report", b"heartbeat"])
            await admin.send(b"drain")
            assert [await node.receive() for _ in range(2)] == [
                b"node:gpu-node-17: report", b"node:gpu-node-17: heartbeat"]
            assert await admin.receive() == b"admin:alice: drain"
            await node.aclose()
            await admin.aclose()
            group.cancel_scope.cancel()
    assert service.principals == [Principal(Role.NODE, "gpu-node-17"),
                                  Principal(Role.ADMIN, "alice")]
    assert listener.metrics[CONNECTIONS_ACCEPTED] == 2


async def test_clients_without_a_client_certificate_are_refused(
        certificates: pathlib.Path) -> None:
    service = EchoService()
    listener = listener_for(certificates, service)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            _, port = await group.start(listener.run)
            for identity in (None, Identity.replica(0)):  # no certificate; a replica's
                intruder = await connect(port, context_for(certificates, identity))
                await intruder.send(b"let me in")
                assert await hung_up(intruder)
                await intruder.aclose()
            garbage = await anyio.connect_tcp(HOST, port)
            await garbage.send(b"GET / HTTP/1.1\r\n\r\n")
            with pytest.raises(CONNECTION_ENDED):
                await garbage.receive()
            await garbage.aclose()
            group.cancel_scope.cancel()
    assert service.principals == []
    assert (listener.metrics[TLS_REFUSED], listener.metrics[IDENTITY_REFUSED]) == (2, 1)


async def test_an_oversized_frame_ends_that_client_only(certificates: pathlib.Path) -> None:
    service = EchoService()
    listener = listener_for(certificates, service)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            _, port = await group.start(listener.run)
            steady = await connect(port, context_for(certificates, ADMIN))
            rogue = await connect(port, context_for(certificates, NODE))
            await rogue.stream.send(encode_frames([b"x" * 1025]))
            assert await hung_up(rogue)
            await steady.send(b"still there?")
            assert await steady.receive() == b"admin:alice: still there?"
            await steady.aclose()
            await rogue.aclose()
            group.cancel_scope.cancel()
    assert listener.metrics[FRAMES_REFUSED_OVERSIZED] == 1


async def test_connections_beyond_the_bound_are_refused(certificates: pathlib.Path) -> None:
    """Two places and one kept for administrators: a node agent beyond the two is refused
    after its handshake, an administrator takes the reserved place, and with that one taken
    too a connection is closed at once, before any handshake. A node agent gets in again once
    fewer than two are served."""
    service = EchoService()
    listener = listener_for(certificates, service, connections_max=2,
                            admin_connections_reserved=1)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            _, port = await group.start(listener.run)
            first = await connect(port, context_for(certificates, ADMIN))
            second = await connect(port, context_for(certificates, NODE))
            for connection in (first, second):  # both are being served
                await connection.send(b"hi")
                await connection.receive()
            assert await refused(port, context_for(certificates, OTHER_NODE))
            assert listener.metrics[CONNECTIONS_REFUSED_LIMIT] == 1
            reserved = await connect(port, context_for(certificates, ADMIN))
            await reserved.send(b"the reserved place")
            assert await reserved.receive() == b"admin:alice: the reserved place"
            one_too_many = await anyio.connect_tcp(HOST, port)
            with pytest.raises(CONNECTION_ENDED):
                await one_too_many.receive()
            assert listener.metrics[CONNECTIONS_REFUSED_LIMIT] == 2
            assert listener.metrics[HANDSHAKES_REFUSED_LIMIT] == 0  # no handshake was begun
            await first.aclose()  # administrators take ordinary places first, then theirs
            await second.aclose()
            await anyio.aclose_forcefully(one_too_many)
            for _ in range(1000):  # the freed place is taken again
                if listener.connections < 2:
                    break
                await anyio.sleep(0.005)
            third = await connect(port, context_for(certificates, OTHER_NODE))
            await third.send(b"room now")
            assert await third.receive() == b"node:gpu-node-18: room now"
            for connection in (reserved, third):
                await connection.aclose()
            group.cancel_scope.cancel()


async def test_one_node_agent_cannot_lock_the_administrators_out(
        certificates: pathlib.Path) -> None:
    """The review's case: a node agent opens connection after connection. With four places
    (and a share of four) it holds them all; an administrator still gets in."""
    service = EchoService()
    listener = listener_for(certificates, service, connections_max=4)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            _, port = await group.start(listener.run)
            held = []
            for number in range(4):
                node = await connect(port, context_for(certificates, NODE))
                await node.send(b"%d" % number)
                assert await node.receive() == b"node:gpu-node-17: %d" % number
                held.append(node)
            assert await refused(port, context_for(certificates, NODE))
            admin = await connect(port, context_for(certificates, ADMIN))
            await admin.send(b"drain gpu-node-17")
            assert await admin.receive() == b"admin:alice: drain gpu-node-17"
            for connection in (*held, admin):
                await connection.aclose()
            group.cancel_scope.cancel()
    assert listener.connections_per_principal_max == 4


async def test_one_identity_holds_at_most_its_share_of_the_places(
        certificates: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    """Sixteen places, an eighth each but at least four: the agent's fifth connection is
    refused, counted and logged (once, however often it tries), while another agent and an
    administrator still get in; when one of its connections ends it may open another."""
    service = EchoService()
    listener = listener_for(certificates, service, connections_max=16)
    with anyio.fail_after(TIME_LIMIT_S), caplog.at_level(logging.WARNING,
                                                         logger="cellar.transport"):
        async with anyio.create_task_group() as group:
            _, port = await group.start(listener.run)
            held = [await connect(port, context_for(certificates, NODE)) for _ in range(4)]
            for connection in held:
                await connection.send(b"hi")
                await connection.receive()
            for _ in range(2):
                assert await refused(port, context_for(certificates, NODE))
            assert listener.metrics[CONNECTIONS_REFUSED_PRINCIPAL] == 2
            assert listener.connections_of(NODE) == 4
            for identity in (OTHER_NODE, ADMIN):
                other = await connect(port, context_for(certificates, identity))
                await other.send(b"and me")
                assert await other.receive() == f"{identity.principal()}: and me".encode()
                await other.aclose()
            await held.pop().aclose()
            for _ in range(1000):
                if listener.connections_of(NODE) < 4:
                    break
                await anyio.sleep(0.005)
            again = await connect(port, context_for(certificates, NODE))
            await again.send(b"again")
            assert await again.receive() == b"node:gpu-node-17: again"
            for connection in (*held, again):
                await connection.aclose()
            group.cancel_scope.cancel()
    warnings = [record.getMessage() for record in caplog.records
                if "the most one client identity may" in record.getMessage()]
    assert len(warnings) == 1 and "cellar://node/gpu-node-17" in warnings[0], warnings
    assert listener.metrics[CONNECTIONS_REFUSED_LIMIT] == 0


async def test_a_client_frame_over_the_largest_request_ends_its_connection(
        certificates: pathlib.Path) -> None:
    """Answers may be as large as `frame_bytes_max` (8 MiB for a replica); a client's frame
    may not pass the largest valid request, about a megabyte."""
    lengths: list[int] = []

    async def measure(identity: Identity, connection: FramedConnection) -> None:
        while True:
            lengths.append(len(await connection.receive()))
            await connection.send(b"ok")

    tls = TlsConfig.in_directory(certificates, Identity.replica(0))
    listener = ClientListener((HOST, 0), tls, handle=measure, frame_bytes_max=8 << 20)
    assert listener.receive_bytes_max == REQUEST_BYTES_MAX
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            _, port = await group.start(listener.run)
            client = await connect(port, context_for(certificates, NODE))
            await client.stream.send(encode_frames([b"x" * REQUEST_BYTES_MAX]))
            assert await client.receive() == b"ok"
            await client.stream.send(encode_frames([b"x" * (REQUEST_BYTES_MAX + 1)]))
            assert await hung_up(client)
            await client.aclose()
            group.cancel_scope.cancel()
    assert lengths == [REQUEST_BYTES_MAX]
    assert listener.metrics[FRAMES_REFUSED_OVERSIZED] == 1


async def test_connections_still_in_the_handshake_take_no_client_place_and_are_bounded(
        certificates: pathlib.Path) -> None:
    """Silent connections that never start TLS hold handshake places only: a real client still
    gets a client place; one silent connection beyond the handshake bound is shed."""
    service = EchoService()
    listener = listener_for(certificates, service, connections_max=2, handshakes_max=3,
                            handshake_timeout_s=60)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            _, port = await group.start(listener.run)
            silent = [await anyio.connect_tcp(HOST, port) for _ in range(2)]
            for _ in range(1000):
                if listener.handshakes == 2:
                    break
                await anyio.sleep(0.005)
            client = await connect(port, context_for(certificates, ADMIN))
            await client.send(b"room for me")
            assert await client.receive() == b"admin:alice: room for me"
            assert listener.connections == 1
            silent.append(await anyio.connect_tcp(HOST, port))  # the third handshake place
            one_too_many = await anyio.connect_tcp(HOST, port)
            with pytest.raises(CONNECTION_ENDED):
                await one_too_many.receive()  # closed at once, long before the timeout
            assert listener.metrics[HANDSHAKES_REFUSED_LIMIT] == 1
            assert listener.handshakes == 3
            for stream in (*silent, one_too_many):
                await stream.aclose()
            await client.aclose()
            group.cancel_scope.cancel()


async def test_a_host_that_keeps_failing_its_handshakes_is_closed_unheard_for_a_while(
        certificates: pathlib.Path) -> None:
    """Loopback is charged here (it is exempt by default): after two failed handshakes even a
    valid client from that host is closed before any handshake, until the budget refills."""
    now_s = [0.0]
    guard = HandshakeGuard(failures_max=2, window_s=10.0, loopback_exempt=False,
                           clock=lambda: now_s[0])
    listener = listener_for(certificates, EchoService(), guard=guard)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            _, port = await group.start(listener.run)
            for _ in range(2):
                garbage = await anyio.connect_tcp(HOST, port)
                await garbage.send(b"GET / HTTP/1.1\r\n\r\n")
                with pytest.raises(CONNECTION_ENDED):
                    await garbage.receive()
                await garbage.aclose()
            with pytest.raises(CONNECTION_ENDED):
                barred = await connect(port, context_for(certificates, ADMIN))
                await barred.send(b"let me in")
                await barred.receive()
            assert listener.metrics[HANDSHAKES_REFUSED_BARRED] == 1
            assert listener.metrics[TLS_REFUSED] == 2  # no handshake was tried for the third
            now_s[0] += 5.0  # one failure's worth back
            client = await connect(port, context_for(certificates, ADMIN))
            await client.send(b"hello again")
            assert await client.receive() == b"admin:alice: hello again"
            await client.aclose()
            group.cancel_scope.cancel()


async def test_plain_tcp_when_asked_warns_and_uses_the_default_identity(
        caplog: pytest.LogCaptureFixture) -> None:
    service = EchoService()
    with caplog.at_level(logging.WARNING, logger="cellar.transport"):
        listener = listener_for(None, service)
    assert "plain TCP without TLS" in caplog.text
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            _, port = await group.start(listener.run)
            client = await connect(port, None)
            await client.send(b"anything")
            assert await client.receive() == b"admin:insecure-dev: anything"
            await client.aclose()
            group.cancel_scope.cancel()
    assert service.principals == [INSECURE_IDENTITY_DEFAULT.principal()]


def test_plain_tcp_is_never_the_default() -> None:
    with pytest.raises(ValueError, match="insecure=True"):
        ClientListener((HOST, 0), None, handle=EchoService())
