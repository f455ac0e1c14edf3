"""What a check concludes: a three-valued verdict and the evidence behind it.

`linearizable` comes with a witness: an order of the operations, consistent with real time, that
explains every result, and the model's state after each. `not-linearizable` comes with a
`Failure`: the longest prefix of the history that is still linearizable (and its witness), the
operation whose completion no order can explain, and the smallest window of operations found
that cannot be linearized together. `unknown` means a budget ran out first; it is never a guess.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from jepsen.models import Model, State


class Verdict(enum.StrEnum):
    LINEARIZABLE = "linearizable"
    NOT_LINEARIZABLE = "not-linearizable"
    UNKNOWN = "unknown"


class Step(NamedTuple):
    """One operation of a linearization (by its id in the history) and the state after it."""

    operation: int
    state: State


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """The verdict on one independent part of the history (the whole of it, unpartitioned)."""

    label: str
    model: Model
    verdict: Verdict
    operations: tuple[int, ...]  # ids of the operations the search considered
    steps: int  # model steps the search took
    linearization: tuple[Step, ...] = ()  # the witness, when linearizable


@dataclass(frozen=True, slots=True)
class Failure:
    """Where a history that is not linearizable goes wrong, within one partition.

    The events before `prefix_events` are linearizable (`linearization` is a witness: operations
    still pending at that point may or may not be in it). The completion of `operation`, at
    event `prefix_events`, is the first that no order explains. `window` holds the fewest
    operations found that cannot all have returned what they returned, whatever the other
    operations did; `window_events` is the span of events from the first of them to the end.
    `exact` is False when a budget ran out while these were being narrowed down: the verdict
    stands, the window may be larger than it could be.
    """

    partition: str
    operation: int
    prefix_events: int
    linearization: tuple[Step, ...]
    window: tuple[int, ...]
    window_events: tuple[int, int]
    exact: bool = True


@dataclass(frozen=True, slots=True)
class CheckResult:
    verdict: Verdict
    model: Model
    operations: int  # client operations in the history
    checked: int  # operations that entered the search (fail ops and info reads need none)
    partitions: tuple[PartitionResult, ...]
    steps: int
    elapsed_s: float
    failure: Failure | None = None
    reason: str = ""  # why the verdict is unknown

    @property
    def is_linearizable(self) -> bool:
        return self.verdict is Verdict.LINEARIZABLE
