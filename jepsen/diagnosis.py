"""Where a history that is not linearizable goes wrong: the longest linearizable prefix, the
first completion no order explains, and the smallest window of operations found.

Both searches rest on relaxations that can only make a history easier to linearize, so an
illegal verdict on the relaxed history is an illegal verdict on the real one:

- Cutting the history at an event: operations invoked later are gone, operations pending at the
  cut have unknown outcomes. Linearizability of prefixes is monotone (a linearization of a longer
  prefix, stopped before its first operation invoked after the cut, is one of the shorter), so a
  binary search over the cut points finds the first completion that makes the prefix illegal.
- Within that prefix, an operation that changes no state (a read) can be dropped, and any other
  can be made skippable: it takes effect within its interval, as it claimed, or not at all. The
  window is what is left required after relaxing every operation that could be relaxed with the
  prefix still illegal, chunks first, then one at a time (in the manner of delta debugging): the
  operations in it cannot all have done what they claim, whatever the others did.

Every trial runs under a step budget; a trial that runs out counts as "not shown illegal", which
keeps every reported window a proven one, and marks the failure as not exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from jepsen.history import Operation
from jepsen.models import Model, Stepper, as_unknown_outcome
from jepsen.search import CACHE_BYTES_MAX, Item, Pace, Search
from jepsen.verdict import Failure, Step, Verdict

TRIAL_STEPS_MIN = 20_000


@dataclass(slots=True)
class _Trials:
    """Runs relaxed versions of one partition's history under a shared step budget."""

    model: Model
    operations: tuple[Operation, ...]
    budget_steps: int
    trial_steps: int
    deadline: float | None = None
    clock: Callable[[], float] = time.monotonic
    exact: bool = True
    _unknown_steps: dict[int, Stepper | None] = field(default_factory=dict)
    _known_steps: dict[int, Stepper] = field(default_factory=dict)
    _pace: Pace = field(init=False)  # a trial stops at the deadline, not only between trials

    def __post_init__(self) -> None:
        self._pace = Pace(self.deadline, self.clock)

    def _unknown(self, operation: Operation) -> Stepper | None:
        """The step of the operation with its outcome unknown; None when it changes nothing."""
        if operation.id not in self._unknown_steps:
            relaxed = as_unknown_outcome(operation)
            self._unknown_steps[operation.id] = (
                None if self.model.is_read_only(relaxed) else self.model.compile(relaxed))
        return self._unknown_steps[operation.id]

    def _known(self, operation: Operation) -> Stepper:
        if operation.id not in self._known_steps:
            self._known_steps[operation.id] = self.model.compile(operation)
        return self._known_steps[operation.id]

    def items(self, cut: int, relaxed: Collection[int], dropped: Collection[int]) -> list[Item]:
        items = []
        for operation in self.operations:
            if operation.call > cut or operation.id in dropped:
                continue
            if operation.is_ok and operation.ret is not None and operation.ret <= cut:
                items.append(Item(operation.id, operation.call, operation.ret,
                                  self._known(operation), skippable=operation.id in relaxed))
                continue
            step = self._unknown(operation)
            if step is not None:
                items.append(Item(operation.id, operation.call, None, step))
        return items

    def exhausted(self) -> bool:
        """True once the step budget is spent or the deadline has passed."""
        return self.budget_steps <= 0 or (self.deadline is not None
                                          and self.clock() >= self.deadline)

    def run(self, cut: int, relaxed: Collection[int] = (), dropped: Collection[int] = ()
            ) -> Search | None:
        """The finished search on the relaxed prefix, or None if the budget ran out."""
        budget = 0 if self.exhausted() else min(self.trial_steps, self.budget_steps)
        if budget <= 0:
            self.exact = False
            return None
        search = Search(self.items(cut, relaxed, dropped), self.model.initial_state())
        verdict, _ = self._pace.run(search, min(budget, CACHE_BYTES_MAX // search.entry_bytes),
                                    CACHE_BYTES_MAX)
        self.budget_steps -= search.steps
        if verdict is None:  # out of steps, memory or time
            self.exact = False
            return None
        return search

    def illegal(self, cut: int, relaxed: Collection[int] = (), dropped: Collection[int] = ()
                ) -> bool:
        search = self.run(cut, relaxed, dropped)
        return search is not None and search.verdict is Verdict.NOT_LINEARIZABLE


def _first_failing_cut(trials: _Trials, cuts: Sequence[int]) -> tuple[int, tuple[Step, ...]]:
    """The index in `cuts` of the first completion no order explains, and the witness of the
    prefix before it. The full history (the last cut) is known to be illegal."""
    low, high = 0, len(cuts) - 1
    witnesses: dict[int, tuple[Step, ...]] = {}
    while low < high:
        middle = (low + high) // 2
        search = trials.run(cuts[middle])
        if search is not None and search.verdict is Verdict.LINEARIZABLE:
            witnesses[middle] = search.linearization()
            low = middle + 1
        else:  # illegal, or not shown either way within the budget: look earlier
            high = middle
    if high == 0:
        return 0, ()
    if high - 1 not in witnesses:
        search = trials.run(cuts[high - 1])
        if search is None or search.verdict is not Verdict.LINEARIZABLE:
            trials.exact = False
            return high, ()
        witnesses[high - 1] = search.linearization()
    return high, witnesses[high - 1]


def _relax_pass(trials: _Trials, cut: int, candidates: list[Operation], relaxed: set[int],
                dropped: set[int]) -> list[Operation]:
    """Relax the candidates in chunks that halve, keeping each relaxation under which the
    prefix stays illegal; returns the candidates that could not be relaxed."""
    size = max(1, len(candidates) // 2)
    while candidates and not trials.exhausted():
        kept: list[Operation] = []
        for start in range(0, len(candidates), size):
            chunk = candidates[start:start + size]
            readers = {op.id for op in chunk if trials.model.is_read_only(op)}
            writers = {op.id for op in chunk} - readers
            if trials.illegal(cut, relaxed | writers, dropped | readers):
                relaxed |= writers
                dropped |= readers
            else:
                kept.extend(chunk)
        candidates = kept
        if size == 1:
            break
        size = max(1, size // 2)
    return candidates


def _narrow_window(trials: _Trials, cut: int, blamed: Operation) -> set[int]:
    """The ids of the operations that stay required after relaxing all it can.

    Writes go first, while every read still pins the state down (which keeps those trials
    cheap); then the reads, whose dropping leaves the search freer and costlier."""
    candidates = [operation for operation in trials.operations
                  if operation.id != blamed.id and operation.is_ok
                  and operation.ret is not None and operation.ret <= cut]
    relaxed: set[int] = set()
    dropped: set[int] = set()
    writers = [op for op in candidates if not trials.model.is_read_only(op)]
    readers = [op for op in candidates if trials.model.is_read_only(op)]
    kept = _relax_pass(trials, cut, writers, relaxed, dropped)
    kept += _relax_pass(trials, cut, readers, relaxed, dropped)
    return {operation.id for operation in kept} | {blamed.id}


def diagnose(model: Model, operations: Sequence[Operation], label: str, *,
             budget_steps: int, trial_steps: int, deadline: float | None = None,
             clock: Callable[[], float] = time.monotonic) -> Failure:
    """Explain why one partition's operations (fail ops and unknown reads already removed)
    cannot be linearized. `budget_steps` bounds all trials together, `deadline` (by `clock`)
    the time they may run in."""
    trials = _Trials(model, tuple(operations), budget_steps,
                     max(TRIAL_STEPS_MIN, trial_steps), deadline, clock)
    completed = sorted((operation for operation in trials.operations
                        if operation.is_ok and operation.ret is not None),
                       key=lambda operation: operation.ret or 0)
    assert completed, "a history with no completed operation is linearizable"
    cuts = [operation.ret or 0 for operation in completed]
    index, witness = _first_failing_cut(trials, cuts)
    blamed, cut = completed[index], cuts[index]
    required = _narrow_window(trials, cut, blamed)
    window = tuple(sorted(required))
    first = min(operation.call for operation in trials.operations if operation.id in required)
    return Failure(partition=label, operation=blamed.id, prefix_events=cut,
                   linearization=witness, window=window, window_events=(first, cut),
                   exact=trials.exact)
