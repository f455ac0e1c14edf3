"""The key-value machine behind `machine = "kv"`: against a plain dict, exactly once, with
canonical snapshots, and malformed input answered rather than raised."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cellar.kv import machine as kv_machine
from cellar.kv.codec import (
    ITEM_OVERHEAD_BYTES,
    KEY_BYTES_MAX,
    OK_REPLY,
    VALUE_BYTES_MAX,
    Code,
    _checked_request,
    decode_reply,
    decode_request,
    decode_snapshot,
    encode_get,
    encode_put,
    encode_reply,
)
from cellar.kv.machine import SESSION_TTL_MS, KvMachine
from consensus.codec import encode_envelope, pack
from consensus.envelope import Envelope, Principal, Role
from statemachine import sessions
from statemachine.limits import SESSIONS_PER_PRINCIPAL_MAX
from tests.decoding import one_field_changed, outcome

CLIENT = Principal(Role.ADMIN, "bench")
keys = st.binary(min_size=0, max_size=8)
values = st.binary(min_size=0, max_size=64)
# (session index, key, value): each command is a put in one of three sessions
commands = st.lists(st.tuples(st.integers(0, 2), keys, values), max_size=60)


def envelope(session: str, sequence: int, body: bytes, principal: Principal = CLIENT,
             now_ms: int = 1000) -> bytes:
    return encode_envelope(Envelope(principal=principal, session=session, sequence=sequence,
                                    now_ms=now_ms, body=body))


def get(machine: KvMachine, key: bytes) -> bytes | None:
    code, value = decode_reply(machine.query(encode_get(key)))
    assert code is Code.OK
    return value


@given(commands)
def test_puts_match_a_dict_and_retries_change_nothing(script: list[tuple[int, bytes, bytes]]
                                                      ) -> None:
    machine, reference = KvMachine(), {}
    sequences = [0, 0, 0]
    for session, key, value in script:
        sequences[session] += 1
        command = envelope(f"s{session}", sequences[session], encode_put(key, value))
        assert decode_reply(machine.apply(command)) == (Code.OK, None)
        assert machine.apply(command) == machine.apply(command)  # a retry: the cached reply
        reference[key] = value
    assert machine.data == reference
    for key, value in reference.items():
        assert get(machine, key) == value
    assert get(machine, b"never written" * 3) is None


@given(commands)
def test_snapshots_restore_the_same_state_and_are_canonical(
        script: list[tuple[int, bytes, bytes]]) -> None:
    machine = KvMachine()
    for sequence, (session, key, value) in enumerate(script, start=1):
        machine.apply(envelope(f"s{session}", sequence, encode_put(key, value)))
    copy = KvMachine()
    copy.restore(machine.snapshot())
    assert copy.data == machine.data and copy.digest() == machine.digest()
    assert copy.snapshot() == machine.snapshot()


def test_a_stale_sequence_is_refused_and_its_put_not_applied() -> None:
    machine = KvMachine()
    machine.apply(envelope("s", 2, encode_put(b"k", b"new")))
    code, _ = decode_reply(machine.apply(envelope("s", 1, encode_put(b"k", b"old"))))
    assert code is Code.STALE_SEQUENCE and get(machine, b"k") == b"new"


def test_a_put_stamped_too_long_ago_cannot_open_a_session() -> None:
    """The kv machine has no Ticks: its clock is the latest stamp applied, kept in the
    snapshot, and a full table forgets only expired sessions (statemachine/sessions.py)."""
    machine = KvMachine()
    machine.apply(envelope("s", 1, encode_put(b"k", b"now"), now_ms=SESSION_TTL_MS))
    late = envelope("t", 1, encode_put(b"k", b"late"), now_ms=SESSION_TTL_MS // 2 - 1)
    code, _ = decode_reply(machine.apply(late))
    assert code is Code.SESSION_TOO_OLD and get(machine, b"k") == b"now"
    copy = KvMachine()
    copy.restore(machine.snapshot())
    assert copy.now_ms == machine.now_ms == SESSION_TTL_MS
    assert copy.apply(late) == machine.apply(late)


def test_sessions_belong_to_their_principal() -> None:
    machine = KvMachine()
    other = Principal(Role.ADMIN, "someone-else")
    machine.apply(envelope("s", 1, encode_put(b"k", b"mine")))
    machine.apply(envelope("s", 1, encode_put(b"k", b"theirs"), principal=other))
    assert get(machine, b"k") == b"theirs"  # not mistaken for a retry of the first


@given(st.binary(max_size=64))
def test_malformed_commands_are_answered_bad_request(garbage: bytes) -> None:
    machine = KvMachine()
    assert decode_reply(machine.apply(garbage))[0] is Code.BAD_REQUEST
    assert decode_reply(machine.apply(envelope("s", 1, garbage)))[0] in (Code.BAD_REQUEST,
                                                                        Code.OK)
    assert decode_reply(machine.query(garbage))[0] is Code.BAD_REQUEST


def test_oversized_keys_and_wrong_operations_are_refused() -> None:
    machine = KvMachine()
    too_long = pack([1, b"k" * 2000, b"v"])
    assert decode_reply(machine.apply(envelope("s", 1, too_long)))[0] is Code.BAD_REQUEST
    assert decode_reply(machine.apply(envelope("s", 2, encode_get(b"k"))))[0] \
        is Code.BAD_REQUEST  # a get is a query, never a command
    assert decode_reply(machine.query(encode_put(b"k", b"v")))[0] is Code.BAD_REQUEST
    assert decode_request(encode_put(b"k", b"v"))[1:] == (b"k", b"v")


# Fields of every kind a request could carry, valid or not, at the size limits' edges.
request_fields = st.one_of(
    st.integers(-2, 3), st.booleans(), st.none(), st.text(max_size=4),
    st.binary(max_size=4), st.binary(min_size=KEY_BYTES_MAX, max_size=KEY_BYTES_MAX + 1),
    st.binary(min_size=VALUE_BYTES_MAX, max_size=VALUE_BYTES_MAX + 1))


@given(st.one_of(
    st.lists(request_fields, max_size=4),
    st.tuples(st.sampled_from([1, 2, True, 1.0]), request_fields, request_fields).map(list),
    one_field_changed([1, b"k", b"v"], request_fields)))
@example([1, b"k" * (KEY_BYTES_MAX + 1), b"v"])
@example([1, b"k", b"v" * (VALUE_BYTES_MAX + 1)])
@example([True, b"k", b"v"])
def test_the_inline_put_path_decides_as_the_checked_one(raw: list[object]) -> None:
    """decode_request recognises a valid put inline: whatever it returns or refuses, the full
    checks (which name the fault) return or refuse the same."""
    assert outcome(lambda: decode_request(pack(raw))) == outcome(lambda: _checked_request(raw))



@given(st.sampled_from(list(Code)), st.none() | st.binary(max_size=8))
def test_replies_round_trip_the_constant_ok_included(code: Code, value: bytes | None) -> None:
    assert decode_reply(encode_reply(code, value)) == (code, value)
    assert (encode_reply(code, value) == OK_REPLY) == (code is Code.OK and value is None)


def test_puts_past_the_store_s_bound_are_refused_and_the_refusal_is_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys, values and each item's framing count; overwriting with less frees room; a
    refused put's retry gets the same refusal, as any reply; a restored snapshot counts what
    it holds."""
    item = ITEM_OVERHEAD_BYTES
    monkeypatch.setattr(kv_machine, "DATA_BYTES_MAX", 20 + 2 * item)
    machine = KvMachine()
    assert decode_reply(machine.apply(envelope("s", 1, encode_put(b"k1", b"x" * 10))))[0] \
        is Code.OK  # 12 bytes and an item held
    full = envelope("s", 2, encode_put(b"k2", b"y" * 10))
    assert decode_reply(machine.apply(full))[0] is Code.STORE_FULL  # 24 would be past 20
    assert decode_reply(machine.apply(full))[0] is Code.STORE_FULL  # its retry: the same
    assert get(machine, b"k2") is None
    assert decode_reply(machine.apply(envelope("s", 3, encode_put(b"k1", b"x"))))[0] is Code.OK
    assert decode_reply(machine.apply(envelope("s", 4, encode_put(b"k2", b"y" * 10))))[0] \
        is Code.OK  # 3 + 12 = 15 bytes
    restored = KvMachine()
    restored.restore(machine.snapshot())
    assert restored.data_bytes == machine.data_bytes == 15 + 2 * item
    assert decode_reply(restored.apply(envelope("t", 1, encode_put(b"k3", b""))))[0] \
        is Code.STORE_FULL  # a third item's framing does not fit


def test_keys_past_what_a_snapshot_may_list_are_refused(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setattr(kv_machine, "KEYS_MAX", 2)
    machine = KvMachine()
    codes = [decode_reply(machine.apply(envelope("s", sequence, encode_put(key, b""))))[0]
             for sequence, key in enumerate((b"a", b"b", b"c", b"a"), 1)]
    assert codes == [Code.OK, Code.OK, Code.STORE_FULL, Code.OK]  # an overwrite still fits


def test_a_late_copy_of_a_session_forgotten_by_a_refused_command_is_too_old() -> None:
    """A refused command (the table full) expired sessions by its stamp, but the machine's
    clock stayed behind (it moved only with applied commands): a late copy of the forgotten
    session's last command was then judged fresh by that clock, opened the session again and
    ran twice, undoing a later put."""
    other = Principal(Role.SCHEDULER, "other")
    machine = KvMachine()
    first = envelope("s", 1, encode_put(b"k", b"a"), now_ms=1_000)
    assert decode_reply(machine.apply(first)) == (Code.OK, None)
    share = SESSIONS_PER_PRINCIPAL_MAX
    for index in range(share):
        body = encode_put(b"k", b"b") if index == 0 else encode_put(b"x", b"")
        assert decode_reply(machine.apply(envelope(f"o{index}", 1, body, other,
                                                   now_ms=2_000))) == (Code.OK, None)
    refused = envelope("more", 1, encode_put(b"y", b""), other, now_ms=SESSION_TTL_MS + 1_500)
    assert decode_reply(machine.apply(refused)) == (Code.SESSIONS_FULL, None)
    assert f"{CLIENT.text}/s" not in machine.sessions.table  # forgotten by that expiry
    assert decode_reply(machine.apply(first))[0] is Code.SESSION_TOO_OLD
    assert get(machine, b"k") == b"b"


def test_another_command_under_the_last_sequence_is_refused_not_told_the_cached_ok() -> None:
    """(session, sequence) names one command: put(k, b) under the sequence of put(k, a) was
    answered put(k, a)'s cached OK, success for a put that never ran."""
    machine = KvMachine()
    assert decode_reply(machine.apply(envelope("s", 1, encode_put(b"k", b"a")))) == (Code.OK,
                                                                                      None)
    reused = machine.apply(envelope("s", 1, encode_put(b"k", b"b"), now_ms=1_500))
    assert decode_reply(reused) == (Code.SEQUENCE_REUSED, None)
    assert decode_reply(machine.apply(envelope("s", 1, encode_put(b"k", b"a")))) == (Code.OK,
                                                                                      None)
    assert get(machine, b"k") == b"a"


def test_a_snapshot_of_an_earlier_build_without_checksums_still_loads() -> None:
    machine = KvMachine()
    machine.apply(envelope("s", 1, encode_put(b"k", b"a")))
    items, rows, now_ms = decode_snapshot(machine.snapshot())
    old = pack([sorted(items.items()), [list(row[:4]) for row in rows], now_ms])
    restored = KvMachine()
    restored.restore(old)  # a retry is then answered from the cache, whatever its body
    assert decode_reply(restored.apply(envelope("s", 1, encode_put(b"k", b"b")))) == (
        Code.OK, None)
    assert get(restored, b"k") == b"a"


def test_a_put_whose_reply_was_dropped_is_not_run_again(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """Past the bound on the sessions' cached replies, the reply of the session due to expire
    first is dropped; a retry of its put is told SESSION_EXPIRED, not run again (which would
    undo a later put of the same key)."""
    monkeypatch.setattr(sessions, "SESSION_REPLIES_BYTES_MAX", 3 * len(OK_REPLY))
    machine = KvMachine()
    first = envelope("s0", 1, encode_put(b"k", b"a"), now_ms=1_000)
    machine.apply(first)
    for index in range(1, 4):
        machine.apply(envelope(f"s{index}", 1, encode_put(b"k", b"b"), now_ms=1_000 + index))
    assert decode_reply(machine.apply(first)) == (Code.SESSION_EXPIRED, None)
    assert get(machine, b"k") == b"b"
    assert decode_reply(machine.apply(envelope("s3", 1, encode_put(b"k", b"b")))) == (Code.OK,
                                                                                      None)
