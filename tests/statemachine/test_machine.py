"""The bytes protocol consensus drives: envelopes in, replies out, exactly-once sessions,
queries, and no client input that can make `apply` raise or change state when refused."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.codec import encode_envelope, pack, unpack
from consensus.envelope import Envelope, Principal, Role
from consensus.runtime.client_codec import Code as ClientCode
from consensus.runtime.client_codec import Response, encode_response
from consensus.runtime.node_config import LIMIT_DEFAULTS, LIMIT_MINIMUMS
from consensus.state_machine import StateMachine
from statemachine import Machine, limits, sessions
from statemachine.codec import encode_command
from statemachine.commands import (
    ApplyConfig,
    Command,
    Cordon,
    RegisterNode,
    ReleaseGroup,
    Tick,
)
from statemachine.effects import EffectKind
from statemachine.errors import Code, Rejection
from statemachine.lifecycle import pod_env
from statemachine.limits import SESSION_TTL_MS_MIN
from statemachine.query_codec import encode_query
from statemachine.result_codec import decode_result
from statemachine.results import GroupPhase, GroupStatus, Result
from statemachine.sessions import NO_CHECKSUM
from statemachine.snapshot_codec import encode_snapshot
from statemachine.spec import PolicySpec
from statemachine.store import EFFECTS_PER_WATCH
from tests.statemachine.builders import ADMIN, SCHEDULER, SYSTEM, gang, inventory, rack_spec

TTL_MS = SESSION_TTL_MS_MIN


def envelope(command: Command | bytes, principal: Principal, *, session: str = "s",
             sequence: int = 0, now_ms: int = 1_000) -> bytes:
    body = command if isinstance(command, bytes) else encode_command(command)
    return encode_envelope(Envelope(principal=principal, session=session, sequence=sequence,
                                    now_ms=now_ms, body=body))


def run(machine: Machine, command: Command | bytes, principal: Principal, **fields: Any
        ) -> Result:
    return decode_result(machine.apply(envelope(command, principal, **fields)))


def ready_machine() -> Machine:
    machine = Machine()
    policy = PolicySpec(session_ttl_ms=TTL_MS)
    run(machine, ApplyConfig(expected_version=0, spec=rack_spec(policy=policy)), ADMIN)
    for node in ("n0", "n1"):
        run(machine, RegisterNode(node=node, boot_id="b", gpus=inventory(node)),
            Principal(Role.NODE, node))
    return machine


def state_bytes(machine: Machine) -> bytes:
    """The replicated state without the applied index (which every log entry advances)."""
    return encode_snapshot(machine.state, machine.sessions, 0)


def test_machine_satisfies_the_consensus_protocol() -> None:
    machine: StateMachine = Machine()
    assert isinstance(machine.digest(), bytes) and len(machine.digest()) == 32


def test_a_retried_sequence_gets_the_cached_reply_and_changes_nothing() -> None:
    machine = ready_machine()
    first = machine.apply(envelope(gang("g", "a", 0, (1, 4)), SCHEDULER, sequence=1))
    before = state_bytes(machine)
    again = machine.apply(envelope(gang("g", "a", 0, (1, 4)), SCHEDULER, sequence=1,
                                   now_ms=5_000))
    assert again == first
    assert state_bytes(machine) == before
    reply = decode_result(first)
    assert isinstance(reply, GroupStatus) and reply.phase is GroupPhase.ALLOCATED


def test_an_older_sequence_is_stale_and_sessions_belong_to_their_principal() -> None:
    machine = ready_machine()
    run(machine, gang("g1", "a", 0, (1, 1)), SCHEDULER, sequence=5)
    stale = run(machine, gang("g0", "a", 0, (1, 1)), SCHEDULER, sequence=4)
    assert isinstance(stale, Rejection) and stale.code is Code.STALE_SEQUENCE
    assert "g0" not in machine.state.groups
    other = run(machine, gang("g2", "a", 0, (1, 1)), Principal(Role.SCHEDULER, "other"),
                sequence=5)
    assert isinstance(other, GroupStatus) and other.group == "g2"


def test_rejections_are_cached_too() -> None:
    machine = ready_machine()
    first = run(machine, Tick(), SCHEDULER, sequence=1)
    assert isinstance(first, Rejection) and first.code is Code.UNAUTHORIZED
    assert run(machine, Tick(), SCHEDULER, sequence=1) == first


def test_idle_sessions_expire_on_tick() -> None:
    machine = ready_machine()
    run(machine, gang("g", "a", 0, (1, 1)), SCHEDULER, sequence=1, now_ms=2_000)
    assert len(machine.sessions.table) == 1
    run(machine, Tick(), SYSTEM, now_ms=2_000 + TTL_MS)
    assert len(machine.sessions.table) == 1
    run(machine, Tick(), SYSTEM, now_ms=2_001 + TTL_MS)
    assert machine.sessions.table == {}
    fresh = run(machine, gang("g", "a", 0, (1, 1)), SCHEDULER, sequence=1,
                now_ms=2_002 + TTL_MS)
    assert isinstance(fresh, GroupStatus), "after expiry the old sequence applies anew"


def test_a_late_copy_of_a_command_whose_session_expired_is_not_applied_again() -> None:
    """The copy was stamped when first proposed; by the time its session is forgotten that
    stamp is older than half the shortest session lifetime, so it cannot open the session
    again."""
    machine = ready_machine()
    submit = envelope(gang("job", "a", 0, (1, 8)), SCHEDULER, session="c1", sequence=1,
                      now_ms=2_000)
    assert isinstance(decode_result(machine.apply(submit)), GroupStatus)
    run(machine, ReleaseGroup(group="job", reason="done"), SCHEDULER, session="c1",
        sequence=2, now_ms=3_000)
    run(machine, Tick(), SYSTEM, now_ms=3_001 + TTL_MS)  # c1 idles out
    assert machine.sessions.table == {}
    late = decode_result(machine.apply(submit))
    assert isinstance(late, Rejection) and late.code is Code.SESSION_TOO_OLD
    assert "job" not in machine.state.groups


def test_a_raised_session_lifetime_does_not_let_a_late_copy_run_again() -> None:
    """A session recorded under a 120 s lifetime keeps that expiry when a configuration raises
    the lifetime to 600 s; the stamp window must not grow with it (half of 600 s let a copy
    stamped 45 s after the command through, 80 s after its session was forgotten)."""
    machine = ready_machine()
    copy = envelope(gang("job", "a", 0, (1, 8)), SCHEDULER, session="c1", sequence=1,
                    now_ms=2_000)
    assert isinstance(decode_result(machine.apply(copy)), GroupStatus)
    run(machine, ReleaseGroup(group="job", reason="done"), SCHEDULER, session="c1",
        sequence=2, now_ms=3_000)
    assert machine.sessions.table[f"{SCHEDULER.text}/c1"].expires_ms == 3_000 + TTL_MS
    raised = PolicySpec(session_ttl_ms=5 * TTL_MS)
    run(machine, ApplyConfig(expected_version=1, spec=rack_spec(policy=raised)), ADMIN)
    assert machine.state.policy.session_ttl_ms == 5 * TTL_MS
    run(machine, Tick(), SYSTEM, now_ms=3_001 + TTL_MS)  # c1 idles out, under its own lifetime
    assert machine.sessions.table == {}
    late = envelope(gang("job", "a", 0, (1, 8)), SCHEDULER, session="c1", sequence=1,
                    now_ms=2_000 + 45_000)  # a copy stamped as late as the client retries
    refused = decode_result(machine.apply(late))
    assert isinstance(refused, Rejection) and refused.code is Code.SESSION_TOO_OLD
    assert "job" not in machine.state.groups
    fresh = run(machine, gang("job", "a", 0, (1, 8)), SCHEDULER, session="c2", sequence=1,
                now_ms=3_002 + TTL_MS)
    assert isinstance(fresh, GroupStatus), "a command stamped now still opens a session"
    kept = machine.sessions.table[f"{SCHEDULER.text}/c2"]
    assert kept.expires_ms == 3_002 + TTL_MS + 5 * TTL_MS, "new sessions get the new lifetime"


def test_a_full_session_table_refuses_new_sessions_and_keeps_the_live_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions, "SESSIONS_MAX", 2)
    machine = ready_machine()
    for name in ("c1", "c2"):
        run(machine, gang(name, "a", 0, (1, 1)), SCHEDULER, session=name, sequence=1)
    refused = run(machine, gang("c3", "a", 0, (1, 1)), SCHEDULER, session="c3", sequence=1)
    assert isinstance(refused, Rejection) and refused.code is Code.SESSIONS_FULL
    assert "c3" not in machine.state.groups
    retried = run(machine, gang("c1", "a", 0, (1, 1)), SCHEDULER, session="c1", sequence=1)
    assert isinstance(retried, GroupStatus)  # c1's session, and its reply, were kept
    later = run(machine, gang("c3", "a", 0, (1, 1)), SCHEDULER, session="c3", sequence=1,
                now_ms=2 * TTL_MS)  # past the others' expiry: they make room
    assert isinstance(later, GroupStatus)


def test_one_principal_cannot_take_the_whole_session_table(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node agent opening session after session (valid commands or not) filled the table,
    and every other client's new session was refused, an administrator's included."""
    monkeypatch.setattr(sessions, "SESSIONS_MAX", 4)
    monkeypatch.setattr(sessions, "SESSIONS_PER_PRINCIPAL_MAX", 2)
    machine = ready_machine()
    node = Principal(Role.NODE, "n0")
    verdicts = [run(machine, Tick(), node, session=name, sequence=1) for name in "abcd"]
    assert [isinstance(verdict, Rejection) and verdict.code is Code.SESSIONS_FULL
            for verdict in verdicts] == [False, False, True, True]
    cordoned = run(machine, Cordon(node="n1"), ADMIN, session="ops", sequence=1)
    assert not isinstance(cordoned, Rejection) and machine.state.nodes["n1"].cordoned
    later = run(machine, Tick(), node, session="c", sequence=1, now_ms=2 * TTL_MS)
    assert not (isinstance(later, Rejection) and later.code is Code.SESSIONS_FULL), \
        "its own sessions expired: it may open new ones"


def test_bad_envelopes_and_bodies_are_rejections() -> None:
    machine = ready_machine()
    before = state_bytes(machine)
    garbage = decode_result(machine.apply(b"\x93\x01\x02"))
    assert isinstance(garbage, Rejection) and garbage.code is Code.MALFORMED
    unknown = run(machine, pack({"v": 1, "type": "format_disk"}), ADMIN, sequence=1)
    assert isinstance(unknown, Rejection) and unknown.code is Code.UNKNOWN_COMMAND
    assert state_bytes(machine) != before, "the session recorded its reply"
    assert machine.state.groups == {}


@settings(max_examples=60)
@given(st.binary(max_size=300), st.sampled_from([ADMIN, SCHEDULER, SYSTEM]),
       st.integers(0, 3))
def test_no_body_makes_apply_raise_or_change_the_state(body: bytes, principal: Principal,
                                                       sequence: int) -> None:
    machine = ready_machine()
    before = encode_snapshot(machine.state, machine.sessions, 0)
    reply = decode_result(machine.apply(envelope(body, principal, session="fuzz",
                                                 sequence=sequence)))
    assert isinstance(reply, Rejection)
    machine.sessions.table.pop(f"{principal}/fuzz", None)
    assert encode_snapshot(machine.state, machine.sessions, 0) == before


@settings(max_examples=60)
@given(st.binary(max_size=200))
def test_no_envelope_makes_apply_raise(data: bytes) -> None:
    machine = Machine()
    reply = decode_result(machine.apply(data))
    assert isinstance(reply, Rejection) and reply.code is Code.MALFORMED
    assert machine.state.groups == {} and machine.applied_index == 1


def query(machine: Machine, kind: str, **fields: Any) -> dict[str, Any]:
    answer: dict[str, Any] = unpack(machine.query(encode_query(kind, **fields)),
                                    bytes_max=1 << 24, what="answer")
    return answer


def test_queries() -> None:
    machine = ready_machine()
    run(machine, gang("g", "a", 0, (1, 2)), SCHEDULER)
    run(machine, gang("h", "b", -1, (2, 8)), SCHEDULER)
    group = query(machine, "group", group="g")
    assert group["ok"] and group["phase"] == "allocated" and group["doomed"] == {}
    pending = query(machine, "groups", vc="", phase="pending", after="", limit=10)
    assert [item["group"] for item in pending["groups"]] == ["h"]
    assert "A100-RACK: 14 free GPUs" in pending["groups"][0]["why_pending"]
    nodes = query(machine, "nodes", after="n0", limit=10)["nodes"]
    assert [node["node"] for node in nodes] == ["n1", "n2", "n3", "n4", "n5"]
    node = query(machine, "node", node="n0")
    assert [gpu["holder"] for gpu in node["gpus"]][:3] == ["g", "g", ""]
    cluster = query(machine, "cluster")
    assert cluster["chains"][0]["free_gpus"] == 14
    effects = query(machine, "effects", after=0, node="", limit=5)
    assert [effect["kind"] for effect in effects["effects"]] == ["gang_allocated"]
    stats = query(machine, "stats")
    assert stats["groups"] == {"pending": 1, "preempting": 0, "allocated": 1}
    missing = query(machine, "group", group="zz")
    assert missing == {"ok": False, "code": "unknown_group", "message": "no gang 'zz'"}
    bad = query(machine, "nodes", after="", limit=0)
    assert bad["ok"] is False and bad["code"] == "malformed"


def test_a_page_of_valid_effects_fits_the_connection_frame_cap() -> None:
    """Start effects of valid bindings at the limits' maxima (64 GPUs with the longest UUIDs,
    listed again in the environment, the longest argv): a page of EFFECTS_PER_WATCH of them
    would be over 9 MB, past the least frame cap, and asked again for ever. The page is cut
    by bytes, says so, and the pages that follow hold the rest."""
    machine = Machine()
    uuids = tuple(f"GPU-{index:02d}-".ljust(limits.UUID_LENGTH_MAX, "0")
                  for index in range(limits.GPUS_PER_NODE_MAX))
    argv = ("/bin/train", "x" * (limits.POD_COMMAND_BYTES_MAX - len("/bin/train")))
    for number in range(EFFECTS_PER_WATCH):
        machine.state.outbox.emit(EffectKind.START_POD, node="n0", group=f"gang-{number:05d}",
                                  pod_uid=f"pod-{number:05d}", gpu_uuids=uuids,
                                  env=pod_env(uuids), command=argv)
    cap_bytes = min(LIMIT_DEFAULTS["frame_bytes_max"], LIMIT_MINIMUMS["frame_bytes_max"])
    after, pages = 0, []
    while after < EFFECTS_PER_WATCH:
        answer = machine.query(encode_query("effects", after=after, node="n0",
                                            limit=EFFECTS_PER_WATCH))
        assert len(encode_response(Response(1, ClientCode.OK, answer, 1))) <= cap_bytes
        page = unpack(answer, bytes_max=1 << 24, what="answer")
        pages.append(page)
        after = page["effects"][-1]["index"]
    assert len(pages) > 1 and all(page["more"] for page in pages[:-1])
    assert not pages[-1]["more"]
    assert [effect["index"] for page in pages for effect in page["effects"]] == \
        list(range(1, EFFECTS_PER_WATCH + 1))


def test_a_late_copy_of_a_session_forgotten_by_a_refused_command_is_too_old(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused command (the table full) expired sessions by its stamp while the machine's
    clock stayed behind (a refusal rolls its changes back): a late copy of the forgotten
    session's command was judged fresh by that clock, and opened the session again."""
    monkeypatch.setattr(sessions, "SESSIONS_PER_PRINCIPAL_MAX", 1)
    machine = ready_machine()
    first = envelope(gang("g1", "a", 0, (1, 1)), SCHEDULER, session="s1", sequence=1)
    assert isinstance(decode_result(machine.apply(first)), GroupStatus)
    run(machine, gang("g2", "a", 0, (1, 1)), ADMIN, session="s2", sequence=1,
        now_ms=TTL_MS // 2)
    refused = run(machine, gang("g3", "a", 0, (1, 1)), ADMIN, session="s3", sequence=1,
                  now_ms=TTL_MS + 2_000)  # s1 expires; the admin's share is still full
    assert isinstance(refused, Rejection) and refused.code is Code.SESSIONS_FULL
    late = decode_result(machine.apply(first))
    assert isinstance(late, Rejection) and late.code is Code.SESSION_TOO_OLD


def test_another_command_under_the_last_sequence_is_refused_not_told_the_cached_reply() -> None:
    machine = ready_machine()
    first = run(machine, gang("g1", "a", 0, (1, 1)), SCHEDULER, session="s", sequence=1)
    assert isinstance(first, GroupStatus)
    reused = run(machine, gang("g2", "a", 0, (1, 1)), SCHEDULER, session="s", sequence=1)
    assert isinstance(reused, Rejection) and reused.code is Code.SEQUENCE_REUSED
    assert "g2" not in machine.state.groups
    again = run(machine, gang("g1", "a", 0, (1, 1)), SCHEDULER, session="s", sequence=1)
    assert again == first


def test_a_format_3_snapshot_loads_its_sessions_without_checksums() -> None:
    """Sessions of a snapshot written before format 4 load with no checksum: a retry of their
    last sequence gets the cached reply, whatever its body, as it did then."""
    machine = ready_machine()
    first = run(machine, gang("g1", "a", 0, (1, 1)), SCHEDULER, session="s", sequence=1)
    raw = unpack(machine.snapshot(), bytes_max=1 << 30, what="snapshot")
    raw[1] = 3
    raw[12] = [row[:4] for row in raw[12]]
    del raw[13:]  # where the next Tick's pass starts, the last Tick's stamp: none before 5
    for fields in raw[10]:
        del fields[21:]  # a gang's pod failure policy: none before 6
    restored = Machine()
    restored.restore(pack(raw))
    assert all(session.checksum == NO_CHECKSUM for session in restored.sessions.table.values())
    again = run(restored, gang("g2", "a", 0, (1, 1)), SCHEDULER, session="s", sequence=1)
    assert again == first


HOUR_MS = 3_600_000


def test_a_command_stamped_far_ahead_moves_time_only_a_little_past_the_latest_tick() -> None:
    """A replica whose clock is an hour ahead stamps a command it serves: logical time, the
    clock its session's expiry is counted from, moves at most `STAMP_LEAD_MS_MAX` past the
    latest Tick, which alone moves it freely. Its stamp still tells its session it is fresh."""
    machine = ready_machine()
    run(machine, Tick(), SYSTEM, now_ms=2_000)
    ahead = run(machine, gang("g", "a", 0, (1, 1)), SCHEDULER, sequence=1,
                now_ms=2_000 + HOUR_MS)
    assert isinstance(ahead, GroupStatus)
    assert machine.state.now_ms == 2_000 + limits.STAMP_LEAD_MS_MAX
    expires_ms = machine.sessions.table[f"{SCHEDULER.text}/s"].expires_ms
    assert expires_ms == 2_000 + limits.STAMP_LEAD_MS_MAX + TTL_MS
    run(machine, Tick(), SYSTEM, now_ms=3_000 + HOUR_MS)  # the sequencer's clock is ahead
    assert machine.state.now_ms == 3_000 + HOUR_MS


def test_before_the_first_tick_stamps_move_time_as_they_come() -> None:
    """Nothing is known of the sequencer's clock yet: a fresh cluster's first commands are
    not held back (and their sessions not judged by a clock the first Tick overtakes)."""
    machine = ready_machine()
    run(machine, Cordon(node="n1"), ADMIN, now_ms=2_000 + HOUR_MS)
    assert machine.state.now_ms == 2_000 + HOUR_MS
    assert machine.state.tick_ms is None


def test_the_latest_tick_is_in_the_snapshot_and_absent_from_a_format_4_one() -> None:
    machine = ready_machine()
    run(machine, Tick(), SYSTEM, now_ms=2_000)
    snapshot = machine.snapshot()
    restored = Machine()
    restored.restore(snapshot)
    assert restored.state.tick_ms == 2_000
    assert restored.snapshot() == snapshot
    raw = unpack(snapshot, bytes_max=1 << 30, what="snapshot")
    raw[1] = 4
    del raw[13:]
    old = Machine()
    old.restore(pack(raw))
    assert old.state.tick_ms is None, "unknown: stamps move time freely until the next Tick"
    run(old, Cordon(node="n1"), ADMIN, now_ms=2_000 + HOUR_MS)
    assert old.state.now_ms == 2_000 + HOUR_MS
