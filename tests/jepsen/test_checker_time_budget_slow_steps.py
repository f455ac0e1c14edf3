"""The time budget holds however long a model's step takes: the GPU state machine's step costs
about a millisecond (a restore, an apply and a snapshot), a register's a microsecond. The search
noticed its deadline only between slices of up to 65,536 steps, which the GPU model took more
than a minute over, and a diagnosis trial (up to 20,000 steps) only once it was done.

The model here charges each step a millisecond on a fake clock, so the test reads the time the
check spent from that clock, never from the machine's."""

from __future__ import annotations

from collections.abc import Sequence

from jepsen.checker import check
from jepsen.history import HistoryRecorder, Operation, Value
from jepsen.models import Illegal, KeyModel, KvModel, Part, State, Stepper
from jepsen.verdict import Verdict

STEP_S = 0.001
TIMEOUT_S = 2.0
LATE_S_MAX = 0.2  # a deadline is noticed within about a tenth of a second (search.PACE_S)


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class SlowKey(KeyModel):
    """One key whose every step costs `STEP_S` on `clock`."""

    def __init__(self, key: Value, clock: FakeClock) -> None:
        super().__init__(key, 0)
        self.clock = clock

    def compile(self, operation: Operation) -> Stepper:
        inner, clock = super().compile(operation), self.clock

        def step(state: State) -> State | Illegal:
            clock.now_s += STEP_S
            return inner(state)

        return step


class SlowKv(KvModel):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__(0)
        self.clock = clock

    def partition(self, operations: Sequence[Operation]) -> list[Part] | None:
        parts = super().partition(operations)
        assert parts is not None
        return [Part(part.label, SlowKey(part.operations[0].key, self.clock), part.operations)
                for part in parts]


def hard_key(recorder: HistoryRecorder, width: int) -> None:
    """Crashed writes, reads that pin them down one by one, then an impossible read."""
    for value in range(1, width + 1):
        recorder.invoke(100 + value, "put", value, key="k")
    for value in range(width, 0, -1):
        recorder.ok(recorder.invoke(1, "get", key="k"), value)
    recorder.ok(recorder.invoke(1, "get", key="k"), -1)


def test_a_search_of_slow_steps_stops_at_its_time_budget() -> None:
    recorder = HistoryRecorder()
    hard_key(recorder, 12)
    clock = FakeClock()
    result = check(SlowKv(clock), recorder.history(), timeout_s=TIMEOUT_S, clock=clock)
    assert result.verdict is Verdict.UNKNOWN
    assert "time budget" in result.reason
    assert clock.now_s <= TIMEOUT_S + LATE_S_MAX


def test_the_explanation_of_slow_steps_stops_at_its_deadline() -> None:
    """Refuted within the budget; the explanation may use what is left, and at least a
    second, but not a trial's 20,000 steps past that."""
    recorder = HistoryRecorder()
    hard_key(recorder, 6)
    clock = FakeClock()
    result = check(SlowKv(clock), recorder.history(), timeout_s=TIMEOUT_S, clock=clock)
    assert result.verdict is Verdict.NOT_LINEARIZABLE
    assert result.failure is not None
    refuted_s = result.steps * STEP_S
    assert clock.now_s <= max(TIMEOUT_S, refuted_s + 1.0) + LATE_S_MAX
