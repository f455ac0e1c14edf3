"""`cellar live`: a replica restarted while a pause is in force (a crash that ends inside the
pause, or a pause that begins just after a restart) is stopped only once it is bound to the
harness. The nemesis sent SIGSTOP at once, which could land while the child was still in the
trampoline that arms its death signal (PR_SET_PDEATHSIG); a harness killed then (SIGKILL) left
the replica stopped for good, holding its ports."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import anyio
import pytest

from cellar.child_processes import bound_to_parent, bound_yet
from cellar.live import nemesis as live_nemesis
from cellar.live.nemesis import LiveNemesis
from cellar.live.relays import LinkRelays
from jepsen.history import HistoryRecorder
from jepsen.sim.nemesis import Fault, NemesisEvent


class _Child:
    """A started replica's process as the nemesis signals it: what it was sent, and whether it
    was bound to the harness when each signal came."""

    def __init__(self, replica: _Replica) -> None:
        self.replica = replica
        self.signals: list[tuple[signal.Signals, bool]] = []

    def send_signal(self, number: signal.Signals) -> None:
        self.signals.append((number, self.replica.bound_now()))


class _Replica:
    """A replica process that binds itself to the harness `checks_to_bind` looks after each
    start (the first start counts as long bound)."""

    def __init__(self, checks_to_bind: int) -> None:
        self.checks_to_bind = checks_to_bind
        self.running = True
        self.process: _Child | None = _Child(self)
        self.children = [self.process]
        self._checks = checks_to_bind

    def bound_now(self) -> bool:
        return self._checks >= self.checks_to_bind

    def bound(self) -> bool:
        self._checks += 1
        return self.bound_now()

    def kill(self) -> None:
        self.running = False

    def start(self, *, rejoin: bool = False) -> None:
        del rejoin
        self.running, self._checks = True, 0
        self.process = _Child(self)
        self.children.append(self.process)


def _play(replica: _Replica, schedule: tuple[NemesisEvent, ...]) -> HistoryRecorder:
    recorder = HistoryRecorder()
    replicas = [replica, _Replica(0), _Replica(0)]
    nemesis = LiveNemesis(SimpleNamespace(processes=replicas), LinkRelays(3),  # type: ignore[arg-type]
                          recorder, find_sequencer=lambda: anyio.sleep(0), clog_ms=0)

    async def play() -> None:
        await nemesis.run(schedule, anyio.current_time())

    anyio.run(play)
    return recorder


@pytest.mark.parametrize("schedule", [
    # the crash ends inside the pause: the restarted replica is to be held at once
    (NemesisEvent(0, Fault.PAUSE, 0, 400), NemesisEvent(50, Fault.CRASH, 0, 100)),
    # the pause begins just after the crash's restart
    (NemesisEvent(0, Fault.CRASH, 0, 100), NemesisEvent(120, Fault.PAUSE, 0, 300)),
])
def test_a_restarted_replica_is_stopped_only_once_bound(
        schedule: tuple[NemesisEvent, ...]) -> None:
    replica = _Replica(checks_to_bind=3)
    _play(replica, schedule)
    restarted = replica.children[-1]
    assert len(replica.children) == 2
    assert [number for number, _ in restarted.signals] == [signal.SIGSTOP, signal.SIGCONT]
    assert all(bound for number, bound in restarted.signals if number is signal.SIGSTOP)


def test_a_pause_that_ends_before_the_binding_sends_no_stop_after_it() -> None:
    replica = _Replica(checks_to_bind=10**9)
    recorder = _play(replica, (NemesisEvent(0, Fault.PAUSE, 0, 300),
                               NemesisEvent(50, Fault.CRASH, 0, 100)))
    assert signal.SIGSTOP not in [number for number, _ in replica.children[-1].signals]
    assert "unpaused" not in [event.f for event in recorder.history().events]


def test_a_replica_never_bound_is_left_running_and_said_to_be(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_nemesis, "BIND_WAIT_S", 0.05)
    replica = _Replica(checks_to_bind=10**9)
    recorder = _play(replica, (NemesisEvent(0, Fault.PAUSE, 0, 400),
                               NemesisEvent(50, Fault.CRASH, 0, 100)))
    assert signal.SIGSTOP not in [number for number, _ in replica.children[-1].signals]
    assert "unpaused" in [event.f for event in recorder.history().events]


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_is_bound_once_it_left_the_trampoline() -> None:
    child = subprocess.Popen(bound_to_parent(["sleep", "30"], signal.SIGKILL))
    try:
        deadline = time.monotonic() + 10
        while not bound_yet(child):
            assert time.monotonic() < deadline, "the trampoline never exec'd its command"
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
    plain = subprocess.Popen(["sleep", "30"])
    try:
        assert bound_yet(plain)
    finally:
        plain.kill()
        plain.wait()
