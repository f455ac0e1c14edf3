"""The few etcd v3 protobuf messages the peer benchmark sends and reads, encoded by hand.

The etcd client only needs `PutRequest {key=1, value=2}`, `RangeRequest {key=1}` (linearizable
by default: `serializable` stays false, so it is left out), the first `KeyValue.value` (field
5) of `RangeResponse.kvs` (field 2), and from a `StatusResponse` (an empty `StatusRequest`
asks for it) the member's id (`header` = 1, its `member_id` = 2) and the leader's (`leader` =
4). A dozen lines of varint and length-delimited codec do that
without a protobuf or etcd3 dependency, and the gRPC calls carry these raw bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

VARINT = 0
FIXED64 = 1
LENGTH_DELIMITED = 2
FIXED32 = 5
_FIXED_SIZES = {FIXED64: 8, FIXED32: 4}
_VARINT_BYTES_MAX = 10  # a 64-bit varint takes at most ten bytes

RANGE_RESPONSE_KVS = 2
KEY_VALUE_VALUE = 5
STATUS_RESPONSE_HEADER = 1
STATUS_RESPONSE_LEADER = 4
RESPONSE_HEADER_MEMBER_ID = 2


class MalformedMessage(ValueError):
    """Bytes that are not the protobuf message they were read as (truncated, bad tag...)."""


@dataclass(frozen=True, slots=True)
class Field:
    """One decoded field: its number, wire type and value (an int for varints, else bytes)."""

    number: int
    wire_type: int
    value: int | bytes


def encode_varint(value: int) -> bytes:
    """Base-128 little-endian varint of a non-negative integer below 2**64."""
    if not 0 <= value < 1 << 64:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_varint(data: bytes, offset: int) -> tuple[int, int]:
    """The varint at `offset` and the offset just past it."""
    value = 0
    for index in range(_VARINT_BYTES_MAX):
        if offset + index >= len(data):
            raise MalformedMessage(f"varint truncated at byte {offset + index}")
        byte = data[offset + index]
        value |= (byte & 0x7F) << (7 * index)
        if byte < 0x80:
            return value, offset + index + 1
    raise MalformedMessage(f"varint longer than {_VARINT_BYTES_MAX} bytes at byte {offset}")


def encode_bytes_field(number: int, value: bytes) -> bytes:
    """A length-delimited field; proto3 leaves an empty one out."""
    if not value:
        return b""
    return encode_varint(number << 3 | LENGTH_DELIMITED) + encode_varint(len(value)) + value


def put_request(key: bytes, value: bytes) -> bytes:
    """etcdserverpb.PutRequest with only key and value set."""
    return encode_bytes_field(1, key) + encode_bytes_field(2, value)


def range_request(key: bytes) -> bytes:
    """etcdserverpb.RangeRequest for one key, linearizable (the default)."""
    return encode_bytes_field(1, key)


def fields(data: bytes) -> Iterator[Field]:
    """Every top-level field of a message, in order; raises MalformedMessage on bad bytes."""
    offset = 0
    while offset < len(data):
        tag, offset = decode_varint(data, offset)
        number, wire_type = tag >> 3, tag & 0x7
        if number == 0:
            raise MalformedMessage(f"field number 0 at byte {offset}")
        if wire_type == VARINT:
            value, offset = decode_varint(data, offset)
            yield Field(number, wire_type, value)
        elif wire_type == LENGTH_DELIMITED:
            length, offset = decode_varint(data, offset)
            if offset + length > len(data):
                raise MalformedMessage(f"field {number} claims {length} bytes, "
                                       f"{len(data) - offset} left")
            yield Field(number, wire_type, data[offset:offset + length])
            offset += length
        elif wire_type in _FIXED_SIZES:
            size = _FIXED_SIZES[wire_type]
            if offset + size > len(data):
                raise MalformedMessage(f"fixed field {number} truncated")
            yield Field(number, wire_type, int.from_bytes(data[offset:offset + size], "little"))
            offset += size
        else:
            raise MalformedMessage(f"unsupported wire type {wire_type} for field {number}")


def first_value(range_response: bytes) -> bytes | None:
    """The value of the first KeyValue in a RangeResponse; None when the key is absent.

    Every field is checked for well-formedness, not only the ones read, so truncated bytes
    raise instead of passing for an empty answer."""
    kvs = [field for field in fields(range_response) if field.number == RANGE_RESPONSE_KVS]
    if not kvs:
        return None
    key_value = kvs[0].value
    if not isinstance(key_value, bytes):
        raise MalformedMessage("RangeResponse.kvs is not length-delimited")
    for found in list(fields(key_value)):  # list(): validate the whole KeyValue first
        if found.number == KEY_VALUE_VALUE:
            if not isinstance(found.value, bytes):
                raise MalformedMessage(f"KeyValue.value has wire type {found.wire_type}")
            return found.value
    return b""  # proto3 leaves an empty value out


def member_and_leader(status_response: bytes) -> tuple[int, int]:
    """(the answering member's id, the leader's id) from a Maintenance StatusResponse; an id
    left out (proto3 omits zero) reads as 0, which no member has."""
    member = leader = 0
    for found in list(fields(status_response)):
        if found.number == STATUS_RESPONSE_LEADER and isinstance(found.value, int):
            leader = found.value
        elif found.number == STATUS_RESPONSE_HEADER:
            if not isinstance(found.value, bytes):
                raise MalformedMessage("StatusResponse.header is not length-delimited")
            member = next((field.value for field in list(fields(found.value))
                           if field.number == RESPONSE_HEADER_MEMBER_ID
                           and isinstance(field.value, int)), 0)
    return member, leader
