"""A live fault ends at its scheduled end, however long finding the sequencer took to start it,
and one whose window passed first is skipped (recorded as such), not applied late."""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

import anyio
import pytest

from cellar.live.nemesis import LiveNemesis
from cellar.live.relays import Link, LinkRelays
from jepsen.history import HistoryRecorder
from jepsen.sim.nemesis import Fault, NemesisEvent
from tests.cellar.test_live_run import FakeReplica

pytestmark = [pytest.mark.live]


def _nemesis(applied: list[tuple[float, set[Link]]], lookup_s: float,
             recorder: HistoryRecorder | None = None) -> LiveNemesis:
    class Relays(LinkRelays):
        def set_links(self, cut: Iterable[Link], slowed: Iterable[Link],
                      delay_s: float) -> None:
            applied.append((anyio.current_time(), set(cut)))

    async def slow_to_find() -> int:
        await anyio.sleep(lookup_s)  # a paused replica: its status times out
        return 0

    return LiveNemesis(SimpleNamespace(processes=[FakeReplica() for _ in range(3)]),  # type: ignore[arg-type]
                       Relays(3), HistoryRecorder() if recorder is None else recorder,
                       find_sequencer=slow_to_find,
                       clog_ms=100)


def test_a_fault_that_waited_for_the_sequencer_still_ends_at_its_scheduled_end() -> None:
    """isolate-sequencer at 0 for 600 ms, its lookup taking 300 ms: the fault is due to end at
    600 ms. It started late and then lasted its whole duration from there, ending at 900 ms:
    the nemesis kept a link cut 300 ms past the schedule (a second per paused replica in a
    real run), overlapping faults the schedule says come after it."""
    applied: list[tuple[float, set[Link]]] = []
    nemesis = _nemesis(applied, lookup_s=0.3)

    async def play() -> float:
        started = anyio.current_time()
        await nemesis.run((NemesisEvent(0, Fault.ISOLATE_SEQUENCER, 1, 600),), started)
        return started

    started = anyio.run(play)
    assert applied[-1][1] == set()  # healed in the end
    assert applied[-1][0] - started < 0.6 + 0.1, applied[-1][0] - started


def test_a_fault_whose_lookup_outlasts_its_window_is_not_applied_after_it() -> None:
    """A 100 ms mute-sequencer whose lookup takes 300 ms: its window is over before it could
    start, and cutting the sequencer's links from 300 ms to 400 ms is a fault nobody
    scheduled."""
    applied: list[tuple[float, set[Link]]] = []
    recorder = HistoryRecorder()
    nemesis = _nemesis(applied, lookup_s=0.3, recorder=recorder)

    async def play() -> None:
        await nemesis.run((NemesisEvent(0, Fault.MUTE_SEQUENCER, 1, 100),),
                          anyio.current_time())

    anyio.run(play)
    assert all(not cut for _, cut in applied), applied
    assert [event.f for event in recorder.history().events] == ["skip"]
