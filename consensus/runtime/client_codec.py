"""The client protocol on the wire: requests and responses as msgpack arrays, size-capped and
validated field by field like every other decoder.

Requests carry an id the client picks (responses may come back in any order):
- propose: the client's exactly-once session and sequence, and the state machine's command;
- read: a linearizable query (through the sequencer's read index);
- watch: a query run on the replica's own state once it executed past `after_slot` (long
  polling: the reply comes when there is news or `wait_ms` passed);
- status: the replica's role, view, sequencer, progress and counters;
- cancel: call off the watch with this id, which the client gave up on (its caller cancelled,
  or its try's deadline passed) while the connection stays up: the replica ends its wait at
  once, freeing its place in the watch budget, and answers nothing for it, nor for the cancel.
  An id not waiting (answered already, never a watch, unknown) is ignored. A replica of an
  earlier build answers it BAD_REQUEST under that id, which no caller waits for any more (ids
  are never reused on a connection), and holds the watch as before.
Response codes say exactly what the client may conclude: OK, UNKNOWN (handed to consensus,
no result in time: it may still be applied), OVERLOADED (not proposed: retrying is safe),
BAD_REQUEST, UNAVAILABLE (the replica is stopping), TOO_LARGE (the answer would not fit in a
frame of the connection: a command was applied all the same, its result is lost; a query
should ask for less).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from consensus.codec import pack, unpack
from consensus.envelope import BODY_BYTES_MAX, SESSION_LENGTH_MAX
from consensus.errors import InvalidMessage
from consensus.slot_builder import slot_builder
from consensus.validation import (
    INT64_MAX,
    expect_bytes,
    expect_fields,
    expect_int,
    expect_list,
    expect_map,
    expect_str,
)

REQUEST_BYTES_MAX = BODY_BYTES_MAX + 4096
RESPONSE_BYTES_MAX = 64 << 20
TIMEOUT_MS_MAX = 600_000
RESPONSE_MESSAGE_LENGTH_MAX = 4096


class RequestKind(enum.IntEnum):
    PROPOSE = 1
    READ = 2
    WATCH = 3
    STATUS = 4
    CANCEL = 5


class Code(enum.IntEnum):
    OK = 0
    UNKNOWN = 1
    OVERLOADED = 2
    BAD_REQUEST = 3
    UNAVAILABLE = 4
    TOO_LARGE = 5
    REFUSED = 6  # this principal may not ask it (the state machine's query gate)


@dataclass(frozen=True, slots=True)
class Propose:
    request_id: int
    session: str
    sequence: int
    body: bytes
    timeout_ms: int
    # The client's wall clock when it first sent the command (every retry carries the same),
    # or 0 from a client that does not say: the replica's stamp is no later than it allows.
    sent_ms: int = 0


@dataclass(frozen=True, slots=True)
class Read:
    request_id: int
    query: bytes
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Watch:
    request_id: int
    query: bytes
    after_slot: int
    wait_ms: int


@dataclass(frozen=True, slots=True)
class Status:
    request_id: int


@dataclass(frozen=True, slots=True)
class Cancel:
    request_id: int  # of the watch to call off (no answer comes for either)


Request = Propose | Read | Watch | Status | Cancel


@dataclass(frozen=True, slots=True)
class Response:
    request_id: int
    code: Code
    payload: bytes = b""
    slot: int = 0  # executed slots at the replica (watch), 0 otherwise
    message: str = ""


# The decoders build one of these per command: through their slots (consensus/slot_builder.py)
_new_propose: Callable[[int, str, int, bytes, int, int], Propose] = slot_builder(Propose)
_new_response: Callable[[int, Code, bytes, int, str], Response] = slot_builder(Response)
_REQUEST_KIND_MAX = max(RequestKind)  # computed once: iterating an enum is slow
# Packed as plain ints: msgpack packs an int enum member 0.35 us slower.
_PROPOSE, _READ, _WATCH, _STATUS, _CANCEL = (
    RequestKind.PROPOSE.value, RequestKind.READ.value, RequestKind.WATCH.value,
    RequestKind.STATUS.value, RequestKind.CANCEL.value)
_CODE_OF = {code.value: code for code in Code}  # a dict lookup, not an enum call
_OK = Code.OK.value
_CODE_MAX = max(_CODE_OF)


def encode_propose(request_id: int, session: str, sequence: int, body: bytes, *,
                   timeout_ms: int, sent_ms: int) -> bytes:
    """encode_request(Propose(...)) without building the Propose (once per command)."""
    return pack([_PROPOSE, request_id, session, sequence, body, timeout_ms, sent_ms])


def encode_request(request: Request) -> bytes:
    if isinstance(request, Propose):
        return encode_propose(request.request_id, request.session, request.sequence,
                              request.body, timeout_ms=request.timeout_ms,
                              sent_ms=request.sent_ms)
    if isinstance(request, Read):
        return pack([_READ, request.request_id, request.query, request.timeout_ms])
    if isinstance(request, Watch):
        return pack([_WATCH, request.request_id, request.query, request.after_slot,
                     request.wait_ms])
    if isinstance(request, Cancel):
        return pack([_CANCEL, request.request_id])
    return pack([_STATUS, request.request_id])


def decode_request(data: bytes) -> Request:
    request = decode_request_fields(data)
    if type(request) is list:
        return _new_propose(*request[1:])
    return request  # type: ignore[return-value]


# A valid propose's fields as they came: [kind, request_id, session, sequence, body,
# timeout_ms, sent_ms] (`decode_request_fields`)
ProposeFields = list[Any]


def decode_request_fields(data: bytes) -> Request | ProposeFields:
    """decode_request, checked alike, but a valid propose (one per command) comes back as its
    fields, the list msgpack built (`ProposeFields`), no Propose made: for the server, which
    reads them once. Anything else comes back as decode_request returns it."""
    raw = unpack(data, bytes_max=REQUEST_BYTES_MAX, what="request")
    # A valid propose is recognised inline; anything else takes the checks below, which name
    # what is wrong (a propose of an earlier build, with no send time, among them).
    if type(raw) is list and len(raw) == 7:
        kind, request_id, session, sequence, body, timeout_ms, sent_ms = raw
        if (type(kind) is int and kind == _PROPOSE and type(request_id) is int
                and 0 <= request_id <= INT64_MAX and type(session) is str
                and len(session) <= SESSION_LENGTH_MAX and type(sequence) is int
                and 0 <= sequence <= INT64_MAX and type(body) is bytes
                and len(body) <= BODY_BYTES_MAX and type(timeout_ms) is int
                and 0 <= timeout_ms <= TIMEOUT_MS_MAX and type(sent_ms) is int
                and 0 <= sent_ms <= INT64_MAX):
            return raw
    return _checked_request(raw)


def request_id_of(data: bytes) -> int:
    """The id of a request that does not decode, read from its first two items where they are
    [kind, id] (so its BAD_REQUEST reaches the caller waiting for it); 0 where they are not.
    Reads no further than the id, whatever the size of the rest."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(data), 1))
    unpacker.feed(data)
    try:
        if unpacker.read_array_header() < 2:
            return 0
        unpacker.skip()  # the kind
        request_id = unpacker.unpack()
    except (ValueError, msgpack.UnpackException):
        return 0
    if type(request_id) is int and 0 <= request_id <= INT64_MAX:
        return request_id
    return 0


def _checked_request(raw: object) -> Request:
    raw = expect_list(raw, "request", length_max=7)
    if len(raw) < 2:
        raise InvalidMessage("request: expected a kind and an id")
    kind = expect_int(raw[0], "request.kind", low=1, high=_REQUEST_KIND_MAX)
    request_id = expect_int(raw[1], "request.id")
    if kind == RequestKind.PROPOSE:
        if len(raw) == 6:  # from a client of an earlier build: no send time
            raw = [*raw, 0]
        _, _, session, sequence, body, timeout_ms, sent_ms = expect_fields(raw, "propose", 7)
        return _new_propose(
            request_id,
            expect_str(session, "propose.session", length_max=SESSION_LENGTH_MAX,
                       allow_empty=True),
            expect_int(sequence, "propose.sequence"),
            expect_bytes(body, "propose.body", length_max=BODY_BYTES_MAX),
            expect_int(timeout_ms, "propose.timeout_ms", high=TIMEOUT_MS_MAX),
            expect_int(sent_ms, "propose.sent_ms"))
    if kind == RequestKind.READ:
        _, _, query, timeout_ms = expect_fields(raw, "read", 4)
        return Read(request_id, expect_bytes(query, "read.query", length_max=BODY_BYTES_MAX),
                    expect_int(timeout_ms, "read.timeout_ms", high=TIMEOUT_MS_MAX))
    if kind == RequestKind.WATCH:
        _, _, query, after_slot, wait_ms = expect_fields(raw, "watch", 5)
        return Watch(request_id, expect_bytes(query, "watch.query", length_max=BODY_BYTES_MAX),
                     expect_int(after_slot, "watch.after_slot", low=-1),
                     expect_int(wait_ms, "watch.wait_ms", high=TIMEOUT_MS_MAX))
    if kind == RequestKind.CANCEL:
        expect_fields(raw, "cancel", 2)
        return Cancel(request_id)
    expect_fields(raw, "status", 2)
    return Status(request_id)


def encode_response(response: Response) -> bytes:
    return pack([response.request_id, response.code.value, response.payload, response.slot,
                 response.message])


def encode_ok(request_id: int, payload: bytes) -> bytes:
    """encode_response(Response(request_id, Code.OK, payload)) without building the Response
    (the answer to every command and read)."""
    return pack([request_id, _OK, payload, 0, ""])


def decode_response(data: bytes) -> Response:
    raw = unpack(data, bytes_max=RESPONSE_BYTES_MAX, what="response")
    # A valid answer (one per command) is recognised inline; anything else takes the checks
    # below, which name what is wrong.
    if type(raw) is list and len(raw) == 5:
        request_id, code, payload, slot, message = raw
        if (type(request_id) is int and 0 <= request_id <= INT64_MAX and type(code) is int
                and 0 <= code <= _CODE_MAX and type(payload) is bytes and type(slot) is int
                and 0 <= slot <= INT64_MAX and type(message) is str
                and len(message) <= RESPONSE_MESSAGE_LENGTH_MAX):
            return _new_response(request_id, _CODE_OF[code], payload, slot, message)
    return _checked_response(raw)


def _checked_response(raw: object) -> Response:
    raw = expect_list(raw, "response", length_max=5)
    request_id, code, payload, slot, message = expect_fields(raw, "response", 5)
    return _new_response(
        expect_int(request_id, "response.id"),
        _CODE_OF[expect_int(code, "response.code", high=_CODE_MAX)],
        expect_bytes(payload, "response.payload", length_max=RESPONSE_BYTES_MAX),
        expect_int(slot, "response.slot"),
        expect_str(message, "response.message", length_max=RESPONSE_MESSAGE_LENGTH_MAX,
                   allow_empty=True))


def encode_status(status: dict[str, Any]) -> bytes:
    return pack(status)


def decode_status(data: bytes) -> dict[str, Any]:
    return dict(expect_map(unpack(data, bytes_max=RESPONSE_BYTES_MAX, what="status"),
                           "status", length_max=4096))
