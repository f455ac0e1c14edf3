"""Bad hellos are refused, and cost the replica little: deeply nested JSON must not crash the
whole peer mesh (and with it the replica), and a dialer that has named no replica yet cannot
make it wait for, and buffer, a whole frame's worth of bytes."""

from __future__ import annotations

import json
import pathlib
import ssl

import anyio
import pytest

from consensus.runtime.framing import (
    HEADER,
    IDENTITY_REFUSED,
    PROTOCOL_REFUSED,
    TIMING_REFUSED,
    encode_frames,
)
from consensus.runtime.peers import (
    HELLO_BYTES_MAX,
    PEER_HELLO,
    PEER_PROTOCOL,
    Hello,
    LinkTiming,
    PeerMesh,
)
from consensus.runtime.tls import Identity
from tests.consensus.runtime.test_peers import (
    TIME_LIMIT_S,
    Inbox,
    certificates,  # noqa: F401  (fixture)
    client_context,
    dial,
    eventually,
    free_ports,
    intrude,
    mesh_of,
    start,
)

pytestmark = pytest.mark.anyio
NESTED = PEER_HELLO + b"[" * (HELLO_BYTES_MAX - len(PEER_HELLO))


def test_a_deeply_nested_hello_parses_as_none() -> None:
    assert Hello.parse(NESTED) is None
    assert Hello.parse(PEER_HELLO + b'{"a":' * 300) is None


async def test_a_deeply_nested_hello_is_refused_and_the_mesh_keeps_serving() -> None:
    ports = dict(enumerate(free_ports(2)))
    inboxes = [Inbox(), Inbox()]
    meshes = [mesh_of(None, replica, ports, inboxes[replica]) for replica in ports]
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            for mesh in meshes:
                await start(group, mesh)
            await intrude(ports[0], None, encode_frames([NESTED]))
            await eventually(lambda: meshes[0].metrics[IDENTITY_REFUSED] == 1)
            assert meshes[1].send(0, b"still here")
            await eventually(lambda: inboxes[0].frames == [(1, b"still here")])
            for mesh in meshes:
                await mesh.wait_connected()
            group.cancel_scope.cancel()


def certified_mesh(authority: pathlib.Path
                   ) -> tuple[dict[int, int], Inbox, PeerMesh, ssl.SSLContext]:
    """Replica 0's mesh of a group with certificates, and replica 1's client context."""
    ports = dict(enumerate(free_ports(2)))
    inbox = Inbox()
    mesh = mesh_of(authority, 0, ports, inbox)
    return ports, inbox, mesh, client_context(authority, Identity.replica(1))


async def test_a_certified_peer_sending_a_nested_hello_is_refused(
        certificates: pathlib.Path) -> None:  # noqa: F811
    ports, inbox, mesh, replica_1 = certified_mesh(certificates)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            running = await start(group, mesh)
            stream = await dial(ports[0], replica_1)
            await stream.send(encode_frames([NESTED]))
            await eventually(lambda: mesh.metrics[TIMING_REFUSED] == 1)
            await stream.aclose()
            good = await dial(ports[0], replica_1)
            await good.send(encode_frames([Hello(1, LinkTiming()).encode(), b"ok"]))
            await eventually(lambda: inbox.frames == [(1, b"ok")])
            await good.aclose()
            await running.stop()
            group.cancel_scope.cancel()


async def test_a_hello_announced_past_its_cap_is_refused_without_waiting_for_it() -> None:
    """The hello is read under HELLO_BYTES_MAX, not the peers' frame cap: a length above it
    is refused at once (the replica had waited out the handshake for up to 32 MiB)."""
    ports = dict(enumerate(free_ports(2)))
    mesh = mesh_of(None, 0, ports, Inbox(), handshake_timeout_s=3600)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            running = await start(group, mesh)
            await intrude(ports[0], None, HEADER.pack(HELLO_BYTES_MAX + 1) + PEER_HELLO)
            await eventually(lambda: mesh.metrics[IDENTITY_REFUSED] == 1)
            await running.stop()
            group.cancel_scope.cancel()


async def test_frames_past_the_hello_cap_pass_once_the_hello_named_a_peer() -> None:
    """The cap widens to the mesh's after the hello, also for a frame sent in the same write."""
    ports = dict(enumerate(free_ports(2)))
    inbox = Inbox()
    mesh = mesh_of(None, 0, ports, inbox)
    large = b"x" * (HELLO_BYTES_MAX * 64)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            running = await start(group, mesh)
            stream = await dial(ports[0], None)
            await stream.send(encode_frames([Hello(1, LinkTiming()).encode(), b"small", large]))
            await eventually(lambda: inbox.frames == [(1, b"small"), (1, large)])
            await stream.aclose()
            await running.stop()
            group.cancel_scope.cancel()


def test_a_hello_of_a_build_before_protocols_parses_as_none() -> None:
    """The hello of the build before (a49d2a1), which would apply this build's Ticks as
    malformed and diverge: no protocol field, so no hello."""
    older = PEER_HELLO + json.dumps({
        "replica_id": 1, "tick_ms": 10, "lease_ticks": 40, "lease_drift_ticks": 4,
        "disk": "", "epoch": 0, "start": "", "your_disk": "", "your_epoch": 0,
        "your_start": ""}, sort_keys=True).encode()
    assert Hello.parse(older) is None
    assert Hello.parse(older.replace(b'{"disk"', b'{"protocol": 3, "disk"')) is not None


async def test_a_peer_of_another_protocol_is_refused_and_told_why(
        certificates: pathlib.Path) -> None:  # noqa: F811
    ports, inbox, mesh, replica_1 = certified_mesh(certificates)
    other = Hello(1, LinkTiming(), protocol=PEER_PROTOCOL + 1)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            running = await start(group, mesh)
            stream = await dial(ports[0], replica_1)
            await stream.send(encode_frames([other.encode(), b"from another build"]))
            await eventually(lambda: 1 in mesh.refused)
            await stream.aclose()
            await running.stop()
            group.cancel_scope.cancel()
    assert inbox.frames == []
    assert f"peer protocol {PEER_PROTOCOL + 1}, this replica {PEER_PROTOCOL}" in \
        mesh.refused[1]
    # Counted as what it is: an operator reading peers_refused_timing looks for a tick_ms.
    assert mesh.metrics[PROTOCOL_REFUSED] == 1
    assert mesh.metrics[TIMING_REFUSED] == 0
