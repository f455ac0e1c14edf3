"""Field checks for decoders: every decoded value is checked for type, range and size before use.

Decoders (the codec modules of every package) call these on the raw values msgpack returns; each
raises `InvalidMessage` naming the field and what was expected, so a bad frame is dropped with a
reason instead of reaching the protocol or the state machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from consensus.errors import InvalidMessage

INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1


def expect_int(value: object, field: str, *, low: int = 0, high: int = INT64_MAX) -> int:
    """An integer (never a bool) in [low, high]."""
    if type(value) is not int:
        raise InvalidMessage(f"{field}: expected an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidMessage(f"{field}: {value} is outside [{low}, {high}]")
    return value


def expect_bool(value: object, field: str) -> bool:
    if type(value) is not bool:
        raise InvalidMessage(f"{field}: expected a boolean, got {type(value).__name__}")
    return value


def expect_str(value: object, field: str, *, length_max: int, allow_empty: bool = False) -> str:
    if type(value) is not str:
        raise InvalidMessage(f"{field}: expected a string, got {type(value).__name__}")
    if len(value) > length_max:
        raise InvalidMessage(f"{field}: {len(value)} characters, more than {length_max}")
    if not value and not allow_empty:
        raise InvalidMessage(f"{field}: must not be empty")
    return value


def expect_bytes(value: object, field: str, *, length_max: int) -> bytes:
    if type(value) is not bytes:
        raise InvalidMessage(f"{field}: expected bytes, got {type(value).__name__}")
    if len(value) > length_max:
        raise InvalidMessage(f"{field}: {len(value)} bytes, more than {length_max}")
    return value


def expect_list(value: object, field: str, *, length_max: int) -> Sequence[Any]:
    if type(value) is not list:
        raise InvalidMessage(f"{field}: expected a list, got {type(value).__name__}")
    if len(value) > length_max:
        raise InvalidMessage(f"{field}: {len(value)} items, more than {length_max}")
    return value


def expect_map(value: object, field: str, *, length_max: int) -> Mapping[str, Any]:
    if type(value) is not dict:
        raise InvalidMessage(f"{field}: expected a map, got {type(value).__name__}")
    if len(value) > length_max:
        raise InvalidMessage(f"{field}: {len(value)} entries, more than {length_max}")
    return value


def expect_choice(value: object, field: str, choices: Sequence[str]) -> str:
    text = expect_str(value, field, length_max=max(len(choice) for choice in choices))
    if text not in choices:
        raise InvalidMessage(f"{field}: {text!r} is not one of {', '.join(choices)}")
    return text


def expect_fields(raw: Sequence[Any], field: str, count: int) -> Sequence[Any]:
    """A positional record (a msgpack array) with exactly `count` fields."""
    if len(raw) != count:
        raise InvalidMessage(f"{field}: expected {count} fields, got {len(raw)}")
    return raw
