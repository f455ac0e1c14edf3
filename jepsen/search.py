"""The Wing-Gong-Lowe search for a linearization of one (partition of a) history.

Theory of operation. Every operation contributes a call entry and a return entry; the entries
sit in a doubly-linked list in real-time order (calls before returns at equal times: intervals
are closed, so operations whose ends touch are concurrent). The search walks the list from the
front. At a call it tries to linearize that operation next: if the model's step is legal and
the configuration (set of linearized operations, state) was never reached before, it pushes the
call on a stack, takes the new state and "lifts" the call and its return out of the list, then
starts again from the front. Reaching a return means the operation it closes should already
have been linearized: the search pops the last choice, puts its entries back and tries the call
after it. An empty list means every operation is linearized: the stack is a witness. A return
with an empty stack means no order works.

Lowe's memoisation is what keeps this tractable: a configuration that failed once fails again,
so each (bitmask of linearized operations, state) pair is explored at most once. The bitmask is
a Python int; the cache a set of (int, state) pairs.

Operations whose outcome is unknown (`info`, or pending at a cut) return at +infinity: they may
take effect anywhere after their call. They are also optional: the return entries at infinity
come after every other entry, so the search reaching one of them has linearized every operation
that must be, and the optional ones still in the list simply never took effect.

`Search.run(budget)` stops after `budget` model steps and can be resumed, so the checker can
round-robin partitions and give up on time without threads. `Pace` runs one such slice in
pieces short in time, so that a deadline is noticed within about `PACE_S` whatever a model's
step costs: a register's step takes a microsecond, the GPU state machine's a millisecond, and a
slice of 65,536 of those had overrun a time budget by a minute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from jepsen.models import ILLEGAL, State, Stepper
from jepsen.verdict import Step, Verdict


class Item(NamedTuple):
    """One operation as the search sees it: its id, real-time interval and compiled step.

    `ret` is None for an operation that may or may not take effect (it returns at infinity).
    A `skippable` operation with a finite `ret` takes effect within its interval or not at all.
    """

    operation: int
    call: int
    ret: int | None
    step: Stepper
    skippable: bool = False  # may also not take effect at all (a relaxation: see diagnosis)


def _time_order(items: Sequence[Item]) -> list[tuple[int, bool]]:
    """(item index, is_call) for every entry, in real-time order; infinite returns last."""
    keyed: list[tuple[int, int, int, int, bool]] = []
    for index, item in enumerate(items):
        keyed.append((0, item.call, 0, index, True))
        if item.ret is None:
            keyed.append((1, 0, 1, index, False))
        else:
            assert item.ret > item.call, "an operation returns after it is called"
            keyed.append((0, item.ret, 1, index, False))
    keyed.sort()
    return [(index, is_call) for _, _, _, index, is_call in keyed]


CACHE_ENTRY_OVERHEAD_BYTES = 160
UNBOUNDED = 1 << 62  # a `Search.run` with no bound on its cache's bytes


def state_bytes(state: State) -> int:
    """What a state may hold of its own, beyond the cache entry's overhead: the characters of
    a string (an `append`'s value), the slots and strings of a tuple (an unpartitioned map),
    the data of a snapshot. An over-estimate where parts are shared, as a budget should be."""
    if isinstance(state, str | bytes):
        return len(state)
    if isinstance(state, tuple):
        return 8 * len(state) + sum(state_bytes(item) for item in state)
    data = getattr(state, "data", None)
    return len(data) if isinstance(data, bytes) else 0

# The memoisation's memory, summed over a check's parts (and for each trial of a diagnosis):
# past it the verdict is unknown, said so, rather than the process killed for memory (which a
# caller would read as a failed check).
CACHE_BYTES_MAX = 2 << 30


class Search:
    """A resumable WGL search with memoisation over one sequence of operations."""

    __slots__ = ("_bit_of", "_bytes", "_cache", "_entry", "_item_of", "_mask", "_next", "_optional",
                 "_previous", "_return_of", "_skippable", "_stack", "_state", "_step_of", "_tail",
                 "entry_bytes", "items", "steps", "verdict")

    def __init__(self, items: Sequence[Item], initial_state: State) -> None:
        self.items = tuple(items)
        self.steps = 0
        self.verdict: Verdict | None = None
        order = _time_order(self.items)
        size = len(order)
        # Entries are numbered 1..size in time order; 0 is the head, size + 1 the tail.
        self._tail = size + 1
        self._next = [*range(1, size + 2), 0]
        self._previous = [0, *range(size + 1)]
        self._return_of = [0] * (size + 2)  # call entry -> its return entry; 0 for returns
        self._step_of: list[Stepper | None] = [None] * (size + 2)
        self._bit_of = [0] * (size + 2)
        self._item_of = [0] * (size + 2)
        self._optional = [False] * (size + 2)  # return entries at infinity
        self._skippable = [False] * (size + 2)  # call entries that may also be a no-op
        entry_of_call: dict[int, int] = {}
        for entry, (index, is_call) in enumerate(order, start=1):
            self._item_of[entry] = index
            if is_call:
                entry_of_call[index] = entry
                self._step_of[entry] = self.items[index].step
                self._bit_of[entry] = 1 << index
                self._skippable[entry] = (self.items[index].skippable
                                          and self.items[index].ret is not None)
            else:
                self._return_of[entry_of_call[index]] = entry
                self._optional[entry] = self.items[index].ret is None
        self._cache: set[tuple[int, State]] = set()
        # What one cached configuration may hold at most: its mask, as wide as the search, the
        # tuple and the set's slot (the state is mostly shared with the stack's).
        self.entry_bytes = CACHE_ENTRY_OVERHEAD_BYTES + size // 8
        self._bytes = 0  # what the cache holds: entry_bytes per entry, and each new state
        self._stack: list[tuple[int, State, int]] = []
        self._entry = self._next[0]
        self._state = initial_state
        self._mask = 0
        if size == 0:
            self.verdict = Verdict.LINEARIZABLE

    def run(self, budget: int, bytes_max: int = UNBOUNDED  # noqa: PLR0912, PLR0915
            ) -> Verdict | None:
        """Search for at most `budget` more steps, while the cache holds at most `bytes_max`
        (`cache_bytes`); the verdict, or None if not done yet."""
        assert budget > 0
        if self.verdict is not None:
            return self.verdict
        next_, previous, return_of, step_of = (self._next, self._previous, self._return_of,
                                               self._step_of)
        bit_of, optional, skippable = self._bit_of, self._optional, self._skippable
        cache, stack = self._cache, self._stack
        tail, entry, state, mask = self._tail, self._entry, self._state, self._mask
        steps, verdict, entry_bytes, held = 0, None, self.entry_bytes, self._bytes
        while steps < budget and held <= bytes_max:
            return_entry = return_of[entry]
            if return_entry:  # a call: try to linearize it next
                steps += 1
                new_state = step_of[entry](state)
                new_mask = -1
                if new_state is not ILLEGAL:
                    new_mask = mask | bit_of[entry]
                    configuration = (new_mask, new_state)
                    if configuration in cache:
                        new_mask = -1
                    else:
                        cache.add(configuration)
                        stack.append((entry, state, mask))
                        held += entry_bytes + state_bytes(new_state)
                if new_mask < 0 and skippable[entry]:
                    new_state, new_mask = state, self._skip(entry, state, mask)
                    held += entry_bytes if new_mask >= 0 else 0
                if new_mask < 0:
                    entry = next_[entry]
                    continue
                state, mask = new_state, new_mask
                before, after = previous[entry], next_[entry]
                next_[before], previous[after] = after, before
                before, after = previous[return_entry], next_[return_entry]
                next_[before], previous[after] = after, before
                entry = next_[0]
                if entry == tail:
                    verdict = Verdict.LINEARIZABLE
                    break
            elif optional[entry]:  # only optional operations are left: they never happened
                verdict = Verdict.LINEARIZABLE
                break
            elif not stack:
                verdict = Verdict.NOT_LINEARIZABLE
                break
            else:  # backtrack: undo the last choice, or take its other alternative
                taken, state, mask = stack.pop()
                entry = -taken if taken < 0 else taken
                if taken > 0 and skippable[entry]:
                    new_mask = self._skip(entry, state, mask)
                    if new_mask >= 0:  # still lifted, now as a no-op
                        held += entry_bytes
                        mask, entry = new_mask, next_[0]
                        if entry == tail:
                            verdict = Verdict.LINEARIZABLE
                            break
                        continue
                return_entry = return_of[entry]
                next_[previous[return_entry]] = return_entry
                previous[next_[return_entry]] = return_entry
                next_[previous[entry]] = entry
                previous[next_[entry]] = entry
                entry = next_[entry]
        self._entry, self._state, self._mask, self._bytes = entry, state, mask, held
        self.steps, self.verdict = self.steps + steps, verdict
        return verdict

    @property
    def cache_bytes(self) -> int:
        """A bound on the memory its memoisation holds: `entry_bytes` per entry, and what each
        state cached there holds of its own (`state_bytes`)."""
        return self._bytes

    def _skip(self, entry: int, state: State, mask: int) -> int:
        """Take a skippable call as a no-op, if that configuration is new: pushes the choice
        (as a negative entry) and returns the new mask; -1 when it was seen before."""
        new_mask = mask | self._bit_of[entry]
        configuration = (new_mask, state)
        if configuration in self._cache:
            return -1
        self._cache.add(configuration)
        self._stack.append((-entry, state, mask))
        return new_mask

    def linearization(self) -> tuple[Step, ...]:
        """The witness of a linearizable verdict: operations in order, with the state after
        each. Optional operations that never took effect are not in it."""
        assert self.verdict is Verdict.LINEARIZABLE
        if not self._stack:
            return ()
        states = [state for _, state, _ in self._stack[1:]] + [self._state]
        return tuple(Step(self.items[self._item_of[entry]].operation, after)
                     for (entry, _, _), after in zip(self._stack, states, strict=True)
                     if entry > 0)


PACE_S = 0.1  # how late a deadline may be noticed within one slice of a search
PACE_STEPS_FIRST = 64  # the first piece's steps, before the rate of steps is known


@dataclass(slots=True)
class Pace:
    """Runs slices of searches in pieces that take about `PACE_S` each at the rate of steps
    measured so far, checking `deadline` (by `clock`) between them. Without a deadline a slice
    runs whole, and the clock is never read."""

    deadline: float | None
    clock: Callable[[], float]
    steps: int = 0  # steps measured, and the seconds they took
    seconds: float = 0.0

    def _piece(self) -> int:
        if self.steps == 0:
            return PACE_STEPS_FIRST
        if self.seconds <= 0:  # a clock too coarse to tell yet: grow the pieces
            return 2 * self.steps
        return max(1, int(PACE_S * self.steps / self.seconds))

    def run(self, search: Search, budget: int, bytes_max: int = UNBOUNDED
            ) -> tuple[Verdict | None, bool]:
        """`search.run(budget, bytes_max)`, in pieces: its verdict (None if not done yet) and
        whether the deadline passed before the slice was done. The caller has seen the
        deadline ahead: the first piece runs."""
        deadline = self.deadline
        if deadline is None:
            return search.run(budget, bytes_max), False
        started = self.clock()
        while True:
            piece = min(budget, self._piece())
            before = search.steps
            verdict = search.run(piece, bytes_max)
            ended = self.clock()
            taken = search.steps - before
            self.steps += taken
            self.seconds += ended - started
            budget -= taken
            if verdict is not None or taken < piece or budget <= 0:  # done, or out of memory
                return verdict, False
            if ended >= deadline:
                return None, True
            started = ended
