"""The key-value store's commands, queries, replies and snapshots, in msgpack.

A put is `[1, key, value]`, a get `[2, key]`; replies are `[OK]` / `[OK, value]` or `[code]`.
Several puts in one command (a client's batch of its callers' puts) are `[3, [key, value, key,
value, ...]]`, at most `PUTS_MAX` puts and `PUTS_BYTES_MAX` bytes, and only in that encoding
(it begins with `PUTS_PREFIX`); its reply is `[OK]` when every put was applied, `[code]` when
the command was refused whole (malformed, or by its session), or `[OK, [code, ...]]` with a
code for each put in order (STORE_FULL refuses one put, not the others).
Keys are at most `KEY_BYTES_MAX` bytes, values `VALUE_BYTES_MAX`, and every decoded field is
checked before use: a malformed command becomes a BAD_REQUEST reply, never an exception. The
store holds at most `DATA_BYTES_MAX` bytes of keys and values, framing counted, and `KEYS_MAX`
keys (STORE_FULL past either), so that its snapshot stays within what one log record holds
(`consensus.codec.RECORD_BYTES_MAX`) and what a snapshot may list.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import cast

from consensus.codec import pack, unpack
from consensus.errors import InvalidMessage
from consensus.validation import expect_bytes, expect_fields, expect_int, expect_list
from statemachine.sessions import NO_CHECKSUM

KEY_BYTES_MAX = 1024
VALUE_BYTES_MAX = 64 * 1024
COMMAND_BYTES_MAX = KEY_BYTES_MAX + VALUE_BYTES_MAX + 64
SNAPSHOT_BYTES_MAX = 1 << 31
# What the store holds: keys and values with ITEM_OVERHEAD_BYTES each (their framing in the
# snapshot), and at most KEYS_MAX keys (what a snapshot may list). A snapshot over the log's
# record cap (1 GiB) could not be written, and one over ITEMS_MAX could not be read back: the
# store refuses to grow well before either (its sessions take the rest of the snapshot).
DATA_BYTES_MAX = 512 << 20
ITEM_OVERHEAD_BYTES = 16  # msgpack's array and two bin headers take at most 7
ITEMS_MAX = 1 << 24  # the most items or sessions a snapshot may list
KEYS_MAX = ITEMS_MAX
PUTS_MAX = 512  # puts in one PUTS command
# One PUTS command's bytes: a put of the largest key and value fits alone, and the command stays
# well inside what an envelope carries (consensus.envelope.BODY_BYTES_MAX).
PUTS_BYTES_MAX = 256 * 1024
# What a put adds to a PUTS command past its key and value (two bin headers, of at most 5 bytes
# each), and the command's own framing (its array headers and operation): a client counts a
# batch's bytes with these to keep it within PUTS_BYTES_MAX
PUT_FRAMING_BYTES = 10
PUTS_FRAMING_BYTES = 8
PUTS_REPLY_BYTES_MAX = 16 + 2 * PUTS_MAX  # [OK, [code, ...]]: each code one byte, framing


# name, last sequence, its reply, expiry (ms), its command's checksum (statemachine.sessions;
# NO_CHECKSUM from a snapshot of an earlier build, whose rows had four fields)
SessionRow = tuple[str, int, bytes, int, int]


class Operation(enum.IntEnum):
    PUT = 1
    GET = 2
    PUTS = 3


# Decoders look members up by value (an enum call costs more), and encoders pack plain ints
# (msgpack packs an int faster than an int enum member).
_OPERATION_OF = {operation.value: operation for operation in Operation}
_PUT, _GET, _PUTS = Operation.PUT.value, Operation.GET.value, Operation.PUTS.value
PUTS_PREFIX = b"\x92\x03"  # msgpack's [3, ...]: how every PUTS command begins


class Code(enum.IntEnum):
    OK = 0
    BAD_REQUEST = 1
    STALE_SEQUENCE = 2  # an older command of the session, whose reply is gone
    SESSION_TOO_OLD = 3  # stamped too long ago to open a session (statemachine/sessions.py)
    SESSIONS_FULL = 4  # no room for a new session until one expires
    STORE_FULL = 5  # the put would go past DATA_BYTES_MAX or KEYS_MAX
    SEQUENCE_REUSED = 6  # the session's last sequence, applied to another command
    SESSION_EXPIRED = 7  # the session's last sequence, run before; its cached reply dropped


_CODE_OF = {code.value: code for code in Code}
_OK = Code.OK.value


def encode_put(key: bytes, value: bytes) -> bytes:
    return pack([_PUT, key, value])


def encode_get(key: bytes) -> bytes:
    return pack([_GET, key])


def decode_request(data: bytes) -> tuple[Operation, bytes, bytes]:
    """(operation, key, value); the value is b"" for a get."""
    raw = unpack(data, bytes_max=COMMAND_BYTES_MAX, what="kv request")
    # A valid put (every replica decodes every one) is recognised inline; anything else takes
    # the checks below, which name what is wrong.
    if type(raw) is list and len(raw) == 3:
        operation, key, value = raw
        if (type(operation) is int and operation == _PUT and type(key) is bytes
                and len(key) <= KEY_BYTES_MAX and type(value) is bytes
                and len(value) <= VALUE_BYTES_MAX):
            return Operation.PUT, key, value
    return _checked_request(raw)


def _checked_request(raw: object) -> tuple[Operation, bytes, bytes]:
    raw = expect_list(raw, "kv request", length_max=3)
    if not raw:
        raise InvalidMessage("kv request: empty")
    operation = _OPERATION_OF[expect_int(raw[0], "kv.operation", low=1, high=len(_OPERATION_OF))]
    if operation is Operation.PUTS:
        raise InvalidMessage("kv request: a PUTS is read by decode_puts, in encode_puts's "
                             "encoding only")
    arity = 3 if operation is Operation.PUT else 2
    if len(raw) != arity:
        raise InvalidMessage(f"kv request: {operation.name} takes {arity} fields, got {len(raw)}")
    key = expect_bytes(raw[1], "kv.key", length_max=KEY_BYTES_MAX)
    value = expect_bytes(raw[2], "kv.value", length_max=VALUE_BYTES_MAX) if arity == 3 else b""
    return operation, key, value


def encode_puts(pairs: Sequence[tuple[bytes, bytes]]) -> bytes:
    """One command of several puts, applied in order (at least one; the bounds are the
    caller's to keep: `decode_puts` refuses what passes them)."""
    return encode_puts_fields([field for pair in pairs for field in pair])


def encode_puts_fields(fields: Sequence[bytes]) -> bytes:
    """`encode_puts` of the pairs laid out flat: key, value, key, value, ..."""
    return pack([_PUTS, fields])


def decode_puts(data: bytes) -> list[tuple[bytes, bytes]]:
    """The (key, value) pairs of a PUTS command, in order."""
    keys, values = decode_puts_fields(data)
    return list(zip(keys, values, strict=True))


def decode_puts_fields(data: bytes) -> tuple[list[bytes], list[bytes]]:
    """A PUTS command's keys and its values, each in order (`decode_puts`, as two lists: every
    replica decodes every batch, and checks it in C loops, not a put at a time)."""
    if not data.startswith(PUTS_PREFIX):
        raise InvalidMessage("kv puts: not encoded as encode_puts encodes one")
    raw = expect_list(unpack(data, bytes_max=PUTS_BYTES_MAX, what="kv puts"), "kv puts",
                      length_max=2)
    fields = expect_list(raw[1] if len(raw) == 2 else None, "kv.puts", length_max=2 * PUTS_MAX)
    if not fields or len(fields) % 2:
        raise InvalidMessage(f"kv.puts: expected key and value pairs, got {len(fields)} fields")
    keys, values = cast(list[bytes], fields[0::2]), cast(list[bytes], fields[1::2])
    if not (set(map(type, fields)) == {bytes} and max(map(len, keys)) <= KEY_BYTES_MAX
            and max(map(len, values)) <= VALUE_BYTES_MAX):  # the valid case, in C loops
        for key, value in zip(keys, values, strict=True):  # which field is wrong
            expect_bytes(key, "kv.key", length_max=KEY_BYTES_MAX)
            expect_bytes(value, "kv.value", length_max=VALUE_BYTES_MAX)
    return keys, values


def encode_puts_reply(codes: Sequence[Code]) -> bytes:
    """A PUTS command's reply: OK_REPLY when every put was applied."""
    if all(code is Code.OK for code in codes):
        return OK_REPLY
    return pack([_OK, [code.value for code in codes]])


def decode_puts_reply(data: bytes, count: int) -> list[Code]:
    """The code of each of a PUTS command's `count` puts, in order."""
    if data == OK_REPLY:
        return [Code.OK] * count
    raw = expect_list(unpack(data, bytes_max=PUTS_REPLY_BYTES_MAX, what="kv puts reply"),
                      "kv puts reply", length_max=2)
    if not raw:
        raise InvalidMessage("kv puts reply: empty")
    code = _code(raw[0])
    if len(raw) == 1:  # the command refused whole
        return [code] * count
    codes = expect_list(raw[1], "kv.codes", length_max=PUTS_MAX)
    if code is not Code.OK or len(codes) != count:
        raise InvalidMessage(f"kv puts reply: expected OK and {count} codes, got "
                             f"{code.name} and {len(codes)}")
    return [_code(each) for each in codes]


def _code(raw: object) -> Code:
    return _CODE_OF[expect_int(raw, "kv.code", low=0, high=len(_CODE_OF) - 1)]


def encode_reply(code: Code, value: bytes | None = None) -> bytes:
    return pack([code] if value is None else [code, value])


OK_REPLY = encode_reply(Code.OK)  # the answer to every put that succeeds, made once


def decode_reply(data: bytes) -> tuple[Code, bytes | None]:
    if data == OK_REPLY:  # a put's answer, once per command: no decoding needed
        return Code.OK, None
    raw = expect_list(unpack(data, bytes_max=COMMAND_BYTES_MAX, what="kv reply"), "kv reply",
                      length_max=2)
    if not raw:
        raise InvalidMessage("kv reply: empty")
    code = _code(raw[0])
    value = expect_bytes(raw[1], "kv.value", length_max=VALUE_BYTES_MAX) if len(raw) == 2 \
        else None
    return code, value


def encode_snapshot(data: dict[bytes, bytes], sessions: list[SessionRow], now_ms: int) -> bytes:
    return pack([sorted(data.items()), sorted(sessions), now_ms])


def decode_snapshot(data: bytes) -> tuple[dict[bytes, bytes], list[SessionRow], int]:
    """(items, sessions, the sessions' clock in ms)."""
    raw = expect_list(unpack(data, bytes_max=SNAPSHOT_BYTES_MAX, what="kv snapshot"),
                      "kv snapshot", length_max=3)
    if len(raw) != 3:
        raise InvalidMessage("kv snapshot: expected [items, sessions, now_ms]")
    items = expect_list(raw[0], "kv.items", length_max=ITEMS_MAX)
    pairs = (expect_fields(expect_list(item, "kv.item", length_max=2), "kv.item", 2)
             for item in items)
    data_out = {expect_bytes(pair[0], "kv.key", length_max=KEY_BYTES_MAX):
                expect_bytes(pair[1], "kv.value", length_max=VALUE_BYTES_MAX) for pair in pairs}
    sessions = []
    for entry in expect_list(raw[1], "kv.sessions", length_max=ITEMS_MAX):
        fields = expect_list(entry, "kv.session", length_max=5)
        if len(fields) == 4:
            fields = [*fields, NO_CHECKSUM]
        if len(fields) != 5 or type(fields[0]) is not str:
            raise InvalidMessage(
                "kv.session: expected [name, sequence, reply, expires_ms, checksum]")
        sessions.append((fields[0], expect_int(fields[1], "kv.sequence"),
                         expect_bytes(fields[2], "kv.reply", length_max=COMMAND_BYTES_MAX),
                         expect_int(fields[3], "kv.expires_ms"),
                         expect_int(fields[4], "kv.checksum", low=NO_CHECKSUM)))
    return data_out, sessions, expect_int(raw[2], "kv.now_ms")
