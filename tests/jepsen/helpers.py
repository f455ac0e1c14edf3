"""Shared test helpers: a compact notation for hand-written histories, and a brute-force
linearizability check to hold the real one against."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence

from jepsen.history import Event, EventType, History, Operation, freeze
from jepsen.models import ILLEGAL, Model, State


def history(text: str) -> History:
    """One event per line: `PROCESS TYPE F [VALUE-as-JSON] [key=KEY]`, in real-time order.

        0 invoke write 1
        1 invoke read
        1 ok read 1
        0 ok write 1
    """
    events: list[Event] = []
    for raw in text.strip().splitlines():
        words = raw.split("#")[0].split()
        if not words:
            continue
        key = None
        if words[-1].startswith("key="):
            key = words.pop()[4:]
        process: int | str = int(words[0]) if words[0].lstrip("-").isdigit() else words[0]
        value = freeze(json.loads(" ".join(words[3:]))) if len(words) > 3 else None
        events.append(Event(len(events), process, EventType(words[1]), words[2], value, key))
    return History(events)


def brute_force(model: Model, operations: Sequence[Operation],
                skippable: frozenset[int] = frozenset()) -> bool:
    """Is there an order of the operations that must happen (ok) and of any subset of those
    that may (info, and ok ones named `skippable`), consistent with real time, that the model
    accepts? Fail ops are dropped. Exponential: for a handful of operations only."""
    required = [op for op in operations if op.status is EventType.OK and op.id not in skippable]
    optional = [op for op in operations if op.status is EventType.INFO
                or (op.status is EventType.OK and op.id in skippable)]
    for size in range(len(optional) + 1):
        for chosen in itertools.combinations(optional, size):
            if _some_order_works(model, [*required, *chosen]):
                return True
    return False


def _returns(op: Operation) -> float:
    return float("inf") if op.status is not EventType.OK or op.ret is None else op.ret


def _some_order_works(model: Model, operations: list[Operation]) -> bool:
    for order in itertools.permutations(operations):
        if _respects_real_time(order) and _legal(model, order):
            return True
    return False


def _respects_real_time(order: Sequence[Operation]) -> bool:
    return all(not _returns(later) < earlier.call
               for index, earlier in enumerate(order) for later in order[index + 1:])


def _legal(model: Model, order: Sequence[Operation]) -> bool:
    state: State = model.initial_state()
    for op in order:
        result = model.step(state, op)
        if result is ILLEGAL:
            return False
        state = result
    return True


def witness_is_valid(model: Model, hist: History, steps: Sequence[tuple[int, State]]) -> bool:
    """Does the claimed linearization respect real time, include every ok operation, and
    agree with the model at every step?"""
    operations = [hist.operations[number] for number, _ in steps]
    if not _respects_real_time(operations):
        return False
    state: State = model.initial_state()
    for op, (_, claimed) in zip(operations, steps, strict=True):
        result = model.step(state, op)
        if result is ILLEGAL or result != claimed:
            return False
        state = result
    return True
