"""Cellar's own history format: JSON lines, one event per line, in real-time order.

    {"cellar-history": 1, "initial": 0}
    {"index": 0, "process": 0, "type": "invoke", "f": "write", "value": 3}
    {"index": 1, "process": 0, "type": "ok", "f": "write", "value": 3}
    {"index": 2, "process": "nemesis", "type": "info", "f": "partition", "value": "n1 | n2 n3"}

The first line is an optional header: the format's version and, optionally, the initial value of
the register or of every key. Each event gives its process (an integer for a client, a string
for anything else), its type (invoke, ok, fail, info), its function, its value (JSON null,
boolean, finite number, string or list, nested at most `DEPTH_MAX` deep) and, for per-key
operations, its key. `index`, when present, must equal the event's position: the line order is
the real-time order.
"""

from __future__ import annotations

import json

from jepsen.errors import HistoryFormatError
from jepsen.formats.builder import EventsBuilder
from jepsen.formats.edn import DEPTH_MAX
from jepsen.history import Event, EventType, History, Value, freeze

NAME = "jsonl"
HEADER_KEY = "cellar-history"
VERSION = 1
UNSET = object()


def dumps(history: History, *, initial: object = UNSET) -> str:
    """The history as JSON lines, header first; `initial` goes into the header when given."""
    header: dict[str, object] = {HEADER_KEY: VERSION}
    if initial is not UNSET:
        header["initial"] = initial
    lines = [json.dumps(header)]
    lines.extend(json.dumps(_event_object(event), ensure_ascii=False) for event in history.events)
    return "\n".join(lines) + "\n"


def _event_object(event: Event) -> dict[str, object]:
    record: dict[str, object] = {"index": event.index, "process": event.process,
                                 "type": event.type.value, "f": event.f, "value": event.value}
    if event.key is not None:
        record["key"] = event.key
    return record


def _field(record: dict[str, object], name: str, source: str, line: int) -> object:
    if name not in record:
        raise HistoryFormatError(source, line, f'a "{name}" field')
    return record[name]


def _value(raw: object, what: str, source: str, line: int) -> Value:
    try:
        return freeze(raw)
    except TypeError:
        raise HistoryFormatError(source, line, f"{what} that is null, a boolean, a finite "
                                 f"number, a string or a list", found=json.dumps(raw)) from None


def _add_event(builder: EventsBuilder, record: dict[str, object], line: int) -> None:
    source = builder.source
    process = _field(record, "process", source, line)
    if isinstance(process, bool) or not isinstance(process, int | str):
        raise HistoryFormatError(source, line, "a process that is an integer or a string",
                                 found=json.dumps(process))
    kind = _field(record, "type", source, line)
    if kind not in {member.value for member in EventType}:
        raise HistoryFormatError(source, line, "a type of invoke, ok, fail or info",
                                 found=json.dumps(kind))
    f = _field(record, "f", source, line)
    if not isinstance(f, str) or not f:
        raise HistoryFormatError(source, line, "a function name", found=json.dumps(f))
    index = record.get("index", len(builder.events))
    if index != len(builder.events):
        raise HistoryFormatError(source, line, f"index {len(builder.events)} (events are in "
                                 f"real-time order)", found=json.dumps(index))
    builder.add(line, process, EventType(kind), f,
                value=_value(record.get("value"), "a value", source, line),
                key=_value(record.get("key"), "a key", source, line))


def deeper_than(raw: object, levels: int) -> bool:
    """Do lists and objects nest more than `levels` deep in this decoded JSON value?"""
    if isinstance(raw, dict):
        raw = list(raw.values())
    if not isinstance(raw, list):
        return False
    return levels == 0 or any(deeper_than(item, levels - 1) for item in raw)


def _too_deep(source: str, line: int) -> HistoryFormatError:
    return HistoryFormatError(source, line, f"a JSON object nested at most {DEPTH_MAX} deep")


def _unique_names(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object, refused (as a ValueError) when it names a field twice: the decoder
    would keep the last and drop the other silently."""
    record: dict[str, object] = {}
    for name, value in pairs:
        if name in record:
            raise ValueError(f"field {json.dumps(name)} given twice")
        record[name] = value
    return record


def _record(raw: str, source: str, line: int) -> object:
    """One line decoded; nesting deeper than `DEPTH_MAX` is refused (deeper than the decoder's
    recursion allows, it cannot even be decoded)."""
    try:
        record = json.loads(raw, object_pairs_hook=_unique_names)
    except json.JSONDecodeError as error:
        raise HistoryFormatError(source, line, "a JSON object",
                                 found=error.msg.lower()) from None
    except RecursionError:
        raise _too_deep(source, line) from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise HistoryFormatError(source, line, "a JSON object", found=str(error)) from None
    if raw.count("[") + raw.count("{") > DEPTH_MAX and deeper_than(record, DEPTH_MAX):
        raise _too_deep(source, line)
    return record


def parse(text: str, source: str) -> tuple[History, object]:
    """The history in `text`, and the initial value its header names (or UNSET)."""
    builder = EventsBuilder(source)
    initial: object = UNSET
    header_seen = False
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        record = _record(raw, source, number)
        if not isinstance(record, dict):
            raise HistoryFormatError(source, number, "a JSON object", found=type(record).__name__)
        if HEADER_KEY in record:
            if builder.events or header_seen or record[HEADER_KEY] != VERSION:
                raise HistoryFormatError(source, number, f"one header, first, of version "
                                         f"{VERSION}", found=raw.strip()[:60])
            header_seen = True
            if "initial" in record:
                initial = _value(record["initial"], "an initial value", source, number)
            continue
        _add_event(builder, record, number)
    return builder.build(), initial
