"""`check(model, history)`: is there a total order of the operations, consistent with real time,
that explains every result?

1. Prepare: `fail` operations are dropped (they did not take effect); `info` operations that
   change no state (reads) are dropped (they tell nothing); every other operation is compiled
   into its model step once. An operation the model cannot interpret raises `ModelError` here,
   before any verdict.
2. Partition, only where the model declares it sound (P-compositionality): the history is
   linearizable exactly when every part is.
3. Search every part with Wing-Gong-Lowe (`jepsen.search`), fairly: smallest part first, then
   round-robin with step slices that double each round, so one hard part cannot starve the
   others. The first refutation wins. When the time or step budget runs out before every part
   is settled, the verdict is `unknown`. A slice runs in pieces short in time (`Pace`), so the
   time budget is kept however long a model's step takes.
4. Explain a refutation (`jepsen.diagnosis`): the longest linearizable prefix and the smallest
   window found, under a budget of their own (steps, and what is left of the time budget). The
   verdict is settled before they start and never depends on them.

Deterministic: the same history and model give the same verdict, witness and window, unless the
time budget (the only use of the clock) runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from jepsen.diagnosis import diagnose
from jepsen.history import EventType, History, Operation
from jepsen.models import Model, Part
from jepsen.search import CACHE_BYTES_MAX, Item, Pace, Search
from jepsen.verdict import CheckResult, PartitionResult, Verdict

SLICE_STEPS_FIRST = 1_024
SLICE_STEPS_MAX = 65_536  # a slice runs in pieces of about 0.1 s each (`Pace`)
EXPLAIN_STEPS = 1_000_000
EXPLAIN_S_MIN = 1.0


@dataclass(frozen=True, slots=True)
class PreparedPart:
    """One part, ready to search: its operations and their compiled steps."""

    part: Part
    items: tuple[Item, ...]


def relevant(model: Model, operations: Sequence[Operation]) -> list[Operation]:
    """The operations the search must consider: no `fail`, no `info` that changes nothing."""
    return [operation for operation in operations
            if operation.status is not EventType.FAIL
            and not (operation.status is EventType.INFO and model.is_read_only(operation))]


def prepare(model: Model, history: History) -> list[PreparedPart]:
    """Drop what needs no checking, partition where declared, compile every step."""
    operations = relevant(model, history.operations)
    parts = model.partition(operations)
    if parts is None:
        parts = [Part("", model, tuple(operations))]
    prepared = []
    for part in parts:
        items = tuple(Item(operation.id, operation.call,
                           operation.ret if operation.is_ok else None,
                           part.model.compile(operation))
                      for operation in part.operations)
        prepared.append(PreparedPart(part, items))
    return prepared


@dataclass(slots=True)
class _Budget:
    deadline: float | None
    steps_left: int | None
    clock: Callable[[], float]
    cache_bytes_max: int
    cache_bytes: int = 0  # what the searches' memoisation holds, at most
    out_of_memory: bool = False
    pace: Pace = field(init=False)

    def __post_init__(self) -> None:
        self.pace = Pace(self.deadline, self.clock)

    def slice(self, wanted: int, entry_bytes: int) -> int:
        """Steps the next slice of a search whose cache entries take up to `entry_bytes` may
        take; 0 when a budget is spent."""
        if self.deadline is not None and self.clock() >= self.deadline:
            return 0
        room = (self.cache_bytes_max - self.cache_bytes) // entry_bytes
        if room <= 0:
            self.out_of_memory = True
            return 0
        wanted = min(wanted, room)
        if self.steps_left is None:
            return wanted
        return min(wanted, self.steps_left)

    def spend(self, steps: int) -> None:
        if self.steps_left is not None:
            self.steps_left -= steps


def _schedule(searches: Sequence[Search], budget: _Budget) -> tuple[Verdict, int | None]:
    """Round-robin the searches with doubling slices. Returns the verdict and, for an illegal
    one, the index of the search that refuted."""
    pending = sorted((index for index, search in enumerate(searches) if search.verdict is None),
                     key=lambda index: len(searches[index].items))
    slice_steps = SLICE_STEPS_FIRST
    while pending:
        still_pending = []
        for index in pending:
            search = searches[index]
            allowed = budget.slice(slice_steps, search.entry_bytes)
            if allowed <= 0:
                return Verdict.UNKNOWN, None
            before, cached_before = search.steps, search.cache_bytes
            verdict, late = budget.pace.run(search, allowed, budget.cache_bytes_max
                                            - budget.cache_bytes + search.cache_bytes)
            budget.spend(search.steps - before)
            budget.cache_bytes += search.cache_bytes - cached_before
            if late:
                return Verdict.UNKNOWN, None
            if verdict is Verdict.NOT_LINEARIZABLE:
                return verdict, index
            if verdict is None:
                still_pending.append(index)
        pending = still_pending
        slice_steps = min(slice_steps * 2, SLICE_STEPS_MAX)
    return Verdict.LINEARIZABLE, None


def _partition_result(prepared: PreparedPart, search: Search) -> PartitionResult:
    verdict = search.verdict or Verdict.UNKNOWN
    witness = search.linearization() if verdict is Verdict.LINEARIZABLE else ()
    return PartitionResult(label=prepared.part.label, model=prepared.part.model,
                           verdict=verdict,
                           operations=tuple(item.operation for item in prepared.items),
                           steps=search.steps, linearization=witness)


def _unknown_reason(timeout_s: float | None, max_steps: int | None, budget: _Budget) -> str:
    if budget.steps_left is not None and budget.steps_left <= 0:
        return f"the step budget of {max_steps} steps ran out"
    if budget.out_of_memory:
        return (f"the memory budget of {budget.cache_bytes_max >> 20} MiB for the search's "
                f"memoisation ran out")
    return f"the time budget of {timeout_s} s ran out"


def _explain_deadline(started: float, timeout_s: float | None, clock: Callable[[], float]
                      ) -> float | None:
    """The explanation may use what is left of the time budget, and at least a second."""
    if timeout_s is None:
        return None
    return max(started + timeout_s, clock() + EXPLAIN_S_MIN)


def check(model: Model, history: History, *, timeout_s: float | None = None,
          max_steps: int | None = None, explain: bool = True,
          explain_steps: int = EXPLAIN_STEPS,
          clock: Callable[[], float] = time.monotonic,
          cache_bytes_max: int = CACHE_BYTES_MAX) -> CheckResult:
    """Check `history` against `model`.

    `timeout_s` and `max_steps` bound the search (None: no bound), and `cache_bytes_max` its
    memoisation's memory; when any runs out first the verdict is `unknown`. `explain` narrows
    down a refutation, within `explain_steps` and what is left of `timeout_s` (at least
    `EXPLAIN_S_MIN`).
    """
    started = clock()
    prepared = prepare(model, history)
    searches = [Search(part.items, part.part.model.initial_state()) for part in prepared]
    budget = _Budget(None if timeout_s is None else started + timeout_s, max_steps, clock,
                     cache_bytes_max)
    verdict, refuting = _schedule(searches, budget)
    failure = None
    if refuting is not None and explain:
        part = prepared[refuting].part
        failure = diagnose(part.model, part.operations, part.label,
                           budget_steps=explain_steps,
                           trial_steps=4 * searches[refuting].steps,
                           deadline=_explain_deadline(started, timeout_s, clock), clock=clock)
    return CheckResult(
        verdict=verdict, model=model, operations=len(history.operations),
        checked=sum(len(part.items) for part in prepared),
        partitions=tuple(_partition_result(part, search)
                         for part, search in zip(prepared, searches, strict=True)),
        steps=sum(search.steps for search in searches), elapsed_s=clock() - started,
        failure=failure,
        reason=_unknown_reason(timeout_s, max_steps, budget)
        if verdict is Verdict.UNKNOWN else "")
