"""An undo log that makes every command atomic: validate, plan, commit, or roll back to nothing.

Every mutation of the replicated state goes through a journaled primitive that records how to
undo it. `apply` marks the journal before a command and rolls back to the mark when the command
is refused, so a rejection leaves the state exactly as it was. The scheduler uses inner marks to
try a plan (a lazy preemption, a binding) and abandon it without a trace.

The journal is transient: it is empty between commands and never part of a snapshot. Undo
restores values and container contents; code never depends on dict insertion order (it always
iterates sorted), so re-inserting a key at the end is an exact undo.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")
_MISSING = object()


class Journal:
    __slots__ = ("_undo",)

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def mark(self) -> int:
        return len(self._undo)

    def rollback(self, mark: int) -> None:
        assert 0 <= mark <= len(self._undo)
        while len(self._undo) > mark:
            self._undo.pop()()

    def forget(self) -> None:
        """The command committed: its undo records are no longer needed."""
        self._undo.clear()

    @property
    def empty(self) -> bool:
        return not self._undo

    def record(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def set_attr(self, target: object, name: str, value: object) -> None:
        old = getattr(target, name)
        if old is value:
            return
        setattr(target, name, value)
        self._undo.append(lambda: setattr(target, name, old))

    def set_item(self, mapping: MutableMapping[K, V], key: K, value: V) -> None:
        old: Any = mapping.get(key, _MISSING)
        mapping[key] = value
        if old is _MISSING:
            self._undo.append(lambda: mapping.__delitem__(key))
        else:
            self._undo.append(lambda: mapping.__setitem__(key, old))

    def del_item(self, mapping: MutableMapping[K, V], key: K) -> None:
        old = mapping.pop(key)
        self._undo.append(lambda: mapping.__setitem__(key, old))

    def append(self, items: list[V], value: V) -> None:
        items.append(value)
        self._undo.append(lambda: items.__delitem__(-1))

    def set_index(self, items: list[V], index: int, value: V) -> None:
        old = items[index]
        items[index] = value
        self._undo.append(lambda: items.__setitem__(index, old))
