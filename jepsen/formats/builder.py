"""Collects the events a reader finds, with their source lines, into a validated `History`.

A history that breaks the event rules (a completion with nothing pending, say) is a malformed
file: the `HistoryError` becomes a `HistoryFormatError` that names the line of the event. So is
a value with a number that is not finite (`1e999`, `##Inf`, `NaN`): no history value is.
"""

from __future__ import annotations

from jepsen.errors import HistoryError, HistoryFormatError
from jepsen.history import Event, EventType, History, Process, Value, is_finite


class EventsBuilder:
    def __init__(self, source: str) -> None:
        self.source = source
        self.events: list[Event] = []
        self.lines: list[int] = []

    def add(self, line: int, process: Process, type: EventType, f: str, *, value: Value = None,
            key: Value = None) -> None:
        for what, item in (("value", value), ("key", key)):
            if not is_finite(item):
                raise HistoryFormatError(self.source, line, f"a {what} with finite numbers only",
                                         found=repr(item))
        self.events.append(Event(len(self.events), process, type, f, value, key))
        self.lines.append(line)

    def build(self) -> History:
        try:
            return History(self.events, source=self.source, lines=self.lines)
        except HistoryFormatError:
            raise
        except HistoryError as error:
            line = None if error.index is None else self.lines[error.index]
            raise HistoryFormatError(self.source, line, "events that pair up into operations",
                                     found=error.message) from None
