"""The wire and disk encodings of the consensus package, and the only msgpack user in it.

Every encoding is a msgpack array whose first element is a small integer tag, packed with
`use_bin_type=True` and unpacked with `raw=False`, `strict_map_key=True` and size limits, then
validated field by field (`consensus.validation`) before a typed object is built. A decoder
either returns a fully checked object or raises `InvalidMessage` with the reason.
"""

from __future__ import annotations

from typing import Any

import msgpack

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

ENVELOPE_TAG = 1
ENVELOPE_BYTES_MAX = BODY_BYTES_MAX + 4096
_ROLES = tuple(role.value for role in Role)


def pack(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def unpack(data: bytes, *, bytes_max: int, what: str) -> Any:
    """Unpack one msgpack value, refusing oversized input and trailing garbage."""
    if len(data) > bytes_max:
        raise InvalidMessage(f"{what}: {len(data)} bytes, more than {bytes_max}")
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True,
            max_bin_len=bytes_max, max_str_len=bytes_max,
            max_array_len=bytes_max, max_map_len=bytes_max, max_ext_len=0,
        )
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise InvalidMessage(f"{what}: not valid msgpack ({error})") from error


def encode_envelope(envelope: Envelope) -> bytes:
    principal = envelope.principal
    return pack([ENVELOPE_TAG, principal.role.value, principal.name, envelope.session,
                 envelope.sequence, envelope.now_ms, envelope.body])


def decode_envelope(data: bytes) -> Envelope:
    raw = expect_list(unpack(data, bytes_max=ENVELOPE_BYTES_MAX, what="envelope"),
                      "envelope", length_max=7)
    tag, role, name, session, sequence, now_ms, body = expect_fields(raw, "envelope", 7)
    if expect_int(tag, "envelope.tag") != ENVELOPE_TAG:
        raise InvalidMessage(f"envelope.tag: expected {ENVELOPE_TAG}, got {tag}")
    principal = Principal(
        Role(expect_choice(role, "envelope.role", _ROLES)),
        expect_str(name, "envelope.principal", length_max=PRINCIPAL_NAME_LENGTH_MAX),
    )
    return Envelope(
        principal=principal,
        session=expect_str(session, "envelope.session", length_max=SESSION_LENGTH_MAX,
                           allow_empty=True),
        sequence=expect_int(sequence, "envelope.sequence"),
        now_ms=expect_int(now_ms, "envelope.now_ms"),
        body=expect_bytes(body, "envelope.body", length_max=BODY_BYTES_MAX),
    )
