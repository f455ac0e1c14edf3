"""The PySyncObj peer: its wire framing (always), and a live 3-node cluster driven by concurrent
callers when a PySyncObj virtual environment already exists (the tests never pip-install)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellar.bench.peers import pysyncobj_node as wire
from cellar.bench.peers import pysyncobj_peer as peer

ids = st.integers(min_value=0, max_value=2**64 - 1)
requests = st.builds(wire.Request, st.sampled_from([wire.OP_PUT, wire.OP_GET, wire.OP_STATUS]),
                     ids, st.binary(max_size=300), st.binary(max_size=2000))
replies = st.builds(wire.Reply, st.integers(min_value=0, max_value=wire.STATUS_BAD_REQUEST),
                    ids, st.binary(max_size=2000))


@given(st.lists(requests, max_size=8), st.integers(min_value=1, max_value=64))
def test_requests_round_trip_however_the_stream_is_cut(batch, chunk_bytes) -> None:
    stream = b"".join(wire.encode_request(request) for request in batch)
    buffer = bytearray()
    decoded = []
    for start in range(0, len(stream), chunk_bytes):
        buffer += stream[start:start + chunk_bytes]
        decoded += [wire.decode_request(payload) for payload in wire.split_frames(buffer)]
    assert decoded == batch
    assert buffer == bytearray()


@given(replies)
def test_replies_round_trip(reply) -> None:
    buffer = bytearray(wire.encode_reply(reply))
    assert [wire.decode_reply(payload) for payload in wire.split_frames(buffer)] == [reply]


def test_an_oversized_length_prefix_is_refused_before_its_payload() -> None:
    buffer = bytearray(struct.pack(">I", wire.MAX_FRAME_BYTES + 1) + b"x")
    with pytest.raises(wire.FrameError, match="exceeds"):
        wire.split_frames(buffer)


def test_an_oversized_payload_is_not_encoded() -> None:
    with pytest.raises(wire.FrameError):
        wire.encode_request(wire.Request(wire.OP_PUT, 1, b"k", b"v" * wire.MAX_FRAME_BYTES))
    with pytest.raises(wire.FrameError):
        wire.encode_request(wire.Request(wire.OP_PUT, 1, b"k" * 70_000, b""))


def test_a_frame_at_the_cap_is_accepted() -> None:
    buffer = bytearray(struct.pack(">I", wire.MAX_FRAME_BYTES) + bytes(wire.MAX_FRAME_BYTES))
    assert [len(payload) for payload in wire.split_frames(buffer)] == [wire.MAX_FRAME_BYTES]


def test_an_incomplete_frame_waits_for_more_bytes() -> None:
    frame = wire.encode_request(wire.Request(wire.OP_GET, 7, b"key", b""))
    buffer = bytearray(frame[:-1])
    assert wire.split_frames(buffer) == []
    assert buffer == bytearray(frame[:-1])


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "too short"),
        (struct.pack(">BQH", 9, 1, 0), "unknown op"),
        (struct.pack(">BQH", wire.OP_PUT, 1, 5) + b"abc", "past the end"),
    ],
)
def test_malformed_requests_are_refused(payload, message) -> None:
    with pytest.raises(wire.FrameError, match=message):
        wire.decode_request(payload)


@pytest.mark.parametrize(
    ("payload", "message"),
    [(b"\x00" * 8, "too short"), (struct.pack(">BQ", 99, 1), "unknown status")],
)
def test_malformed_replies_are_refused(payload, message) -> None:
    with pytest.raises(wire.FrameError, match=message):
        wire.decode_reply(payload)


def test_failed_commands_become_retry_replies() -> None:
    assert wire.reply_for(5, wire.OP_PUT, None, 2) == wire.Reply(wire.STATUS_RETRY, 5, b"\x02")
    assert wire.reply_for(5, wire.OP_GET, None, 0).status == wire.STATUS_ABSENT
    assert wire.reply_for(5, wire.OP_GET, b"v", 0) == wire.Reply(wire.STATUS_OK, 5, b"v")
    assert wire.reply_for(5, wire.OP_PUT, None, 0) == wire.Reply(wire.STATUS_OK, 5, b"")


def installed_venv() -> pathlib.Path:
    """The work directory of an existing PySyncObj venv, or skip the test."""
    work_dir = pathlib.Path(os.environ.get("CELLAR_PYSYNCOBJ_WORK_DIR", peer.DEFAULT_WORK_DIR))
    if not peer.venv_works(peer.venv_python(work_dir)):
        pytest.skip(f"no PySyncObj {peer.PYSYNCOBJ_VERSION} venv at {work_dir / peer.VENV_NAME} "
                    "(`cellar bench peers` creates it; the tests do not pip-install)")
    return work_dir


async def concurrent_puts_and_gets(cluster: peer.PySyncObjCluster) -> None:
    client = await cluster.connect()
    try:
        async def caller(index: int) -> None:
            for round_ in range(10):
                key, value = f"k{index}".encode(), f"{index}:{round_}".encode()
                await client.put(key, value)
                assert await client.get(key) == value

        await asyncio.gather(*(caller(index) for index in range(20)))
        assert await client.get(b"absent") is None
    finally:
        await client.aclose()


@pytest.mark.live
@pytest.mark.timeout(60)
def test_a_live_cluster_serves_concurrent_callers(tmp_path: pathlib.Path) -> None:
    system = peer.PySyncObjSystem(conf={"appendEntriesUseBatch": False})
    system.prepare(installed_venv())
    cluster = system.start(tmp_path)
    try:
        assert (cluster.name, cluster.replicas) == ("pysyncobj", 3)
        assert not cluster.durability.synced
        asyncio.run(concurrent_puts_and_gets(cluster))
    finally:
        cluster.stop()
        cluster.stop()
    assert all(process.poll() is not None for process in cluster.processes)
    assert all((tmp_path / f"node-{index}" / "journal.bin").exists() for index in range(3))


async def puts_survive_the_leader(cluster: peer.PySyncObjCluster) -> None:
    client = await cluster.connect()
    try:
        await client.put(b"before", b"1")
        assert client.connection is not None
        leader = tuple(client.connection.writer.get_extra_info("peername")[:2])
        cluster.processes[[node.client for node in cluster.nodes].index(leader)].kill()
        await client.put(b"after", b"2")
        assert (await client.get(b"before"), await client.get(b"after")) == (b"1", b"2")
    finally:
        await client.aclose()


@pytest.mark.live
@pytest.mark.timeout(60)
def test_the_client_follows_a_new_leader_after_the_old_one_dies(tmp_path: pathlib.Path) -> None:
    system = peer.PySyncObjSystem()
    system.prepare(installed_venv())
    cluster = system.start(tmp_path)
    try:
        asyncio.run(puts_survive_the_leader(cluster))
    finally:
        cluster.stop()
