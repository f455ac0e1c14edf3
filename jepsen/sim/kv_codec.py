"""Encodings of the simulator's key-value commands, replies and snapshots (msgpack)."""

from __future__ import annotations

from typing import Any

from consensus.codec import pack, unpack
from consensus.errors import InvalidMessage
from consensus.validation import expect_choice, expect_int, expect_list, expect_str

KV_BYTES_MAX = 1 << 16
SNAPSHOT_BYTES_MAX = 1 << 30
Value = int | None


def encode_put(key: str, value: int) -> bytes:
    return pack(["put", key, value])


def encode_cas(key: str, expected: Value, new: int) -> bytes:
    return pack(["cas", key, expected, new])


def encode_get(key: str) -> bytes:
    return pack(["get", key])


def decode_command(data: bytes) -> tuple[str, str, Value, Value]:
    """(operation, key, first argument, second argument)."""
    raw = expect_list(unpack(data, bytes_max=KV_BYTES_MAX, what="kv command"), "kv command",
                      length_max=4)
    if not raw:
        raise InvalidMessage("kv command: empty")
    operation = expect_choice(raw[0], "kv.op", ("put", "cas", "get"))
    arity = {"put": 3, "cas": 4, "get": 2}[operation]
    if len(raw) != arity:
        raise InvalidMessage(f"kv.{operation}: expected {arity} fields, got {len(raw)}")
    key = expect_str(raw[1], "kv.key", length_max=256)
    first = _value(raw[2], "kv.value") if arity > 2 else None
    second = _value(raw[3], "kv.new") if arity > 3 else None
    return operation, key, first, second


def _value(raw: Any, field: str) -> Value:
    return None if raw is None else expect_int(raw, field, low=-(1 << 62), high=1 << 62)


def encode_reply(ok: bool, value: Value) -> bytes:
    return pack([ok, value])


def decode_reply(data: bytes) -> tuple[bool, Value]:
    raw = unpack(data, bytes_max=KV_BYTES_MAX, what="kv reply")
    return bool(raw[0]), raw[1]


def encode_snapshot(items: list[tuple[str, int]]) -> bytes:
    return pack([[key, value] for key, value in items])


def decode_snapshot(data: bytes) -> dict[str, int]:
    raw = expect_list(unpack(data, bytes_max=SNAPSHOT_BYTES_MAX, what="kv snapshot"),
                      "kv snapshot", length_max=1 << 24)
    return {expect_str(key, "kv.key", length_max=256): expect_int(value, "kv.value",
                                                                 low=-(1 << 62))
            for key, value in raw}
