"""The simulator's safety monitor, fed executions by hand: it catches a command run twice by
one replica even where a snapshot install or a restart came between the two (its per-replica
accounting starts over there)."""

from __future__ import annotations

from typing import cast

from consensus.messages import NO_CL, Batch, Command, SnapshotMeta
from consensus.ready import Executed
from consensus.replica import Inspection
from jepsen.sim.monitor import SafetyMonitor


class _Logs:
    """What the monitor asks a replica's logs: slot `slot` holds replica 1, C(1, k) runs at
    slot 2k and its batch is `batches[k]`; odd slots are NO_CL."""

    def __init__(self, batches: list[Batch]) -> None:
        self.batches = batches
        self.log_base = 0

    def committed_o(self, slot: int) -> int:
        return 1 if slot % 2 == 0 else NO_CL

    def committed_c(self, space: int, index: int) -> Batch | None:
        return self.batches[index] if space == 1 and index < len(self.batches) else None

    def o_count(self, space: int, end: int) -> int:
        return (end + 1) // 2 if space == 1 else 0


A = Command(1, 7, b"a")
B = Command(1, 8, b"b")


def _run(between: str) -> list[str]:
    """Replica 0 runs "a" at C(1, 0) (slot 0); then installs a snapshot or restarts at slot
    2; then runs C(1, 1) (slot 2), holding "a" again (and "b")."""
    batches: list[Batch] = [(A,), (A, B)]
    logs = _Logs(batches)
    inspection = cast(Inspection, logs)
    monitor = SafetyMonitor(3)
    for replica in (0, 2):
        monitor.started(replica, inspection)
    monitor.executed(2, inspection, Executed(0, 1, 0, batches[0]))
    monitor.executed(0, inspection, Executed(0, 1, 0, batches[0]))
    if between == "install":
        monitor.installed(0, SnapshotMeta(2, (0, 1, 0), (0, 1, 0), (0, 0, 0), ((), (), ())))
    elif between == "restart":
        logs.log_base = 2
        monitor.started(0, inspection)
    monitor.executed(0, inspection, Executed(2, 1, 1, batches[1]))
    return [violation.invariant for violation in monitor.violations]


def test_a_command_run_again_after_a_snapshot_install_is_caught() -> None:
    assert _run("install") == ["exactly once"]


def test_a_command_run_again_after_a_restart_is_caught() -> None:
    assert _run("restart") == ["exactly once"]


def test_a_command_run_again_in_one_lifetime_is_reported_once() -> None:
    assert _run("nothing") == ["exactly once"]
