"""The envelope codec: round trips, and every malformed input is refused with a reason."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from consensus import codec
from consensus.codec import PRINCIPALS_CACHED_MAX, decode_envelope, encode_envelope, pack
from consensus.envelope import (
    BODY_BYTES_MAX,
    PRINCIPAL_NAME_LENGTH_MAX,
    SESSION_LENGTH_MAX,
    Envelope,
    Principal,
    Role,
)
from consensus.errors import InvalidMessage
from consensus.validation import (
    expect_bytes,
    expect_choice,
    expect_fields,
    expect_int,
    expect_list,
    expect_str,
)
from tests.decoding import FUZZ, near, one_field_changed, outcome, raises_only

envelopes = st.builds(
    Envelope,
    principal=st.builds(Principal, st.sampled_from(list(Role)), st.text(min_size=1,
                                                                          max_size=40)),
    session=st.text(max_size=128),
    sequence=st.integers(0, 2**63 - 1),
    now_ms=st.integers(0, 2**63 - 1),
    body=st.binary(max_size=300),
)


@given(envelopes)
def test_envelopes_round_trip(envelope: Envelope) -> None:
    assert decode_envelope(encode_envelope(envelope)) == envelope


@given(st.binary(max_size=64))
def test_garbage_is_refused_never_crashes(data: bytes) -> None:
    try:
        decode_envelope(data)
    except InvalidMessage as error:
        assert error.reason
    # A random byte string that happens to decode must still be a valid envelope; none here.


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ([1, "emperor", "x", "", 1, 0, b""], "envelope.role"),
        ([1, "admin", "", "", 1, 0, b""], "envelope.principal"),
        ([1, "admin", "x", "", -1, 0, b""], "envelope.sequence"),
        ([1, "admin", "x", "", True, 0, b""], "envelope.sequence"),
        ([1, "admin", "x", "", 1, 0, "text"], "envelope.body"),
        ([2, "admin", "x", "", 1, 0, b""], "envelope.tag"),
        ([1, "admin", "x", "", 1, 0], "expected 7 fields"),
        ({"tag": 1}, "expected a list"),
    ],
)
def test_malformed_envelopes_name_the_field(raw: object, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        decode_envelope(pack(raw))


def test_oversized_input_is_refused_before_decoding() -> None:
    with pytest.raises(InvalidMessage, match="more than"):
        decode_envelope(b"\x00" * (BODY_BYTES_MAX + 10_000))


def test_trailing_bytes_are_refused() -> None:
    data = encode_envelope(Envelope(principal=Principal(Role.ADMIN, "a"), session="s",
                                    sequence=1, now_ms=5, body=b"x"))
    with pytest.raises(InvalidMessage, match="msgpack"):
        decode_envelope(data + b"\x01")


def test_decoded_principals_are_cached_within_a_bound_and_still_checked() -> None:
    def decoded(role: str, name: str) -> Principal:
        return decode_envelope(pack([1, role, name, "s", 1, 0, b""])).principal

    first = decoded("node", "n1")
    assert decoded("node", "n1") is first  # built once, then found
    assert decoded("admin", "n1") == Principal(Role.ADMIN, "n1")  # the role is part of the key
    for number in range(PRINCIPALS_CACHED_MAX + 10):
        assert decoded("scheduler", f"s{number}") == Principal(Role.SCHEDULER, f"s{number}")
    assert len(codec._principals) <= PRINCIPALS_CACHED_MAX
    with pytest.raises(InvalidMessage, match=r"envelope\.principal"):
        decoded("node", "x" * 254)  # a name the cache never saw is checked as always
    with pytest.raises(InvalidMessage, match=r"envelope\.role"):
        decoded("emperor", "n1")


@given(envelopes)
def test_a_decoded_envelope_is_what_its_constructor_makes(envelope: Envelope) -> None:
    """Built through its slots, it equals, hashes and prints as the constructor's; the
    principal's text (its session keys' prefix) is "role:name"."""
    decoded = decode_envelope(encode_envelope(envelope))
    assert hash(decoded) == hash(envelope) and repr(decoded) == repr(envelope)
    principal = decoded.principal
    assert str(principal) == principal.text == f"{principal.role.value}:{principal.name}"


def checked_envelope(raw: object) -> Envelope:
    """The envelope decoder's rules, written with the expect_* checks one field at a time."""
    fields = expect_fields(expect_list(raw, "envelope", length_max=7), "envelope", 7)
    tag, role, name, session, sequence, now_ms, body = fields
    if expect_int(tag, "tag") != 1:
        raise InvalidMessage("tag")
    principal = Principal(Role(expect_choice(role, "role", tuple(Role))),
                          expect_str(name, "name", length_max=PRINCIPAL_NAME_LENGTH_MAX))
    return Envelope(principal=principal,
                    session=expect_str(session, "session", length_max=SESSION_LENGTH_MAX,
                                       allow_empty=True),
                    sequence=expect_int(sequence, "sequence"),
                    now_ms=expect_int(now_ms, "now_ms"),
                    body=expect_bytes(body, "body", length_max=BODY_BYTES_MAX))


envelope_fields = st.one_of(
    st.integers(-1, 2), st.just(2**63), st.booleans(), st.none(), st.binary(max_size=3),
    st.text(max_size=3), st.text(min_size=SESSION_LENGTH_MAX, max_size=SESSION_LENGTH_MAX + 1),
    st.sampled_from(list(Role)).map(str))


@given(st.one_of(
    st.lists(envelope_fields, max_size=8),
    st.tuples(st.sampled_from([1, True, 1.0]), envelope_fields, envelope_fields,
              envelope_fields, envelope_fields, envelope_fields, envelope_fields).map(list),
    one_field_changed([1, "admin", "a", "s", 1, 0, b"x"], envelope_fields)))
@example([1, "admin", "a", "", 0, 0, b"x" * (BODY_BYTES_MAX + 1)])
@example([1, "admin", "a", "s" * (SESSION_LENGTH_MAX + 1), 0, 0, b""])
def test_the_inline_checks_decide_as_the_field_by_field_ones(raw: list[object]) -> None:
    assert outcome(lambda: decode_envelope(pack(raw))) == outcome(lambda: checked_envelope(raw))


@FUZZ
@given(near(envelopes.map(encode_envelope)))
def test_inputs_near_an_envelope_are_only_ever_refused(data: bytes) -> None:
    raises_only(decode_envelope, data, InvalidMessage)
