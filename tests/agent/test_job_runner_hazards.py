"""The job runner's launch and stop against hazards of a real node: descriptors the agent holds,
a dead job's pid reused by a stranger, a job stopped by SIGSTOP, an operator clearing the logs,
a node with so many processes that a /proc scan takes a while."""

from __future__ import annotations

import itertools
import os
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import anyio
import pytest

from agent import procfs
from agent.job_logs import LOGS_NAME
from agent.job_outcomes import Started, Termination
from agent.job_state import JobRecord, JobRecords
from tests.agent.jobs_support import (
    WAIT_S,
    binding,
    next_exit,
    wait_for_output,
)

pytestmark = pytest.mark.anyio

LIST_FDS = "import os; print(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))"


async def test_a_job_inherits_no_descriptor_of_the_agent(rig, tmp_path) -> None:
    """A descriptor the agent holds without close-on-exec (inherited from whoever started it,
    or opened by a C library such as NVML) must not leak into jobs, which outlive the agent:
    Popen closes them by default (close_fds=True); posix_spawn as called does not."""
    leaked = os.open(tmp_path / "agent-private", os.O_WRONLY | os.O_CREAT, 0o600)
    os.set_inheritable(leaked, True)
    try:
        async with rig.runner() as jobs:
            started = await rig.start(jobs, binding("fds", LIST_FDS))
            assert (await next_exit(jobs)).exit_code == 0
    finally:
        os.close(leaked)
    fds = eval(pathlib.Path(started.log_path).read_text())
    assert leaked not in fds, f"the job holds the agent's descriptor {leaked}: {fds}"


# A daemon's classic double fork: the first child becomes a session (and group) leader, forks
# the daemon and exits, so the daemon's session and group ids name a pid nobody holds.
DAEMONIZE = (
    "import os, sys, time\n"
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        null = os.open(os.devnull, os.O_RDWR); os.dup2(null, 1); os.dup2(null, 2)\n"
    "        os.close(r); os.write(w, f'{os.getsid(0)} {os.getpid()}'.encode()); os.close(w)\n"
    "        time.sleep(60); os._exit(0)\n"
    "    os._exit(0)\n"
    "os.close(w); print(os.read(r, 100).decode(), flush=True)\n")


async def test_a_lost_job_s_leftover_hunt_spares_a_stranger_that_reused_its_pid(rig) -> None:
    """The agent was down (or the node rebooted) and the job's leader, pid P, is gone with all
    its processes; P was reused since by a daemon's intermediate process, whose session and
    group the daemon still holds. At reconcile the record is dead, and the hunt for the job's
    leftovers (`procfs.job_members`: sid or pgid == P, started after the job) takes the
    unrelated daemon for one of them and kills it."""
    out = subprocess.run([sys.executable, "-c", DAEMONIZE], capture_output=True, text=True,
                         check=True, timeout=10).stdout.split()
    reused, daemon = int(out[0]), int(out[1])
    daemon_ticks = procfs.start_ticks(daemon)
    assert daemon_ticks is not None
    with anyio.fail_after(WAIT_S):  # the intermediate's zombie, reaped by init
        while procfs.read_stat(reused) is not None:
            await anyio.sleep(0.01)
    try:
        rig.state.mkdir()
        # The job ran as pid `reused` before the daemon's intermediate got that number.
        JobRecords(rig.state).put(JobRecord(
            binding=binding("p1"), pid=reused, pgid=reused, start_ticks=daemon_ticks - 1,
            started_unix_ns=0, log_path="/dev/null"))
        async with rig.runner() as jobs:
            report = await jobs.reconcile([binding("p1")])
            assert [lost.pod_uid for lost in report.lost] == ["p1"]
        assert procfs.is_alive(daemon, daemon_ticks), "a stranger was killed as a leftover"
    finally:
        if procfs.is_alive(daemon, daemon_ticks):
            os.kill(daemon, 9)


# A job with a clean shutdown on SIGTERM that is stopped (SIGSTOP: a debugger, a user's
# `kill -STOP`, a checkpointing tool) when the agent stops it.
STOPPED_GRACEFUL = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "print('ready', flush=True)\n"
    "os.kill(os.getpid(), signal.SIGSTOP)\n"
    "time.sleep(60)\n")


async def test_a_stopped_job_gets_its_grace_period_not_sigkill(rig) -> None:
    """SIGTERM stays pending on a stopped process whose handler could end it cleanly: the
    runner must continue it (SIGCONT, as systemd and container runtimes do), or the grace
    period is spent for nothing and the job is SIGKILLed."""
    async with rig.runner() as jobs:
        started = await rig.start(jobs, binding("p1", STOPPED_GRACEFUL))
        await wait_for_output(started, "ready")
        with anyio.fail_after(WAIT_S):
            while procfs.read_stat(started.pid).state != "T":  # type: ignore[union-attr]
                await anyio.sleep(0.01)
        outcome = await jobs.stop("p1", grace_s=3.0)
        exited = await next_exit(jobs)
        assert (outcome.termination, exited.exit_code) == (Termination.STOPPED, 0), exited


async def test_a_start_survives_an_operator_clearing_the_logs_directory(rig) -> None:
    """An operator frees disk with `rm -rf <state_dir>/logs` (job output, the natural thing
    to delete): every later start fails (ENOENT opening the log), each pod is reported
    exited 127 and never started again, until the agent restarts."""
    async with rig.runner() as jobs:
        shutil.rmtree(rig.state / LOGS_NAME)
        outcome = await jobs.start(binding("after-cleanup", "pass"))
        assert isinstance(outcome, Started), outcome
        rig.reaper.add(outcome)
        assert (await next_exit(jobs)).exit_code == 0


SLOW_SCAN_S = 0.5  # a /proc scan on a crowded node, made long to leave wide margins
TICK_S = 0.01


async def test_a_stop_s_proc_scans_leave_the_event_loop_free(rig, monkeypatch) -> None:
    """A stop reads all of /proc every `group_poll_s` until the job's processes are gone: on
    a node with thousands of processes each scan takes tens of milliseconds, and run on the
    event loop a few stops at once would starve the agent's heartbeats."""
    real_scan = procfs.all_stats

    def slow_scan(proc: pathlib.Path = procfs.PROC) -> Iterator[procfs.ProcStat]:
        time.sleep(SLOW_SCAN_S)
        return real_scan(proc)

    async with rig.runner() as jobs:
        started = await rig.start(jobs, binding("p1"))
        await wait_for_output(started, "ready")
        monkeypatch.setattr(procfs, "all_stats", slow_scan)
        ticks = [time.monotonic()]

        async def tick() -> None:
            while True:
                await anyio.sleep(TICK_S)
                ticks.append(time.monotonic())

        async with anyio.create_task_group() as ticker:
            ticker.start_soon(tick)
            outcome = await jobs.stop("p1", grace_s=WAIT_S)
            ticks.append(time.monotonic())
            ticker.cancel_scope.cancel()
        assert outcome.termination is Termination.STOPPED
        stall_s = max(later - earlier for earlier, later in itertools.pairwise(ticks))
        assert stall_s < SLOW_SCAN_S / 2, f"the loop stalled {stall_s:.2f} s in a scan"
