"""The key-value apply reads the envelope's fields without building an Envelope, and `unpack`
passes msgpack only the options that differ from its defaults: the fields read are those
`decode_envelope` checks and builds, a malformed envelope is refused alike, ext types are still
refused, and a command without a session is applied and answered as before."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellar.kv.codec import OK_REPLY, Code, encode_put, encode_reply
from cellar.kv.machine import KvMachine
from consensus.codec import (
    decode_envelope,
    decode_envelope_fields,
    encode_envelope_of,
    unpack,
)
from consensus.envelope import Principal, Role
from consensus.errors import InvalidMessage

ADMIN = Principal(Role.ADMIN, "bench")


@given(session=st.text(max_size=20), sequence=st.integers(0, 2**63 - 1),
       now_ms=st.integers(0, 2**63 - 1), body=st.binary(max_size=64))
def test_the_fields_are_those_of_the_envelope(session: str, sequence: int, now_ms: int,
                                              body: bytes) -> None:
    data = encode_envelope_of(ADMIN, session, sequence, now_ms, body)
    envelope = decode_envelope(data)
    assert decode_envelope_fields(data) == (envelope.principal, envelope.session,
                                            envelope.sequence, envelope.now_ms, envelope.body)


@given(raw=st.lists(st.one_of(st.integers(-3, 3), st.text(max_size=3), st.binary(max_size=3),
                              st.none()), max_size=8))
def test_a_malformed_envelope_is_refused_by_both(raw: list[object]) -> None:
    data = msgpack.packb(raw, use_bin_type=True)
    try:
        expected = decode_envelope(data)
    except InvalidMessage:
        with pytest.raises(InvalidMessage):
            decode_envelope_fields(data)
        return
    assert decode_envelope_fields(data)[4] == expected.body


def test_unpack_still_refuses_ext_types_non_str_keys_and_oversized_input() -> None:
    with pytest.raises(InvalidMessage):
        unpack(msgpack.packb(msgpack.ExtType(1, b"x")), bytes_max=100, what="x")
    with pytest.raises(InvalidMessage):
        unpack(msgpack.packb({1: 2}), bytes_max=100, what="x")  # map keys: str or bytes
    with pytest.raises(InvalidMessage):
        unpack(msgpack.packb(b"x" * 100), bytes_max=50, what="x")
    with pytest.raises(InvalidMessage):
        unpack(b"\xdd\xff\xff\xff\xff", bytes_max=100, what="x")  # an array longer than input
    assert unpack(msgpack.packb(["a", b"b", [1], {"k": 2}], use_bin_type=True), bytes_max=100,
                  what="x") == ["a", b"b", [1], {"k": 2}]


def test_a_command_without_a_session_is_applied_and_moves_the_clock_only_forward() -> None:
    machine = KvMachine()
    put = encode_put(b"k", b"v")
    assert machine.apply(encode_envelope_of(ADMIN, "", 0, 500, put)) == OK_REPLY
    assert machine.apply(encode_envelope_of(ADMIN, "", 0, 100, put)) == OK_REPLY
    assert machine.now_ms == 500 and machine.data == {b"k": b"v"}
    assert not machine.sessions.table  # nothing cached for sequence 0
    assert machine.apply(encode_envelope_of(ADMIN, "s", 1, 600, b"\x91\x07")) == encode_reply(
        Code.BAD_REQUEST)
