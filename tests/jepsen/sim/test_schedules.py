"""Hypothesis draws fault schedules and workload shapes; the simulator must stay safe and live.

A failing schedule shrinks: events are dropped, times move toward zero, faults toward the
first (mildest) kind, so the report is the smallest schedule that still breaks something.
Failing examples are kept in tests/hypothesis-examples and replayed first on every run.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jepsen.sim.nemesis import Fault, NemesisEvent
from jepsen.sim.options import SimOptions
from jepsen.sim.runner import run
from jepsen.verdict import Verdict

SAFETY_MS = 900
FAULTS = [Fault.CLOG, Fault.PAUSE, Fault.ONE_WAY, Fault.ISOLATE, Fault.ISOLATE_SEQUENCER,
          Fault.PARTITION_HALVES, Fault.PARTITION_RING, Fault.PARTITION_BRIDGE, Fault.CRASH,
          Fault.DEAF_TO_SEQUENCER, Fault.MUTE, Fault.MUTE_SEQUENCER, Fault.ISOLATE_HELD,
          Fault.ONE_WAY_HELD, Fault.MUTE_HELD, Fault.ISOLATE_SEQUENCER_HELD]


def events(replicas: int) -> st.SearchStrategy[NemesisEvent]:
    return st.builds(NemesisEvent, st.integers(0, SAFETY_MS), st.sampled_from(FAULTS),
                     st.integers(0, replicas - 1), st.integers(1, 600))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[SimOptions, tuple[NemesisEvent, ...]]:
    replicas = draw(st.sampled_from([3, 5]))
    options = SimOptions(
        seed=draw(st.integers(0, 2**16)), replica_count=replicas,
        safety_ms=SAFETY_MS, liveness_ms=1200,
        loss_ppm=draw(st.sampled_from([0, 20_000])),
        duplicate_ppm=draw(st.sampled_from([0, 20_000])),
        jitter_us=draw(st.sampled_from([0, 2000])),
        torn_writes=draw(st.booleans()),
        snapshot_every_slots=draw(st.sampled_from([1000, 30])),
        batch_commands_max=draw(st.sampled_from([64, 1])),
    )
    schedule = tuple(sorted(draw(st.lists(events(replicas), max_size=5)),
                            key=lambda event: (event.at_ms, event.fault, event.target)))
    return options, schedule


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_drawn_schedules_stay_safe_and_live(
        scenario: tuple[SimOptions, tuple[NemesisEvent, ...]]) -> None:
    options, schedule = scenario
    result = run(options, schedule)
    assert result.ok, "\n".join([options.describe(), *map(str, schedule),
                                 *map(str, result.violations)])
    assert result.linearizability is Verdict.LINEARIZABLE, options.describe()
