"""The client protocol's codec: requests and responses round-trip, the answer to a command
packed from its fields equals the one packed from a Response, and malformed input is refused
with the field named."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from consensus.codec import pack
from consensus.envelope import BODY_BYTES_MAX, SESSION_LENGTH_MAX
from consensus.errors import InvalidMessage
from consensus.runtime.client_codec import (
    RESPONSE_MESSAGE_LENGTH_MAX,
    TIMEOUT_MS_MAX,
    Cancel,
    Code,
    Propose,
    Read,
    Request,
    Response,
    Status,
    Watch,
    _checked_request,
    _checked_response,
    decode_request,
    decode_response,
    decode_status,
    encode_ok,
    encode_request,
    encode_response,
    encode_status,
    request_id_of,
)
from tests.decoding import FUZZ, near, one_field_changed, outcome, raises_only

ids = st.integers(0, 2**63 - 1)
timeouts = st.integers(0, TIMEOUT_MS_MAX)
requests = st.one_of(
    st.builds(Propose, ids, st.text(max_size=128), ids, st.binary(max_size=200), timeouts,
              ids),
    st.builds(Read, ids, st.binary(max_size=200), timeouts),
    st.builds(Watch, ids, st.binary(max_size=200), st.integers(-1, 2**63 - 1), timeouts),
    st.builds(Status, ids),
    st.builds(Cancel, ids),
)
responses = st.builds(Response, ids, st.sampled_from(list(Code)), st.binary(max_size=200),
                      st.integers(0, 2**63 - 1), st.text(max_size=200))


@given(requests)
def test_requests_round_trip(request: Request) -> None:
    assert decode_request(encode_request(request)) == request


@given(responses)
def test_responses_round_trip(response: Response) -> None:
    decoded = decode_response(encode_response(response))
    assert decoded == response and decoded.code is response.code


@given(ids, st.binary(max_size=200))
def test_an_ok_packed_from_its_fields_is_the_same_answer(request_id: int, payload: bytes) -> None:
    assert encode_ok(request_id, payload) == encode_response(
        Response(request_id, Code.OK, payload))


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ([1, 9, b"", 0, ""], "response.code"),
        ([1, True, b"", 0, ""], "response.code"),
        ([-1, 0, b"", 0, ""], "response.id"),
        ([1, 0, "text", 0, ""], "response.payload"),
        ([1, 0, b""], "expected 5 fields"),
    ],
)
def test_malformed_responses_name_the_field(raw: object, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        decode_response(pack(raw))


# Fields of every kind, valid or not, at the limits' edges.
fields = st.one_of(
    st.integers(-1, 5), st.just(2**63), st.just(TIMEOUT_MS_MAX + 1), st.booleans(), st.none(),
    st.text(max_size=3), st.binary(max_size=3),
    st.text(min_size=SESSION_LENGTH_MAX, max_size=SESSION_LENGTH_MAX + 1),
    st.text(min_size=RESPONSE_MESSAGE_LENGTH_MAX, max_size=RESPONSE_MESSAGE_LENGTH_MAX + 1))


@given(st.one_of(st.lists(fields, max_size=8),
                 one_field_changed([1, 7, "s", 1, b"x", 100, 5], fields)))
@example([1, 1, "s", 1, b"x" * (BODY_BYTES_MAX + 1), 0, 5])
@example([1, 7, "s" * (SESSION_LENGTH_MAX + 1), 1, b"x", 100, 5])
@example([True, 7, "s", 1, b"x", 100, 5])
@example([1, 7, "s", 1, b"x", TIMEOUT_MS_MAX + 1, 5])
@example([1, 7, "s", 1, b"x", 100, -1])
def test_the_inline_propose_path_decides_as_the_checked_one(raw: list[object]) -> None:
    assert outcome(lambda: decode_request(pack(raw))) == outcome(lambda: _checked_request(raw))


def test_a_propose_of_an_earlier_client_without_a_send_time_is_read_as_none_given() -> None:
    assert decode_request(pack([1, 7, "s", 1, b"x", 100])) == Propose(7, "s", 1, b"x", 100, 0)


@given(st.one_of(st.lists(fields, max_size=6), one_field_changed([7, 0, b"x", 0, ""], fields)))
@example([7, 0, b"x", 0, "m" * (RESPONSE_MESSAGE_LENGTH_MAX + 1)])
@example([7, True, b"x", 0, ""])
def test_the_inline_answer_path_decides_as_the_checked_one(raw: list[object]) -> None:
    assert outcome(lambda: decode_response(pack(raw))) == outcome(lambda: _checked_response(raw))


@given(requests)
def test_the_id_of_a_valid_request_is_read_back(request: Request) -> None:
    assert request_id_of(encode_request(request)) == request.request_id


@pytest.mark.parametrize(("raw", "reason"), [
    ([5, 7, 0], "cancel"),  # nothing but the id it names
    ([5, -1], "request.id"),
    ([5, 2**63], "request.id"),
    ([5, "7"], "request.id"),
    ([6, 7], "request.kind"),
])
def test_a_malformed_cancel_is_refused_with_the_field_named(raw: object, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        decode_request(pack(raw))


def test_a_cancel_names_the_request_it_calls_off() -> None:
    assert encode_request(Cancel(42)) == pack([5, 42])
    assert decode_request(pack([5, 42])) == Cancel(42)
    assert request_id_of(encode_request(Cancel(42))) == 42


@pytest.mark.parametrize(("data", "request_id"), [
    (pack([1, 42, "s", 1, b"x" * (BODY_BYTES_MAX + 1), 1000]), 42),  # too big to decode
    (pack([9, 43]), 43),  # an unknown kind
    (pack([1, 44, "s"]), 44),  # too few fields
    (pack([1]), 0),
    (pack([1, -5, "s", 1, b"", 0]), 0),
    (pack([1, "id", "s", 1, b"", 0]), 0),
    (pack({"id": 7}), 0),
    (b"\xc1garbage", 0),
    (b"", 0),
    (pack([1, 2**63, "s", 1, b"", 0]), 0),
])
def test_the_id_of_a_request_that_does_not_decode(data: bytes, request_id: int) -> None:
    """Read where [kind, id] can be read, so its BAD_REQUEST reaches the caller; else 0."""
    with pytest.raises(InvalidMessage):
        decode_request(data)
    assert request_id_of(data) == request_id


@FUZZ
@given(near(requests.map(encode_request)))
def test_inputs_near_a_request_are_only_ever_refused(data: bytes) -> None:
    """A client's request frame gives a Request or InvalidMessage (answered BAD_REQUEST), and
    its id is read back or 0: never another exception in the server's reader."""
    raises_only(decode_request, data, InvalidMessage)
    assert 0 <= request_id_of(data) <= 2**63 - 1


@FUZZ
@given(near(responses.map(encode_response)))
def test_inputs_near_a_response_are_only_ever_refused(data: bytes) -> None:
    raises_only(decode_response, data, InvalidMessage)
    raises_only(decode_status, data, InvalidMessage)


def test_a_status_round_trips() -> None:
    assert decode_status(encode_status({"view": 1, "counters": {"a": 2}})) == {
        "view": 1, "counters": {"a": 2}}
