"""Encodings of the simulator's key-value commands, replies and snapshots (msgpack)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from consensus.codec import pack, unpack
from consensus.errors import InvalidMessage
from consensus.validation import (
    expect_bool,
    expect_choice,
    expect_fields,
    expect_int,
    expect_list,
    expect_str,
)

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
    return None if raw is None else _stored(raw, field)


def encode_reply(ok: bool, value: Value) -> bytes:
    return pack([ok, value])


def decode_reply(data: bytes) -> tuple[bool, Value]:
    raw = unpack(data, bytes_max=KV_BYTES_MAX, what="kv reply")
    return bool(raw[0]), raw[1]


def encode_snapshot(items: list[tuple[str, int]], cas_outcomes: list[tuple[int, bool]]
                    ) -> bytes:
    """The store's keys and values, then its remembered cas outcomes, oldest first."""
    return pack([[[key, value] for key, value in items],
                 [[new_value, took_effect] for new_value, took_effect in cas_outcomes]])


def decode_snapshot(data: bytes, outcomes_max: int) -> tuple[dict[str, int], dict[int, bool]]:
    raw = expect_fields(expect_list(unpack(data, bytes_max=SNAPSHOT_BYTES_MAX,
                                           what="kv snapshot"), "kv snapshot", length_max=2),
                        "kv snapshot", 2)
    items = expect_list(raw[0], "kv snapshot items", length_max=1 << 24)
    outcomes = expect_list(raw[1], "kv snapshot cas outcomes", length_max=outcomes_max)
    return ({expect_str(key, "kv.key", length_max=256): _stored(value, "kv.value")
             for key, value in (_pair(item, "kv snapshot item") for item in items)},
            {_stored(new, "kv.new"): expect_bool(took_effect, "kv.took_effect")
             for new, took_effect in (_pair(item, "kv snapshot cas outcome")
                                      for item in outcomes)})


def _pair(raw: Any, field: str) -> Sequence[Any]:
    return expect_fields(expect_list(raw, field, length_max=2), field, 2)


def _stored(raw: Any, field: str) -> int:
    return expect_int(raw, field, low=-(1 << 62), high=1 << 62)
