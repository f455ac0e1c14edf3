"""Stopping child processes: SIGTERM to all at once, SIGKILL for those still running after one
shared grace period."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from cellar.child_processes import stop_processes

IGNORES_SIGTERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                   "print('ready', flush=True); time.sleep(60)")
OBEYS_SIGTERM = "import time; print('ready', flush=True); time.sleep(60)"


def started(code: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    return process


def test_a_process_that_ignores_sigterm_is_killed_and_the_others_terminated() -> None:
    processes = [started(OBEYS_SIGTERM), started(IGNORES_SIGTERM), started(OBEYS_SIGTERM)]
    try:
        stop_processes(processes, grace_s=0.5)
        assert [process.returncode for process in processes] == [
            -signal.SIGTERM, -signal.SIGKILL, -signal.SIGTERM]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
            assert process.stdout is not None
            process.stdout.close()


class Stuck:
    """A process that never exits by itself: records the time each wait was given."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.waits: list[float] = []
        self.signals: list[int] = []
        self.killed = False

    def poll(self) -> int | None:
        return -9 if self.killed else None

    def send_signal(self, number: int) -> None:
        self.signals.append(number)

    def wait(self, timeout: float | None = None) -> int:
        if self.killed:
            return -9
        assert timeout is not None
        self.waits.append(timeout)
        self.clock[0] += timeout  # the whole timeout passes
        raise subprocess.TimeoutExpired("stuck", timeout)

    def kill(self) -> None:
        self.killed = True


def test_the_grace_period_is_shared_not_one_per_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("cellar.child_processes.time.monotonic", lambda: clock[0])
    stuck = [Stuck(clock) for _ in range(3)]
    stop_processes(stuck, grace_s=10.0)  # type: ignore[arg-type]
    assert all(process.signals == [signal.SIGTERM] and process.killed for process in stuck)
    assert sum(sum(process.waits) for process in stuck) == 10.0
