"""Histories: what clients invoked and what they saw, in real-time order.

A history is a sequence of events. Each event is an invocation or a completion (`ok`: it took
effect and returned a value; `fail`: it certainly did not take effect; `info`: the outcome is
unknown) by one process. The event's position in the sequence is its logical time: no wall clock
is needed, and none is trusted. Event `i` happened before event `j` exactly when `i < j`.

Client processes are integers; each runs one operation at a time. Any other process (the string
"nemesis", say) marks events that are no client operation: partitions, crashes. They stay in the
history for reports and are ignored by the checker.

An operation pairs an invocation with its completion. One that never completes is treated as
`info`: it may take effect at any time after its invocation, or never. Jepsen gives a client
whose operation timed out a new process id; a process may also invoke again after an `info`, and
the old operation stays concurrent with everything after it.

`HistoryRecorder` is the API the simulator records through (and any client may); `History`
validates the event rules once, at construction, and pairs events into `Operation`s.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from jepsen.errors import HistoryError

# A value is what JSON and EDN can both carry, frozen so states and cache keys can hash it.
# Numbers are finite: JSON has no NaN or infinity, and a NaN equals nothing, not even itself.
Value: TypeAlias = bool | int | float | str | tuple["Value", ...] | None


@dataclass(frozen=True, slots=True)
class Exact:
    """A boolean or a float as a model's state holds it: equal (and hashed) together with its
    type, so `Exact("bool", True)` is neither `1` nor `Exact("float", 1.0)`."""

    type_name: str
    value: bool | float


def exact(value: Value) -> Hashable:
    """`value` as a model compares it: booleans and floats (also inside lists) wrapped in
    `Exact`; integers, strings and nil, which Python's `==` already keeps apart, as they are."""
    if isinstance(value, bool | float):
        return Exact(type(value).__name__, value)
    if isinstance(value, tuple):
        return tuple(exact(item) for item in value)
    return value


def same_value(first: Value, second: Value) -> bool:
    """Equal in type and value, as JSON and EDN see it: `true` is not `1`, `2.0` is not `2`."""
    return exact(first) == exact(second)


# A client process is an integer; any other process (a string) is no client.
Process: TypeAlias = int | str

NEMESIS = "nemesis"


class EventType(enum.StrEnum):
    INVOKE = "invoke"
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class Event:
    """One invocation or completion. `index` is the event's position in its history."""

    index: int
    process: Process
    type: EventType
    f: str
    value: Value = None
    key: Value = None

    @property
    def is_client(self) -> bool:
        return is_client_process(self.process)


@dataclass(frozen=True, slots=True)
class Operation:
    """An invocation paired with its completion.

    `input` is the invocation's value (the arguments); `output` the completion's value when
    `status` is ok, else None. `call` and `ret` are event indices; `ret` is None for an
    operation that never completed. The checker places the return of an `info` operation at
    +infinity, whatever `ret` says.
    """

    id: int
    process: int
    f: str
    key: Value
    input: Value
    output: Value
    status: EventType
    call: int
    ret: int | None

    @property
    def is_ok(self) -> bool:
        return self.status is EventType.OK


def is_client_process(process: Process) -> bool:
    return isinstance(process, int) and not isinstance(process, bool)


def freeze(value: object) -> Value:
    """A JSON-shaped Python value as a `Value`: lists become tuples; anything else (a NaN or an
    infinity included) is refused."""
    if isinstance(value, float) and not math.isfinite(value):
        raise TypeError(f"a history number is finite; got {value}")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return tuple(freeze(item) for item in value)
    raise TypeError(f"a history value is null, a boolean, a number, a string or a list of "
                    f"those; got {type(value).__name__}")


def is_finite(value: Value) -> bool:
    """No NaN or infinity anywhere in `value` (a reader may have parsed one: `1e999`, `##NaN`)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, tuple):
        return all(is_finite(item) for item in value)
    return True


class History:
    """An immutable, validated sequence of events and the operations they pair into.

    `lines`, when given, holds the source line of each event, so errors and reports can point
    into the file the history came from (`source`).
    """

    __slots__ = ("events", "lines", "operations", "source")

    def __init__(self, events: Iterable[Event], *, source: str | None = None,
                 lines: Sequence[int] | None = None) -> None:
        self.events: tuple[Event, ...] = tuple(events)
        self.source = source
        self.lines: tuple[int, ...] | None = None if lines is None else tuple(lines)
        if self.lines is not None and len(self.lines) != len(self.events):
            raise ValueError("lines must give one source line per event")
        self.operations: tuple[Operation, ...] = _pair(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        return f"History({len(self.events)} events, {len(self.operations)} operations)"

    @property
    def client_events(self) -> tuple[Event, ...]:
        return tuple(event for event in self.events if event.is_client)

    @property
    def other_events(self) -> tuple[Event, ...]:
        """Events of non-client processes (the nemesis): kept for reports, never checked."""
        return tuple(event for event in self.events if not event.is_client)

    def line_of(self, event_index: int) -> int | None:
        return None if self.lines is None else self.lines[event_index]

    def where(self, event_index: int) -> str:
        """A short location for messages: the file and line when known, else the event."""
        line = self.line_of(event_index)
        if line is None:
            return f"event {event_index}"
        return f"{self.source or 'history'}:{line}"


def _check_event(position: int, event: Event) -> None:
    if event.index != position:
        raise HistoryError(f"its index says {event.index}", index=position)
    if not isinstance(event.process, int | str):
        raise HistoryError("a process is an integer or a string",
                           index=position)
    if not isinstance(event.type, EventType):
        raise HistoryError(f"unknown type {event.type!r}", index=position)
    if not isinstance(event.f, str) or not event.f:
        raise HistoryError("the function must be a non-empty string",
                           index=position)


def _pair(events: Sequence[Event]) -> tuple[Operation, ...]:
    """Pair each client invocation with its completion, checking the event rules."""
    pending: dict[int, Event] = {}
    completions: dict[int, Event] = {}  # invocation index -> completion
    invocations: list[Event] = []
    for position, event in enumerate(events):
        _check_event(position, event)
        if not event.is_client:
            continue
        assert isinstance(event.process, int)
        invocation = pending.get(event.process)
        if event.type is EventType.INVOKE:
            if invocation is not None:
                raise HistoryError(
                    f"process {event.process} invokes {event.f} while its "
                    f"{invocation.f} (event {invocation.index}) is still pending", index=position)
            pending[event.process] = event
            invocations.append(event)
            continue
        if invocation is None:
            raise HistoryError(
                f"process {event.process} completes {event.f} ({event.type}) "
                f"but has no pending invocation", index=position)
        if invocation.f != event.f:
            raise HistoryError(
                f"process {event.process} completes {event.f} but invoked "
                f"{invocation.f} (event {invocation.index})", index=position)
        if event.key is not None and not same_value(event.key, invocation.key):
            raise HistoryError(f"completion for key {event.key!r} of an "
                               f"invocation for key {invocation.key!r}", index=position)
        completions[invocation.index] = event
        del pending[event.process]
    return tuple(_operation(number, invocation, completions.get(invocation.index))
                 for number, invocation in enumerate(invocations))


def _operation(number: int, invocation: Event, completion: Event | None) -> Operation:
    assert isinstance(invocation.process, int)
    status = EventType.INFO if completion is None else completion.type
    output = completion.value if completion is not None and status is EventType.OK else None
    return Operation(id=number, process=invocation.process, f=invocation.f, key=invocation.key,
                     input=invocation.value, output=output, status=status,
                     call=invocation.index, ret=None if completion is None else completion.index)


@dataclass(frozen=True, slots=True)
class Handle:
    """What `HistoryRecorder.invoke` returns: the operation to complete later."""

    process: int
    f: str
    key: Value
    index: int


class HistoryRecorder:
    """Records a history as it happens: the order of calls is the real-time order.

    The simulator calls `invoke` when a client sends a request and `complete` when it sees the
    reply (`ok`), a definite rejection (`fail`), or gives up not knowing (`info`). A client
    process runs one operation at a time; after an `info` it should continue under a new
    process id, as Jepsen's clients do. `nemesis` records a fault for the report.
    """

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._pending: dict[int, Handle] = {}

    def __len__(self) -> int:
        return len(self._events)

    def invoke(self, process: int, f: str, value: object = None, *,
               key: object = None) -> Handle:
        if not is_client_process(process):
            raise HistoryError(f"a client process is an integer, got {process!r}")
        if process in self._pending:
            raise HistoryError(f"process {process} invokes {f} while "
                               f"{self._pending[process].f} is pending")
        handle = Handle(process=process, f=f, key=freeze(key), index=len(self._events))
        self._events.append(Event(len(self._events), process, EventType.INVOKE, f,
                                  freeze(value), handle.key))
        self._pending[process] = handle
        return handle

    def complete(self, handle: Handle, type: EventType | str, value: object = None) -> None:
        kind = EventType(type)
        if kind is EventType.INVOKE:
            raise HistoryError("a completion is ok, fail or info, not invoke")
        if self._pending.get(handle.process) != handle:
            raise HistoryError(f"operation {handle.f} of process {handle.process} (event "
                               f"{handle.index}) is not pending")
        del self._pending[handle.process]
        self._events.append(Event(len(self._events), handle.process, kind, handle.f,
                                  freeze(value), handle.key))

    def ok(self, handle: Handle, value: object = None) -> None:
        self.complete(handle, EventType.OK, value)

    def fail(self, handle: Handle, value: object = None) -> None:
        self.complete(handle, EventType.FAIL, value)

    def info(self, handle: Handle, value: object = None) -> None:
        self.complete(handle, EventType.INFO, value)

    def nemesis(self, f: str, value: object = None, *, process: str = NEMESIS,
                type: EventType | str = EventType.INFO) -> None:
        """Record a fault (or anything else no client did): shown in reports, never checked."""
        if is_client_process(process):
            raise HistoryError(f"a nemesis process is not an integer, got {process!r}")
        self._events.append(Event(len(self._events), process, EventType(type), f,
                                  freeze(value)))

    def pending(self) -> tuple[Handle, ...]:
        return tuple(self._pending.values())

    def history(self, *, source: str | None = None) -> History:
        """The history so far. Operations still pending count as `info` (outcome unknown)."""
        return History(self._events, source=source)
