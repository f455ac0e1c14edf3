"""The session table is bounded by the bytes of its cached replies as well as by its count.

By count alone it was not enough: a reply can be large (a node agent's registration lists its
pods with their whole argv, up to POD_COMMAND_BYTES_MAX each), and SESSIONS_MAX sessions each
caching one is many times the snapshot a replica can write (SNAPSHOT_STATE_BYTES_MAX): from
then on the log is never compacted again, and a lagging replica can never be sent a snapshot.
One agent that re-registers in a new session each time (8,192 sessions are its share) was
enough. Past the bound the replies of the sessions that expire first are dropped; a retry of a
dropped reply's sequence is told SESSION_EXPIRED, never applied again."""

from __future__ import annotations

from typing import Any

import pytest

from consensus.codec import encode_envelope
from consensus.envelope import (
    PRINCIPAL_NAME_LENGTH_MAX,
    SESSION_LENGTH_MAX,
    Envelope,
    Principal,
    Role,
)
from consensus.runtime.driver import SNAPSHOT_STATE_BYTES_MAX
from statemachine import Machine, limits, sessions
from statemachine.codec import encode_command
from statemachine.commands import ApplyConfig, BindPod, Command, RegisterNode
from statemachine.errors import Code, Rejection
from statemachine.lifecycle import pod_env
from statemachine.result_codec import decode_result, encode_result
from statemachine.results import NodeRegistered, PodAssignment, PodBound, Result
from statemachine.sessions import Sessions
from statemachine.snapshot_codec import encode_snapshot
from tests.statemachine.builders import ADMIN, SCHEDULER, gang, inventory, rack_spec

GPUS_PER_NODE = 8  # an ordinary node: the bound must hold for it, let alone a 64-GPU one
LONGEST_ARGV = ("x" * (limits.POD_COMMAND_BYTES_MAX - 255),) + ("y",) * 255
# A session's row in the snapshot beside its reply: the longest key, three ints, the framing.
SESSION_ROW_BYTES_MAX = len("scheduler:") + PRINCIPAL_NAME_LENGTH_MAX + 1 + SESSION_LENGTH_MAX \
    + 64


def largest_registration() -> bytes:
    """The reply to an 8-GPU node's registration: one pod per GPU, each with the longest
    argv and its GPU's (ordinary, 40-character) UUID."""
    pods = tuple(PodAssignment(group="g" * 128, pod_uid=f"{index:0128d}",
                               gpu_uuids=(uuid,), env=pod_env((uuid,)), command=LONGEST_ARGV)
                 for index in range(GPUS_PER_NODE)
                 for uuid in (f"GPU-{index:08x}-0000-0000-0000-000000000000",))
    return encode_result(NodeRegistered(node="n" * 128, incarnation=1, pods=pods))


def test_a_full_session_table_fits_a_snapshot_beside_a_full_outbox() -> None:
    """The arithmetic, at the real limits: one agent's share of sessions alone (8,192 of
    some 137 KB) was over the snapshot cap, the whole table some 9 GB."""
    reply = len(largest_registration())
    unbounded = limits.SESSIONS_MAX * (reply + SESSION_ROW_BYTES_MAX)
    bounded = min(unbounded, getattr(limits, "SESSION_REPLIES_BYTES_MAX", 1 << 62)
                  + limits.SESSIONS_MAX * SESSION_ROW_BYTES_MAX)
    assert bounded + limits.OUTBOX_RETAINED_BYTES_MAX <= SNAPSHOT_STATE_BYTES_MAX, (
        f"{limits.SESSIONS_MAX} sessions caching a {reply}-byte reply: {unbounded} bytes, "
        f"the snapshot may hold {SNAPSHOT_STATE_BYTES_MAX} in all")


def envelope(command: Command, principal: Principal, session: str, sequence: int,
             now_ms: int) -> bytes:
    return encode_envelope(Envelope(principal=principal, session=session, sequence=sequence,
                                    now_ms=now_ms, body=encode_command(command)))


def run(machine: Machine, command: Command, principal: Principal, **fields: Any) -> Result:
    return decode_result(machine.apply(envelope(command, principal, **fields)))


def bound_pods(machine: Machine) -> str:
    """Configure, register two nodes and bind a gang of 8 one-GPU pods with the longest argv;
    the node they run on."""
    run(machine, ApplyConfig(expected_version=0, spec=rack_spec()), ADMIN, session="ops",
        sequence=1, now_ms=1_000)
    for node in ("n0", "n1"):
        run(machine, RegisterNode(node=node, boot_id="b", gpus=inventory(node)),
            Principal(Role.NODE, node), session="boot", sequence=1, now_ms=1_000)
    run(machine, gang("g", "a", 0, (GPUS_PER_NODE, 1)), SCHEDULER, session="s", sequence=1,
        now_ms=1_000)
    nodes = set()
    for index in range(GPUS_PER_NODE):
        bound = run(machine, BindPod(group="g", member=0, pod_uid=f"p{index}",
                                     command=LONGEST_ARGV),
                    SCHEDULER, session="s", sequence=2 + index, now_ms=1_000)
        assert isinstance(bound, PodBound), bound
        nodes.add(bound.node)
    assert len(nodes) == 1
    return nodes.pop()


def reply_bytes(machine: Machine) -> int:
    return sum(len(session.reply) for session in machine.sessions.table.values())


def test_cached_replies_stay_within_their_byte_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Behaviourally, on a small scale: an agent re-registering in session after session (each
    reply some 140 KB) keeps the cached replies under the bound; the snapshot with them."""
    bound = 1 << 20
    monkeypatch.setattr(sessions, "SESSION_REPLIES_BYTES_MAX", bound, raising=False)
    machine = Machine()
    node = bound_pods(machine)
    agent = Principal(Role.NODE, node)
    register = RegisterNode(node=node, boot_id="b", gpus=inventory(node))
    base = len(encode_snapshot(machine.state, Sessions(), 0))
    replies = []
    for index in range(16):
        replies.append(machine.apply(envelope(register, agent, f"r{index}", 1, 2_000 + index)))
        assert len(replies[-1]) > bound // 8
        assert reply_bytes(machine) <= bound
    assert machine.sessions.reply_bytes == reply_bytes(machine)
    rows = len(machine.sessions.table) * SESSION_ROW_BYTES_MAX
    assert len(machine.snapshot()) <= base + bound + rows


def test_a_retry_of_a_dropped_reply_is_told_the_session_expired_not_applied_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions, "SESSION_REPLIES_BYTES_MAX", 1 << 20, raising=False)
    machine = Machine()
    node = bound_pods(machine)
    agent = Principal(Role.NODE, node)
    register = RegisterNode(node=node, boot_id="b", gpus=inventory(node))
    replies = [machine.apply(envelope(register, agent, f"r{index}", 1, 2_000 + index))
               for index in range(16)]
    restored = Machine()
    restored.restore(machine.snapshot())
    for copy in (machine, restored):  # the replies dropped follow from the snapshot alone
        state = encode_snapshot(copy.state, copy.sessions, 0)
        first = decode_result(copy.apply(envelope(register, agent, "r0", 1, 3_000)))
        assert isinstance(first, Rejection) and first.code is Code.SESSION_EXPIRED, first
        assert encode_snapshot(copy.state, copy.sessions, 0) == state, "applied again"
        assert copy.apply(envelope(register, agent, "r15", 1, 3_000)) == replies[-1]
        again = run(copy, register, agent, session="r0", sequence=2, now_ms=3_000)
        assert isinstance(again, NodeRegistered), "a new sequence of the session applies"
        copy.apply(envelope(register, agent, "r16", 1, 3_001))
    assert machine.digest() == restored.digest()
