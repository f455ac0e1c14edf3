"""The peer mesh over real loopback sockets and mutual TLS, on asyncio and on trio.

Goal: frames reach every peer in order with the sender named by its certificate; whoever cannot
prove to be a peer of the group (no certificate, another CA, a client's certificate, a replica
of no concern, plain garbage) is refused and counted while the mesh keeps serving; a peer that
sends an absurd frame loses that one connection; a peer that restarts gets what was queued for
it meanwhile, up to the bound, and the rest is dropped and counted.

Method: each test starts meshes on free loopback ports, drives them through `send`, and waits
for conditions (never for a time), all bounded by `anyio.fail_after`."""

from __future__ import annotations

import logging
import pathlib
import random
import socket
import ssl
from collections.abc import Callable

import anyio
import anyio.abc
import pytest
import trustme
from anyio.streams.tls import TLSStream

from consensus.config import ReplicaConfig
from consensus.runtime.backoff import Backoff
from consensus.runtime.certs import identities, init_directory
from consensus.runtime.driver import DriverConfig
from consensus.runtime.framing import (
    CONNECTIONS_ACCEPTED,
    FRAMES_DROPPED_OVERSIZED,
    FRAMES_DROPPED_QUEUE_FULL,
    FRAMES_RECEIVED,
    FRAMES_REFUSED_OVERSIZED,
    FRAMES_SENT,
    FRAMES_TRUNCATED,
    HANDSHAKES_REFUSED_BARRED,
    HANDSHAKES_REFUSED_LIMIT,
    IDENTITY_REFUSED,
    RECONNECTS,
    TIMING_REFUSED,
    TLS_REFUSED,
    WRITES,
    Metrics,
    encode_frames,
)
from consensus.runtime.handshake_guard import HandshakeGuard
from consensus.runtime.peers import Hello, LinkTiming, Outbox, PeerMesh
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig

pytestmark = pytest.mark.anyio
HOST = "127.0.0.1"
TIME_LIMIT_S = 15
CONNECTION_ENDED = (OSError, anyio.BrokenResourceError, anyio.EndOfStream,
                    anyio.ClosedResourceError)



@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("certs")
    init_directory(directory, identities(replicas=4, nodes=["gpu-node-17"]))
    return directory


def free_ports(count: int) -> list[int]:
    """Free loopback ports to listen on.

    Tests stop meshes only once settled (every dialer connected, or stopped first if it would
    retry for ever against a live listener): Python 3.11's asyncio raises InvalidStateError
    from a listener cancelled in the very loop iteration a connection reaches it (CPython
    gh-153761), and the anyio test runner fails the test on it.
    """
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind((HOST, 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


class Inbox:
    """An `on_frame` that keeps what arrives."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, bytes]] = []

    def __call__(self, sender: int, frame: bytes) -> None:
        self.frames.append((sender, frame))

    def of(self, sender: int) -> list[bytes]:
        return [frame for source, frame in self.frames if source == sender]


def mesh_of(certificates: pathlib.Path | None, replica_id: int, ports: dict[int, int],
            inbox: Inbox, **options: object) -> PeerMesh:
    peers = {peer: (HOST, port) for peer, port in ports.items() if peer != replica_id}
    tls = (TlsConfig.in_directory(certificates, Identity.replica(replica_id))
           if certificates else None)
    return PeerMesh(replica_id, (HOST, ports[replica_id]), peers, tls, on_frame=inbox,
                    backoff_initial_s=0.01, backoff_max_s=0.1,
                    insecure=certificates is None, **options)  # type: ignore[arg-type]


async def eventually(condition: Callable[[], bool]) -> None:
    """Wait until `condition()` holds; the caller's fail_after bounds the wait."""
    for _ in range(100_000):
        if condition():
            return
        await anyio.sleep(0.005)
    raise AssertionError("condition never held")


class Running:
    """A mesh run in its own cancel scope, so a test can stop it alone."""

    def __init__(self, mesh: PeerMesh) -> None:
        self.mesh = mesh
        self.scope = anyio.CancelScope()
        self.stopped = anyio.Event()

    async def run(self, *, task_status: anyio.abc.TaskStatus[tuple[str, int]]) -> None:
        try:
            with self.scope:
                await self.mesh.run(task_status=task_status)
        finally:
            self.stopped.set()

    async def stop(self) -> None:
        self.scope.cancel()
        await self.stopped.wait()


async def start(group: anyio.abc.TaskGroup, mesh: PeerMesh) -> Running:
    running = Running(mesh)
    await group.start(running.run)
    return running


def client_context(certificates: pathlib.Path, identity: Identity | None) -> ssl.SSLContext:
    if identity is not None:
        return TlsConfig.in_directory(certificates, identity).client_context()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cafile=str(certificates / "ca.pem"))
    return context


async def dial(port: int, context: ssl.SSLContext | None) -> anyio.abc.ByteStream:
    stream: anyio.abc.ByteStream = await anyio.connect_tcp(HOST, port)
    if context is None:
        return stream
    return await TLSStream.wrap(stream, server_side=False, ssl_context=context,
                                standard_compatible=False)


async def intrude(port: int, context: ssl.SSLContext | None, data: bytes, *,
                  hang_up_first: bool = False) -> None:
    """Connect, send `data`, and hang up, or wait for the other end to hang up."""
    stream = None
    try:
        stream = await dial(port, context)
        await stream.send(data)
        if not hang_up_first:
            await stream.receive()
            raise AssertionError("the mesh answered an intruder")
    except CONNECTION_ENDED:
        pass
    finally:
        if stream is not None:
            await anyio.aclose_forcefully(stream)


async def test_three_replicas_deliver_every_way_with_senders_from_certificates(
        certificates: pathlib.Path) -> None:
    ports = dict(enumerate(free_ports(3)))
    inboxes = {replica: Inbox() for replica in ports}
    meshes = {replica: mesh_of(certificates, replica, ports, inboxes[replica])
              for replica in ports}
    expected = {(source, target): [f"{source}->{target} #{index}".encode()
                                    for index in range(200)]
                for source in ports for target in ports if source != target}
    for (source, target), frames in expected.items():  # queued before any connection exists
        assert all(meshes[source].send(target, frame) for frame in frames[:100])
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            for mesh in meshes.values():
                await start(group, mesh)
            for mesh in meshes.values():
                await mesh.wait_connected()
            for (source, target), frames in expected.items():  # sent while connected
                assert all(meshes[source].send(target, frame) for frame in frames[100:])
            await eventually(lambda: all(len(inbox.frames) == 400 for inbox in inboxes.values()))
            group.cancel_scope.cancel()
    for (source, target), frames in expected.items():
        assert inboxes[target].of(source) == frames
    for mesh in meshes.values():
        assert mesh.metrics[FRAMES_SENT] == mesh.metrics[FRAMES_RECEIVED] == 400
        assert mesh.metrics[WRITES] < 400 // 2  # the frames queued early went out merged
        assert mesh.metrics[TLS_REFUSED] == mesh.metrics[IDENTITY_REFUSED] == 0


class TurnsEveryOther:
    """A `turns` that lets every other batch's reader run the turn (as a driver at one
    caller's pace would), noting how many frames each turn found handed in since its claim."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self.claims = 0
        self.claimed_at: int | None = None
        self.turns: list[int] = []

    def claim_turn(self) -> bool:
        assert self.claimed_at is None  # every claim granted was followed by its turn
        self.claims += 1
        if self.claims % 2 == 0:
            return False
        self.claimed_at = len(self.inbox.frames)
        return True

    async def turn_here(self) -> None:
        assert self.claimed_at is not None
        self.turns.append(len(self.inbox.frames) - self.claimed_at)
        self.claimed_at = None
        await anyio.sleep(0)


async def test_a_reader_given_the_turn_hands_in_its_whole_batch_then_runs_it() -> None:
    ports = dict(enumerate(free_ports(2)))
    inboxes = {replica: Inbox() for replica in ports}
    meshes = {replica: mesh_of(None, replica, ports, inboxes[replica]) for replica in ports}
    turns = TurnsEveryOther(inboxes[1])
    meshes[1].turns = turns
    frames = [f"frame #{index}".encode() for index in range(300)]
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            for mesh in meshes.values():
                await start(group, mesh)
            await meshes[0].wait_connected()
            for index, frame in enumerate(frames):
                assert meshes[0].send(1, frame)
                if index % 7 == 0:
                    await anyio.sleep(0.001)  # batches of a few frames each
            await eventually(lambda: len(inboxes[1].frames) == len(frames))
            group.cancel_scope.cancel()
    assert inboxes[1].of(0) == frames
    assert turns.claims > 2 and len(turns.turns) == (turns.claims + 1) // 2
    assert all(count >= 1 for count in turns.turns)  # each ran after its batch was in


async def test_whoever_cannot_prove_to_be_a_peer_is_refused_and_counted(
        certificates: pathlib.Path) -> None:
    ports = dict(enumerate(free_ports(2)))
    inboxes = [Inbox(), Inbox()]
    meshes = [mesh_of(certificates, replica, ports, inboxes[replica]) for replica in ports]
    stranger = trustme.CA().issue_cert("localhost")
    foreign = client_context(certificates, None)
    stranger.configure_cert(foreign)
    frame = encode_frames([b"let me in"])
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            await start(group, meshes[0])
            for context in (foreign, client_context(certificates, None), None):
                await intrude(ports[0], context, frame)  # another CA, no certificate, no TLS
            for identity in (Identity.replica(3), Identity.replica(0),
                             Identity(IdentityRole.NODE, "gpu-node-17")):
                await intrude(ports[0], client_context(certificates, identity), frame)
            await eventually(lambda: meshes[0].metrics[TLS_REFUSED] == 3)
            await eventually(lambda: meshes[0].metrics[IDENTITY_REFUSED] == 3)
            await start(group, meshes[1])  # the mesh keeps serving its real peer
            assert meshes[1].send(0, b"from a peer")
            await eventually(lambda: inboxes[0].frames == [(1, b"from a peer")])
            await meshes[0].wait_connected()  # settled: see `free_ports`
            group.cancel_scope.cancel()
    assert meshes[0].metrics[CONNECTIONS_ACCEPTED] == 1


async def test_a_host_that_keeps_failing_its_handshakes_is_barred_until_its_budget_refills(
        certificates: pathlib.Path) -> None:
    """Loopback is charged here (exempt by default), so the real peer, on the same host as the
    intruder, is shut out with it until the budget refills."""
    ports = dict(enumerate(free_ports(2)))
    inboxes = [Inbox(), Inbox()]
    now_s = [0.0]
    guard = HandshakeGuard(failures_max=3, window_s=30.0, loopback_exempt=False,
                           clock=lambda: now_s[0])
    meshes = [mesh_of(certificates, 0, ports, inboxes[0], guard=guard),
              mesh_of(certificates, 1, ports, inboxes[1])]
    frame = encode_frames([b"let me in"])
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            await start(group, meshes[0])
            for _ in range(3):
                await intrude(ports[0], client_context(certificates, None), frame)
            await eventually(lambda: meshes[0].metrics[TLS_REFUSED] == 3)
            await start(group, meshes[1])
            assert meshes[1].send(0, b"from a peer")
            await eventually(lambda: meshes[0].metrics[HANDSHAKES_REFUSED_BARRED] >= 2)
            assert inboxes[0].frames == []
            assert meshes[0].metrics[TLS_REFUSED] == 3  # no handshake was tried for the peer
            now_s[0] += 10.0  # a failure's worth back: the peer's next dial gets through
            await eventually(lambda: inboxes[0].frames == [(1, b"from a peer")])
            await meshes[0].wait_connected()
            group.cancel_scope.cancel()


async def test_a_dialer_refuses_a_server_that_is_not_the_replica_it_expected(
        certificates: pathlib.Path) -> None:
    ports = dict(enumerate(free_ports(3)))
    inboxes = [Inbox(), Inbox(), Inbox()]
    # Replica 0 believes replica 1 lives where replica 2 does.
    confused = mesh_of(certificates, 0, {0: ports[0], 1: ports[2], 2: ports[2]}, inboxes[0])
    honest = mesh_of(certificates, 2, {0: ports[0], 2: ports[2]}, inboxes[2])
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            confused_running = await start(group, confused)
            await start(group, honest)
            assert confused.send(1, b"for replica 1 only")
            await eventually(lambda: confused.metrics[IDENTITY_REFUSED] >= 2)
            await honest.wait_connected()  # the other direction is fine
            assert honest.send(0, b"hello")
            await eventually(lambda: inboxes[0].frames == [(2, b"hello")])
            await confused.wait_connected([2])
            assert confused.connected() == {2}
            await confused_running.stop()  # it would dial the wrong replica for ever
            group.cancel_scope.cancel()
    assert confused.queued(1) == 1
    assert inboxes[2].frames == []


async def test_an_oversized_or_truncated_frame_closes_that_connection_only(
        certificates: pathlib.Path) -> None:
    ports = dict(enumerate(free_ports(3)))
    inboxes = [Inbox(), Inbox(), Inbox()]
    mesh = mesh_of(certificates, 0, ports, inboxes[0], frame_bytes_max=1024)
    other = mesh_of(certificates, 2, ports, inboxes[2], frame_bytes_max=1024)
    replica_1 = client_context(certificates, Identity.replica(1))
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            await start(group, mesh)
            await start(group, other)
            await other.wait_connected([0])
            hello = encode_frames([Hello(1, LinkTiming()).encode()])
            await intrude(ports[0], replica_1,
                          hello + encode_frames([b"fine"]) + b"\xff\xff\xff\xff")
            await intrude(ports[0], replica_1, hello + encode_frames([b"x" * 1025]))
            await intrude(ports[0], replica_1, hello + encode_frames([b"half a frame"])[:-3],
                          hang_up_first=True)
            assert other.send(0, b"still served")
            await eventually(lambda: (2, b"still served") in inboxes[0].frames)
            await eventually(lambda: mesh.metrics[FRAMES_TRUNCATED] == 1)
            assert other.connected() == {0}  # never disturbed
            await mesh.wait_connected([2])
            group.cancel_scope.cancel()
    assert inboxes[0].of(1) == [b"fine"]
    assert mesh.metrics[FRAMES_REFUSED_OVERSIZED] == 2
    assert other.metrics[RECONNECTS] == 0


async def test_idle_connections_take_no_peer_place_and_are_bounded_in_the_handshake(
        certificates: pathlib.Path) -> None:
    """More silent connections than there are peer places (a peer's place is taken only once
    it proved who it is): the peer still connects at once; one beyond the handshake bound is
    shed at once; the others are closed when their handshake time runs out."""
    ports = dict(enumerate(free_ports(2)))
    inboxes = [Inbox(), Inbox()]
    mesh = mesh_of(certificates, 0, ports, inboxes[0], handshake_timeout_s=1.0,
                   handshakes_max=12)
    assert mesh.inbound_connections_max == 2
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            await start(group, mesh)
            idle = [await anyio.connect_tcp(HOST, ports[0]) for _ in range(11)]
            await eventually(lambda: mesh.handshakes == 11)
            peer = await start(group, mesh_of(certificates, 1, ports, inboxes[1]))
            await peer.mesh.wait_connected()  # long before the idle ones time out
            assert peer.mesh.send(0, b"in despite the idle ones")
            await eventually(lambda: inboxes[0].frames == [(1, b"in despite the idle ones")])
            assert (mesh.inbound_connections, mesh.handshakes) == (1, 11)
            idle.append(await anyio.connect_tcp(HOST, ports[0]))  # the twelfth place
            excess = await anyio.connect_tcp(HOST, ports[0])
            with pytest.raises(CONNECTION_ENDED):
                await excess.receive()  # closed at once
            assert mesh.metrics[HANDSHAKES_REFUSED_LIMIT] == 1
            for stream in idle:  # closed when the handshake time runs out
                with pytest.raises(CONNECTION_ENDED):
                    await stream.receive()
                await stream.aclose()
            await excess.aclose()
            await eventually(lambda: mesh.metrics[TLS_REFUSED] == 12)
            await mesh.wait_connected()
            assert mesh.send(1, b"room for a peer")
            await eventually(lambda: inboxes[1].frames == [(0, b"room for a peer")])
            group.cancel_scope.cancel()


async def test_a_restarted_peer_gets_what_was_queued_up_to_the_bound(
        certificates: pathlib.Path) -> None:
    ports = dict(enumerate(free_ports(2)))
    inboxes = [Inbox(), Inbox()]
    sender = mesh_of(certificates, 0, ports, inboxes[0], queue_frames_max=4)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            await start(group, sender)
            first_life = await start(group, mesh_of(certificates, 1, ports, inboxes[1]))
            await sender.wait_connected()
            assert sender.send(1, b"before")
            await eventually(lambda: inboxes[1].frames == [(0, b"before")])
            await first_life.stop()
            await eventually(lambda: sender.connected() == set())
            sent = [sender.send(1, f"meanwhile #{index}".encode()) for index in range(6)]
            second_inbox = Inbox()
            second_life = await start(group, mesh_of(certificates, 1, ports, second_inbox))
            await eventually(lambda: len(second_inbox.frames) == 4)
            await sender.wait_connected()
            await second_life.mesh.wait_connected()
            group.cancel_scope.cancel()
    assert sent == [True] * 4 + [False] * 2
    assert second_inbox.of(0) == [f"meanwhile #{index}".encode() for index in range(4)]
    assert sender.metrics[FRAMES_DROPPED_QUEUE_FULL] == 2
    assert sender.metrics[RECONNECTS] == 1


async def test_the_newest_connection_from_a_peer_replaces_the_older(
        certificates: pathlib.Path) -> None:
    ports = dict(enumerate(free_ports(2)))
    inbox = Inbox()
    mesh = mesh_of(certificates, 0, ports, inbox)
    replica_1 = client_context(certificates, Identity.replica(1))
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            await start(group, mesh)
            hello = encode_frames([Hello(1, LinkTiming()).encode()])
            older = await dial(ports[0], replica_1)
            await older.send(hello + encode_frames([b"old"]))
            await eventually(lambda: inbox.frames == [(1, b"old")])
            newer = await dial(ports[0], replica_1)
            await newer.send(hello + encode_frames([b"new"]))
            with pytest.raises(CONNECTION_ENDED):
                await older.receive()  # closed by the mesh
            await eventually(lambda: inbox.frames == [(1, b"old"), (1, b"new")])
            await newer.aclose()
            await older.aclose()
            group.cancel_scope.cancel()


async def test_plain_tcp_when_asked_warns_and_takes_the_dialer_at_its_word(
        caplog: pytest.LogCaptureFixture) -> None:
    ports = dict(enumerate(free_ports(2)))
    inboxes = [Inbox(), Inbox()]
    with caplog.at_level(logging.WARNING, logger="cellar.transport"):
        meshes = [mesh_of(None, replica, ports, inboxes[replica]) for replica in ports]
    assert caplog.text.count("plain TCP without TLS") == 2
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            for mesh in meshes:
                await start(group, mesh)
            assert meshes[0].send(1, b"ping")
            assert meshes[1].send(0, b"pong")
            await eventually(lambda: inboxes[1].frames == [(0, b"ping")])
            await eventually(lambda: inboxes[0].frames == [(1, b"pong")])
            await intrude(ports[0], None, encode_frames([Hello(7, LinkTiming()).encode()]))
            await intrude(ports[0], None, encode_frames([b"hello, I am replica 1"]))
            await eventually(lambda: meshes[0].metrics[IDENTITY_REFUSED] == 2)
            for mesh in meshes:
                await mesh.wait_connected()
            group.cancel_scope.cancel()


async def test_replicas_whose_lease_timing_differs_refuse_each_other_and_say_why(
        certificates: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    """A lease is counted in ticks by the sequencer and its followers each: with longer ticks
    than its followers', a sequencer trusts its lease past their promises (a stale read)."""
    ports = dict(enumerate(free_ports(2)))
    inboxes = [Inbox(), Inbox()]
    meshes = [mesh_of(certificates, 0, ports, inboxes[0], timing=LinkTiming(tick_ms=15)),
              mesh_of(certificates, 1, ports, inboxes[1], timing=LinkTiming(tick_ms=5))]
    with caplog.at_level(logging.ERROR, logger="cellar.transport"), \
            anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            for mesh in meshes:
                await start(group, mesh)
            assert meshes[0].send(1, b"ping")
            assert meshes[1].send(0, b"pong")
            await eventually(lambda: all(mesh.metrics[TIMING_REFUSED] >= 3 for mesh in meshes))
            group.cancel_scope.cancel()
    assert [inbox.frames for inbox in inboxes] == [[], []]
    assert meshes[0].refused == {1: "its lease timing differs: tick_ms 5 there, 15 here; "
                                    "every replica must have the same tick_ms, lease_ticks "
                                    "and lease_drift_ticks"}
    assert meshes[1].refused[0].startswith("its lease timing differs: tick_ms 15 there, 5 here")
    errors = [record.getMessage() for record in caplog.records]
    assert len(errors) == 2  # once a peer and reason, not at every dial
    assert "replica 0: refused replica 1: its lease timing differs: tick_ms 5 there, 15 here" \
        in errors[0] + errors[1]


async def test_a_peer_that_sends_no_hello_is_refused(certificates: pathlib.Path) -> None:
    """A replica of a version before hellos: its lease timing is unknown."""
    ports = dict(enumerate(free_ports(2)))
    inbox = Inbox()
    mesh = mesh_of(certificates, 0, ports, inbox)
    replica_1 = client_context(certificates, Identity.replica(1))
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            await start(group, mesh)
            await intrude(ports[0], replica_1, encode_frames([b"a message"]))
            await intrude(ports[0], replica_1, encode_frames([Hello(2, LinkTiming()).encode()]))
            group.cancel_scope.cancel()
    assert inbox.frames == []
    assert mesh.metrics[TIMING_REFUSED] == 2
    assert "no hello" in mesh.refused[1]


def test_a_hello_carries_the_id_and_the_lease_timing_and_nothing_else_is_one() -> None:
    hello = Hello(2, LinkTiming(tick_ms=5, lease_ticks=80, lease_drift_ticks=8))
    assert Hello.parse(hello.encode()) == hello
    encoded = hello.encode()
    for garbage in (b"", b"2", encoded[1:], encoded[:-1], encoded.replace(b"80", b"80.0"),
                    encoded.replace(b"tick_ms", b"tick_us"), encoded + b" " * 1024,
                    encoded.replace(b', "tick_ms": 5', b"")):
        assert Hello.parse(garbage) is None, garbage


def test_the_default_lease_timing_is_the_replicas_default() -> None:
    assert LinkTiming() == LinkTiming.of(DriverConfig().tick_ms,
                                         ReplicaConfig(replica_id=0, replica_count=3))


def test_send_refuses_what_it_cannot_deliver(certificates: pathlib.Path) -> None:
    mesh = mesh_of(certificates, 0, {0: 1, 1: 2}, Inbox(), frame_bytes_max=8)
    assert not mesh.send(1, b"123456789")
    assert mesh.metrics[FRAMES_DROPPED_OVERSIZED] == 1
    assert mesh.send(1, b"12345678")
    assert mesh.queued(1) == 1
    with pytest.raises(ValueError, match="not a peer"):
        mesh.send(2, b"x")
    with pytest.raises(ValueError, match="lists itself"):
        PeerMesh(0, (HOST, 1), {0: (HOST, 1)}, None, on_frame=Inbox(), insecure=True)
    with pytest.raises(ValueError, match="insecure=True"):
        PeerMesh(0, (HOST, 1), {1: (HOST, 2)}, None, on_frame=Inbox())


def test_the_outbox_bounds_frames_and_bytes_and_takes_in_batches() -> None:
    outbox = Outbox(frames_max=3, bytes_max=10)
    assert [outbox.push(frame) for frame in (b"1234", b"5678", b"abc")] == [True, True, False]
    assert outbox.push(b"ab")
    assert not outbox.push(b"c")  # three frames already
    assert outbox.take(frames_max=2, bytes_max=100) == [b"1234", b"5678"]
    assert outbox.queued_bytes == 2
    assert outbox.take(frames_max=5, bytes_max=1) == [b"ab"]  # at least one
    assert len(outbox) == 0


def test_backoff_grows_to_its_cap_with_jitter() -> None:
    backoff = Backoff(0.1, 1.0, random.Random(7))
    delays = [backoff.next_delay_s() for _ in range(8)]
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    assert all(ceiling / 2 <= delay <= ceiling for delay, ceiling in zip(delays, ceilings,
                                                                          strict=True))
    assert len(set(delays[4:])) == 4  # jittered, not in lockstep
    backoff.reset()
    assert backoff.next_delay_s() <= 0.1


def test_metrics_can_be_shared() -> None:
    shared = Metrics()
    mesh = PeerMesh(0, (HOST, 1), {1: (HOST, 2)}, None, on_frame=Inbox(), insecure=True,
                    metrics=shared, frame_bytes_max=1)
    mesh.send(1, b"too long")
    assert shared[FRAMES_DROPPED_OVERSIZED] == 1
