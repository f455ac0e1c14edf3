"""`cellar live` says how many faults it injected and how many it skipped, and why. A fault
skipped (one that needs the sequencer, when finding it took the fault's whole window) went
into the history only: the screen showed the schedule as if every fault had happened, and a
run whose every fault was skipped passed (exit 0) with nothing said. It now prints the counts,
the reasons, and a warning when no fault was injected; the exit status is as documented."""

from __future__ import annotations

import pathlib

import anyio
import pytest

from cellar.live.command import _report
from cellar.live.nemesis import LiveNemesis
from cellar.live.relays import LinkRelays
from cellar.live.run import LiveOptions, LiveResult
from jepsen.checker import check
from jepsen.history import HistoryRecorder
from jepsen.models import KvModel
from jepsen.sim.nemesis import Fault, NemesisEvent
from tests.cellar.test_live_run import FakeReplica


def _played(schedule: tuple[NemesisEvent, ...], lookup_s: float) -> LiveResult:
    """What the nemesis records for `schedule` (finding the sequencer takes `lookup_s`), with
    one successful operation, as a live run's result."""
    recorder = HistoryRecorder()

    async def slow_to_find() -> int:
        await anyio.sleep(lookup_s)
        return 0

    nemesis = LiveNemesis(_Cluster(), LinkRelays(3), recorder,  # type: ignore[arg-type]
                          find_sequencer=slow_to_find, clog_ms=100)

    async def play() -> None:
        await nemesis.run(schedule, anyio.current_time())

    anyio.run(play)
    recorder.ok(recorder.invoke(0, "put", 1, key="k"), 1)
    history = recorder.history()
    return LiveResult(LiveOptions(), schedule, history, check(KvModel(), history), 1, 1,
                      unsettled=0, views=(1, 1), exits=(), settled_ok=1)


class _Cluster:
    def __init__(self) -> None:
        self.processes = [FakeReplica() for _ in range(3)]


def test_a_run_whose_every_fault_was_skipped_says_so(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = _played((NemesisEvent(0, Fault.MUTE_SEQUENCER, 1, 100),
                      NemesisEvent(0, Fault.ISOLATE_SEQUENCER, 2, 100)), lookup_s=0.3)
    assert _report(result, tmp_path) == 0  # the exit status is as documented
    out = capsys.readouterr().out
    assert "faults: 0 of 2 injected, 2 skipped" in out
    assert "skipped: mute-sequencer 1 for 100 ms: its window passed while the sequencer " \
           "was looked for" in out
    assert "warning: no fault was injected" in out


def test_injected_and_skipped_faults_are_counted(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = _played((NemesisEvent(0, Fault.MUTE_SEQUENCER, 1, 100),
                      NemesisEvent(0, Fault.CLOG, 2, 100)), lookup_s=0.3)
    assert _report(result, tmp_path) == 0
    out = capsys.readouterr().out
    assert "faults: 1 of 2 injected, 1 skipped" in out
    assert "skipped: mute-sequencer 1" in out
    assert "warning" not in out


def test_a_run_with_every_fault_injected_has_no_warning(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = _played((NemesisEvent(0, Fault.CLOG, 2, 100),), lookup_s=0.0)
    assert _report(result, tmp_path) == 0
    out = capsys.readouterr().out
    assert "faults: 1 of 1 injected, 0 skipped" in out
    assert "skipped:" not in out and "warning" not in out
