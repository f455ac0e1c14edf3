"""`cellar live` leaves nothing behind and judges liveness soundly: a harness killed (SIGKILL)
while a replica is paused leaves no replica stopped for good; a cluster that never recovers
after the heal is not called live; a fault that needs no sequencer is not held back looking
for one; an interrupted run leaves the history it recorded."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from types import SimpleNamespace

import anyio
import pytest

from cellar.live import run as live_run
from cellar.live.nemesis import LiveNemesis
from cellar.live.relays import Link, LinkRelays
from cellar.live.run import LiveOptions, run_live
from jepsen.formats import load
from jepsen.history import EventType, HistoryRecorder
from jepsen.sim.nemesis import Fault, NemesisEvent
from tests.cellar.leftovers import kill_leftovers
from tests.cellar.test_live_run import FakeReplica

pytestmark = [pytest.mark.live]


def _replica_states(directory: pathlib.Path) -> dict[int, str]:
    """pid -> state letter of every `cellar replica` process run under `directory`."""
    states = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if "replica" in command and str(directory) in command:
            states[int(entry.name)] = stat.rsplit(")", 1)[1].split()[0]
    return states


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_harness_killed_during_a_pause_leaves_no_replica_stopped(tmp_path: pathlib.Path) -> None:
    """`cellar live` killed by SIGKILL (the OOM killer, a CI runner's timeout) while a replica
    is SIGSTOPped: its replicas are bound to it, but the paused one never handles the SIGTERM
    its parent's death sends it, and stays stopped for good, holding its ports and files."""
    directory = tmp_path / "run"
    harness = subprocess.Popen(
        [sys.executable, "-m", "cellar", "live", "--seconds", "10", "--heal-seconds", "4",
         "--schedule", "0:pause:0:9000", "--dir", str(directory)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parents[2])})
    try:
        deadline = time.monotonic() + 40
        while "T" not in _replica_states(directory).values():
            assert harness.poll() is None, "the run ended before the pause"
            assert time.monotonic() < deadline, "no replica was paused"
            time.sleep(0.1)
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        deadline = time.monotonic() + 10
        while _replica_states(directory) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _replica_states(directory) == {}
    finally:
        harness.kill()
        harness.wait()
        kill_leftovers(directory)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_cluster_that_never_recovers_after_the_heal_is_not_live(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the heal the cluster stays down (here: every replica gone). Each operation then
    takes the client's whole deadline (4 s) to fail, longer than the window between the settle
    point and the end of the run, so no operation is invoked inside it: the run counted 0
    failures there and called the dead cluster live."""
    def heal_to_nothing(self: LiveNemesis) -> None:
        for process in self._cluster.processes:
            process.kill()

    monkeypatch.setattr(LiveNemesis, "heal", heal_to_nothing)
    monkeypatch.setattr(LiveNemesis, "note_exits", lambda self: None)  # killed: not "by itself"
    options = LiveOptions(fault_s=2.0, heal_s=3.5, processes=1, explicit_schedule=())
    try:
        result = await run_live(options, tmp_path)
    finally:
        kill_leftovers(tmp_path)
    assert result.ok_operations > 0  # it served before the "heal"
    assert not result.live, (result.unsettled, result.operations)
    assert not result.ok


def test_a_fault_that_needs_no_sequencer_is_not_held_back_by_looking_for_one() -> None:
    """Finding the sequencer asks every replica for its status, a second per replica that does
    not answer (a paused one): a clog, a partition or a crash of a named target, which do not
    depend on the sequencer, waited for that all the same, starting (and ending) late, or not
    at all when the fault phase ended first."""
    applied: list[float] = []

    class Relays(LinkRelays):
        def set_links(self, cut: Iterable[Link], slowed: Iterable[Link],
                      delay_s: float) -> None:
            applied.append(anyio.current_time())

    async def slow_to_find() -> int:
        await anyio.sleep(1.0)  # one replica paused: its status times out
        return 0

    nemesis = LiveNemesis(SimpleNamespace(processes=[FakeReplica() for _ in range(3)]),  # type: ignore[arg-type]
                          Relays(3), HistoryRecorder(), find_sequencer=slow_to_find, clog_ms=100)

    async def play() -> float:
        started = anyio.current_time()
        await nemesis.run((NemesisEvent(0, Fault.CLOG, 1, 100),
                           NemesisEvent(0, Fault.PARTITION_HALVES, 2, 100)), started)
        return started

    started = anyio.run(play)
    assert len(applied) == 4
    assert applied[0] - started < 0.5 and applied[1] - started < 0.5


class _NoCluster:
    """Stands in for the replica processes: the run is interrupted before it needs any."""

    def __init__(self, layout: object, death_signal: signal.Signals) -> None:
        del layout, death_signal

    def start(self, *, rejoin: bool = False) -> None: ...

    def wait_ports(self) -> None: ...

    def stop(self) -> None: ...


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_interrupted_run_leaves_the_history_it_recorded(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or an error) midway: the operations recorded so far are written for `cellar
    check`, the one still open as of unknown outcome; the interruption goes on."""
    async def interrupted(options: object, layout: object, cluster: object, relays: object,
                          recorder: HistoryRecorder) -> None:
        recorder.ok(recorder.invoke(0, "put", 1, key="k"), 1)
        recorder.invoke(1, "put", 2, key="k")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(live_run, "ProcessCluster", _NoCluster)
    monkeypatch.setattr(live_run, "_run_phases", interrupted)
    raised = False
    try:
        await run_live(LiveOptions(), tmp_path)
    except* RuntimeError:  # out of the run's task group
        raised = True
    assert raised
    history = load(tmp_path / "history.jsonl").history
    assert [(operation.status, operation.input) for operation in history.operations] == \
        [(EventType.OK, 1), (EventType.INFO, 2)]
