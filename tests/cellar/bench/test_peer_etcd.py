"""The etcd peer: the hand-written protobuf codec (property tests, always run) and a live
3-member cluster driven by concurrent clients (skipped when etcd is not installed)."""

from __future__ import annotations

import asyncio
import pathlib
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellar.bench.peers import etcd, etcd_wire
from cellar.bench.peers.etcd import (
    EtcdCluster,
    EtcdSystem,
    find_etcd,
    member_command,
    plan_members,
)

keys = st.binary(min_size=1, max_size=64)
values = st.binary(max_size=2000)


def key_value(key: bytes, value: bytes, revision: int) -> bytes:
    """A KeyValue as etcd sends it: key, create/mod revisions, version, value, in field order."""
    return (etcd_wire.encode_bytes_field(1, key) + b"\x10" + etcd_wire.encode_varint(revision)
            + b"\x18" + etcd_wire.encode_varint(revision) + b"\x20\x01"
            + etcd_wire.encode_bytes_field(5, value))


def range_response(kvs: list[bytes], revision: int) -> bytes:
    header = etcd_wire.encode_bytes_field(1, b"\x08\x01\x10\x02\x18" +
                                          etcd_wire.encode_varint(revision) + b"\x20\x02")
    count = b"\x20" + etcd_wire.encode_varint(len(kvs)) if kvs else b""
    return header + b"".join(etcd_wire.encode_bytes_field(2, kv) for kv in kvs) + count


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_varints_round_trip(value: int) -> None:
    encoded = etcd_wire.encode_varint(value)
    assert etcd_wire.decode_varint(b"\xff" + encoded, 1) == (value, len(encoded) + 1)
    assert len(encoded) == max(1, (value.bit_length() + 6) // 7)


@given(keys, values)
def test_put_requests_decode_to_their_fields(key: bytes, value: bytes) -> None:
    decoded = {field.number: field.value for field in
               etcd_wire.fields(etcd_wire.put_request(key, value))}
    assert decoded == ({1: key, 2: value} if value else {1: key})


@given(st.lists(st.tuples(keys, values), max_size=3),
       st.integers(min_value=1, max_value=2**63 - 1))
def test_range_responses_yield_the_first_value(pairs: list[tuple[bytes, bytes]],
                                               revision: int) -> None:
    response = range_response([key_value(key, value, revision) for key, value in pairs],
                              revision)
    assert etcd_wire.first_value(response) == (pairs[0][1] if pairs else None)


@given(keys, values.filter(bool), st.data())
def test_truncated_responses_are_rejected(key: bytes, value: bytes, data: st.DataObject) -> None:
    response = range_response([key_value(key, value, 7)], 7)
    cut = data.draw(st.integers(min_value=1, max_value=len(response) - 1))
    try:
        found = etcd_wire.first_value(response[:cut])
    except etcd_wire.MalformedMessage:
        return
    # A cut that falls exactly between top-level fields leaves a shorter, valid message.
    assert found in (value, None)


def test_bytes_match_hand_computed_encodings() -> None:
    assert etcd_wire.encode_varint(0) == b"\x00"
    assert etcd_wire.encode_varint(300) == b"\xac\x02"
    assert etcd_wire.encode_varint(2**64 - 1) == b"\xff" * 9 + b"\x01"
    assert etcd_wire.put_request(b"foo", b"bar") == b"\x0a\x03foo\x12\x03bar"
    assert etcd_wire.put_request(b"k", b"") == b"\x0a\x01k"
    assert etcd_wire.range_request(b"foo") == b"\x0a\x03foo"
    kv = b"\x0a\x03foo\x10\x05\x18\x05\x20\x01\x2a\x03bar"
    assert etcd_wire.first_value(b"\x0a\x02\x18\x05\x12" + bytes([len(kv)]) + kv
                                 + b"\x20\x01") == b"bar"
    assert etcd_wire.first_value(b"\x0a\x02\x18\x05") is None
    assert etcd_wire.first_value(b"\x12\x05\x0a\x03foo") == b""  # a key with an empty value


@pytest.mark.parametrize("data", [b"\x12\x05\x0a", b"\x12", b"\x80", b"\xff" * 11, b"\x0b",
                                  b"\x00\x00", b"\x12\x02\x2a\x05", b"\x12\x02\x28\x01",
                                  b"\x11\x01\x02", b"\x10\x01"])
def test_malformed_bytes_raise(data: bytes) -> None:
    with pytest.raises(etcd_wire.MalformedMessage):
        etcd_wire.first_value(data)


def test_varints_out_of_range_are_refused() -> None:
    for value in (-1, 2**64):
        with pytest.raises(ValueError, match="out of range"):
            etcd_wire.encode_varint(value)


def test_a_status_response_names_the_member_and_the_leader() -> None:
    header = etcd_wire.encode_bytes_field(1, b"\x08\x07\x10" + etcd_wire.encode_varint(2**63 + 5)
                                          + b"\x18\x09\x20\x02")
    version = etcd_wire.encode_bytes_field(2, b"3.4.30")
    leader = b"\x20" + etcd_wire.encode_varint(2**63 + 5)
    assert etcd_wire.member_and_leader(header + version + b"\x18\x40" + leader) == (
        2**63 + 5, 2**63 + 5)
    assert etcd_wire.member_and_leader(header + version) == (2**63 + 5, 0)  # no leader yet
    with pytest.raises(etcd_wire.MalformedMessage):
        etcd_wire.member_and_leader(b"\x0a\x05\x08")  # a truncated header


async def writer_then_reader(cluster: EtcdCluster, writer: int, rounds: int) -> None:
    client = await cluster.connect()
    try:
        for round_ in range(rounds):
            key = f"writer-{writer}/key-{round_ % 5}".encode()
            value = f"{writer}:{round_}".encode() * (1 + round_ % 3)
            await client.put(key, value)
            assert await client.get(key) == value  # read-your-writes, linearizable
        assert await client.get(f"writer-{writer}/absent".encode()) is None
    finally:
        await client.aclose()


@pytest.mark.live
@pytest.mark.timeout(60)
def test_a_live_cluster_serves_concurrent_clients(tmp_path: pathlib.Path) -> None:
    if find_etcd() is None:
        pytest.skip("etcd is not installed (`cellar bench peers` installs etcd-server)")
    pytest.importorskip("grpc", reason="grpcio is not installed")
    system = EtcdSystem()
    system.prepare(tmp_path)
    cluster = system.start(tmp_path / "cluster")
    try:
        assert (cluster.name, cluster.replicas, cluster.durability.synced) == ("etcd", 3, True)

        async def run(writers: range) -> None:
            await asyncio.gather(*(writer_then_reader(cluster, writer, 40)
                                   for writer in writers))
        asyncio.run(run(range(8)))
        leader = cluster.leader_endpoint()
        assert leader in [member.endpoint for member in cluster.members]
        cluster.leader_only = True  # as etcd-leader's clients: the leader alone
        asyncio.run(run(range(20, 22)))
        cluster.leader_only = False
        # The load generator runs on uvloop: grpc.aio must work there too.
        uvloop = pytest.importorskip("uvloop")
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run(range(8, 12)))
    finally:
        cluster.stop()
    assert all(process.poll() is not None for process in cluster.processes)
    cluster.stop()  # idempotent
    assert system.version and system.version[0].isdigit()
    assert sorted(path.name for path in (tmp_path / "cluster").iterdir()) == [
        "etcd-0.data", "etcd-0.log", "etcd-1.data", "etcd-1.log", "etcd-2.data", "etcd-2.log"]


def test_members_form_one_static_cluster_with_default_durability(tmp_path: pathlib.Path) -> None:
    members = plan_members(tmp_path)
    commands = [member_command(pathlib.Path("/usr/bin/etcd"), member, members, "token-1")
                for member in members]
    initial = {command[command.index("--initial-cluster") + 1] for command in commands}
    assert len(initial) == 1 and initial.pop().count("http://127.0.0.1:") == 3
    ports = {member.client_port for member in members} | {member.peer_port for member in members}
    assert len(ports) == 6
    for command in commands:
        assert "--unsafe-no-fsync" not in command
        assert command[command.index("--initial-cluster-state") + 1] == "new"


def test_members_launched_before_one_that_fails_are_stopped(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The third member's launch fails (a missing binary, no descriptors): the two started
    before it must not run on through the other systems' rounds."""
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen(command: list[str], **options: object) -> subprocess.Popen[bytes]:
        if len(started) == 2:
            raise OSError("no third member")
        started.append(real_popen(["sleep", "60"], **options))  # type: ignore[call-overload]
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(OSError, match="no third member"):
        etcd.EtcdSystem(binary=tmp_path / "etcd").start(tmp_path / "cluster")
    assert len(started) == 2 and all(process.poll() is not None for process in started)
