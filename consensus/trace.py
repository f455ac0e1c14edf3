"""Deterministic one-line renderings of messages and batches, for logs and golden scripts."""

from __future__ import annotations

from dataclasses import fields

from consensus.messages import NO_CL, Batch, Message, OEntry

_PAYLOAD_CHARS_MAX = 12


def describe_batch(batch: Batch | None) -> str:
    if batch is None:
        return "<short>"
    if not batch:
        return "noop"
    return "[" + " ".join(_payload(command.payload) for command in batch) + "]"


def _payload(payload: bytes) -> str:
    text = payload.decode("utf-8", "replace")
    return text if len(text) <= _PAYLOAD_CHARS_MAX else text[:_PAYLOAD_CHARS_MAX] + "~"


def _value(value: int) -> str:
    return "-" if value == NO_CL else str(value)


def describe(message: Message) -> str:
    """e.g. `CAccept v0 space=1 index=0 ballot=1 batch=[a]`."""
    parts = [type(message).__name__, f"v{message.view}"]
    for item in fields(message):
        if item.name in ("sender", "view"):
            continue
        value = getattr(message, item.name)
        parts.append(f"{item.name}={_field(item.name, value)}")
    return " ".join(parts)


def _field(name: str, value: object) -> str:
    if name in ("batch", "commands"):
        return describe_batch(value)  # type: ignore[arg-type]
    if name in ("values", "o_values") and isinstance(value, tuple):
        return "[" + " ".join(_value(item) for item in value) + "]"
    if name == "entries" and isinstance(value, tuple):
        return "[" + " ".join(_entry(entry) for entry in value) + "]"
    if isinstance(value, tuple):
        return "[" + " ".join(str(item) for item in value) + "]"
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)


def _entry(entry: object) -> str:
    if isinstance(entry, OEntry):
        mark = "!" if entry.committed else ""
        return f"{entry.index}:{_value(entry.value)}@v{entry.view}{mark}"
    index = getattr(entry, "index", "?")
    ballot = getattr(entry, "ballot", "?")
    mark = "!" if getattr(entry, "committed", False) else ""
    return f"{index}:b{ballot}{describe_batch(getattr(entry, 'batch', None))}{mark}"
