"""Child processes: they end with the command that started them, and stopping them sends
SIGTERM to all at once, SIGKILL for those still running after one shared grace period."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

from cellar.child_processes import bound_to_parent, child_environment, stop_processes

ROOT = pathlib.Path(__file__).resolve().parents[2]

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


# A parent that starts a sleeping child the way the commands start replicas, says its pid,
# then waits to be killed.
PARENT = """
import signal, subprocess, sys, time
from cellar.child_processes import bound_to_parent
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # started under nohup, it would ignore SIGHUP
child = subprocess.Popen(bound_to_parent([sys.executable, "-c", "import time; time.sleep(60)"]))
print(child.pid, flush=True)
time.sleep(60)
"""


def gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = pathlib.Path(f"/proc/{pid}/stat")
        if not status.exists() or status.read_text().split()[2] == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGHUP])
def test_a_child_ends_with_the_command_that_started_it_however_that_ends(
        signal_number: int) -> None:
    """`cellar dev` killed by SIGKILL (the OOM killer, a CI timeout) or a SIGHUP had left its
    replicas running for good, holding their ports."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        command_line = pathlib.Path(f"/proc/{child}/cmdline")
        deadline = time.monotonic() + 10
        while b"time.sleep(60)" not in command_line.read_bytes():  # the command, once exec'd
            assert time.monotonic() < deadline, command_line.read_bytes()
            time.sleep(0.01)
        parent.send_signal(signal_number)
        parent.wait(timeout=10)
        assert gone(child, timeout_s=10), "the child outlived the command that started it"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_a_child_started_off_the_main_thread_is_not_bound_to_that_thread() -> None:
    """The signal comes when the starting *thread* ends: a worker thread must not use it."""
    found: list[object] = []
    worker = threading.Thread(target=lambda: found.append(bound_to_parent(["true"])))
    worker.start()
    worker.join()
    assert found == [["true"]]


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_bound_child_starts_with_the_signal_dispositions_a_plain_one_has() -> None:
    """The trampoline is a Python interpreter, which ignores SIGPIPE and SIGXFSZ; an ignored
    signal stays ignored across execve (etcd would get EPIPE instead of dying)."""
    command = ["sh", "-c", "grep SigIgn /proc/self/status"]
    plain = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    bound = subprocess.run(bound_to_parent(command), capture_output=True, text=True,
                           check=True).stdout
    assert bound == plain


def test_a_child_started_elsewhere_imports_from_the_same_pythonpath(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative PYTHONPATH entries (an empty one is the directory itself) are made absolute
    against this process's directory: a replica starts in its data directory."""
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "data"
    (checkout / "lib").mkdir(parents=True)
    elsewhere.mkdir()
    (checkout / "lib" / "only_here.py").write_text("WHERE = 'checkout'\n", encoding="utf-8")
    monkeypatch.chdir(checkout)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["lib", "", "/opt/absolute"]))
    environment = child_environment()
    assert environment["PYTHONPATH"].split(os.pathsep) == [
        str(checkout / "lib"), str(checkout), "/opt/absolute"]
    assert environment["PYTHONUNBUFFERED"] == "1"
    printed = subprocess.run(
        [sys.executable, "-c", "import only_here; print(only_here.WHERE)"], cwd=elsewhere,
        env=environment, capture_output=True, text=True, check=True).stdout
    assert printed == "checkout\n"


def test_no_pythonpath_stays_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert "PYTHONPATH" not in child_environment()
