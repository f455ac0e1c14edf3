"""Reading decoded msgpack values field by field, with errors that name the path.

Every decoder of the state machine (commands, configuration, queries, snapshots) reads maps
through `Record`, which refuses unknown fields, checks type, range and size with the checks of
`consensus.validation`, and raises `DecodeError` carrying the rejection to reply with
(`submit_group.members[1].gpus: 0 is outside [1, 64]`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from consensus.codec import unpack
from consensus.errors import InvalidMessage
from consensus.validation import INT64_MAX, expect_bool, expect_int, expect_list, expect_str
from statemachine import limits
from statemachine.errors import Code, Rejection

T = TypeVar("T")


class DecodeError(Exception):
    """A body that is not a valid command or query; carries the rejection to reply with, and
    the one the rules before `rules.PLAIN_MSGPACK_REFUSALS` replied with (`rejection_before`:
    for a body that is not msgpack, the library's words, which differ between its C extension
    and its pure-Python fallback; the same rejection otherwise)."""

    def __init__(self, code: Code, message: str, *, message_before: str | None = None) -> None:
        super().__init__(message)
        self.rejection = Rejection(code=code, message=message)
        self.rejection_before = self.rejection if message_before is None else Rejection(
            code=code, message=message_before)


class Record:
    """One msgpack map being read field by field; every error names the path."""

    __slots__ = ("path", "raw")

    def __init__(self, raw: object, path: str, fields: Sequence[str]) -> None:
        if type(raw) is not dict:
            raise DecodeError(Code.MALFORMED, f"{path}: expected a map, got {type(raw).__name__}")
        unknown = sorted(str(key) for key in raw if key not in fields)
        if unknown:
            raise DecodeError(Code.MALFORMED, f"{path}: unknown field {unknown[0]!r}")
        self.raw: dict[str, Any] = raw
        self.path = path

    def _field(self, name: str) -> Any:
        if name not in self.raw:
            raise DecodeError(Code.MALFORMED, f"{self.path}.{name}: missing")
        return self.raw[name]

    def has(self, name: str) -> bool:
        return name in self.raw

    def text(self, name: str, *, length_max: int = limits.NAME_LENGTH_MAX,
             allow_empty: bool = False) -> str:
        return checked(expect_str, self._field(name), f"{self.path}.{name}",
                        length_max=length_max, allow_empty=allow_empty)

    def integer(self, name: str, *, low: int = 0, high: int = INT64_MAX) -> int:
        return checked(expect_int, self._field(name), f"{self.path}.{name}", low=low, high=high)

    def flag(self, name: str) -> bool:
        return checked(expect_bool, self._field(name), f"{self.path}.{name}")

    def items(self, name: str, *, length_max: int) -> Sequence[Any]:
        return checked(expect_list, self._field(name), f"{self.path}.{name}",
                        length_max=length_max)

    def records(self, name: str, fields: Sequence[str], *, length_max: int) -> list[Record]:
        return [Record(item, f"{self.path}.{name}[{index}]", fields)
                for index, item in enumerate(self.items(name, length_max=length_max))]

    def record(self, name: str, fields: Sequence[str]) -> Record:
        return Record(self._field(name), f"{self.path}.{name}", fields)

    def choice(self, name: str, choices: Sequence[str]) -> str:
        value = self.text(name, length_max=64)
        if value not in choices:
            raise DecodeError(Code.MALFORMED, f"{self.path}.{name}: {value!r} is not one of "
                                              f"{', '.join(choices)}")
        return value


def checked(check: Callable[..., T], value: object, field: str, **limits_: Any) -> T:
    try:
        return check(value, field, **limits_)
    except InvalidMessage as error:
        raise DecodeError(Code.MALFORMED, error.reason) from error


def unpack_body(data: bytes, *, bytes_max: int, what: str) -> Any:
    if len(data) > bytes_max:
        raise DecodeError(Code.TOO_LARGE, f"{what}: {len(data)} bytes, more than {bytes_max}")
    try:
        return unpack(data, bytes_max=bytes_max, what=what)
    except InvalidMessage as error:  # the library's words stay out of a replicated reply
        raise DecodeError(Code.MALFORMED, f"{what}: not valid msgpack",
                          message_before=error.reason) from error


def open_body(data: bytes, *, bytes_max: int, what: str, types: Sequence[str],
              exact_version: bool = True) -> tuple[str, Any]:
    """Check size, msgpack, the version and the type; return (type, raw map).

    A version that is present but not an integer (`true`, `1.0`: Python's bool is an int, and
    1.0 == 1) is MALFORMED, in the words of every other integer field. Not `exact_version`:
    the rules before `rules.EXACT_SCHEMA_VERSION`, which compared it with `==` and so took
    those for 1 (a command replayed from a log written then applies as it did)."""
    raw = unpack_body(data, bytes_max=bytes_max, what=what)
    if type(raw) is not dict:
        raise DecodeError(Code.MALFORMED, f"{what}: expected a map, got {type(raw).__name__}")
    version = raw.get("v")
    if exact_version and version is not None and type(version) is not int:
        checked(expect_int, version, f"{what}.v")  # raises, naming the type it got
    if version != limits.SCHEMA_VERSION:
        raise DecodeError(Code.UNSUPPORTED_VERSION,
                          f"{what}.v: {version!r}, this replica speaks {limits.SCHEMA_VERSION}")
    kind = raw.get("type")
    if type(kind) is not str:
        raise DecodeError(Code.MALFORMED, f"{what}.type: missing or not a string")
    if kind not in types:
        raise DecodeError(Code.UNKNOWN_COMMAND, f"{what}.type: unknown {what} {kind[:64]!r}")
    return kind, raw


def pod_command(record: Record) -> tuple[str, ...]:
    """A binding's argv (optional: absent means nothing to run): a non-empty program, at most
    POD_COMMAND_ARGS_MAX arguments of POD_COMMAND_BYTES_MAX UTF-8 bytes together."""
    if not record.has("command"):
        return ()
    items = record.items("command", length_max=limits.POD_COMMAND_ARGS_MAX)
    argv = tuple(checked(expect_str, item, f"{record.path}.command[{index}]",
                         length_max=limits.POD_COMMAND_BYTES_MAX, allow_empty=index > 0)
                 for index, item in enumerate(items))
    size = sum(len(arg.encode("utf-8", "surrogatepass")) for arg in argv)
    if size > limits.POD_COMMAND_BYTES_MAX:
        raise DecodeError(Code.TOO_LARGE, f"{record.path}.command: {size} bytes, at most "
                                          f"{limits.POD_COMMAND_BYTES_MAX}")
    return argv
