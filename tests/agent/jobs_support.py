"""Helpers for the job runner's tests: a scripted NVML process list, quick limits, child
scripts run with this interpreter, and a reaper that kills whatever a test leaves running."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import sys
import time
from dataclasses import dataclass

import anyio

from agent import procfs
from agent.binding import Binding
from agent.gpu import GpuProcess, NvmlCode, NvmlUnavailable, ReadFailed
from agent.job_limits import JobLimits
from agent.job_outcomes import Exited, Started
from agent.jobs import JobRunner

GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
LOCAL_GPUS = (GPU_A, GPU_B)
QUICK = JobLimits(jobs_max=8, logs_kept_max=16, grace_s=0.2, kill_wait_s=3.0,
                  gpu_release_timeout_s=0.5, gpu_poll_s=0.02, group_poll_s=0.02,
                  exit_poll_s=0.02)
WAIT_S = 15.0  # an upper bound for anything a test waits for; never a timing assertion

SLEEP = "import time; print('ready', flush=True); time.sleep(60)"
IGNORE_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               "print('ready', flush=True); time.sleep(60)")
# The leader exits on SIGTERM; its child, in the same group, ignores it.
STUBBORN_CHILD = (
    "import subprocess, sys, time; "
    "child = subprocess.Popen([sys.executable, '-c', " + repr(IGNORE_TERM) + "]); "
    "time.sleep(0.5); print('child', child.pid, flush=True); time.sleep(60)")

# The leader starts a child that would sleep on, and exits.
LEAVES_CHILD = (
    "import subprocess, sys, time; "
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print('child', child.pid, flush=True); time.sleep(0.3)")


def child_of(output: str) -> tuple[int, int]:
    """The pid and start ticks of the child a script printed as `child <pid>`."""
    pid = int(output.split("child ")[1].split(maxsplit=1)[0])
    ticks = procfs.start_ticks(pid)
    assert ticks is not None
    return pid, ticks


def python(script: str) -> tuple[str, ...]:
    return (sys.executable, "-c", script)


def binding(pod_uid: str, script: str = SLEEP, *, gpus: tuple[str, ...] = (),
            env: tuple[tuple[str, str], ...] = ()) -> Binding:
    return Binding(group=f"gang-{pod_uid}", pod_uid=pod_uid, gpu_uuids=gpus,
                   command=python(script), env=env)


class GpuDouble:
    """NVML's process lists, scripted: `hold` shows a pid on a GPU for the next `reads`
    reads of that GPU; `unavailable` makes every read fail as NVML does when it is down;
    `read_failures` fail that many reads next with `read_failure_code`."""

    def __init__(self) -> None:
        self.holds: dict[str, dict[int, int]] = {}
        self.reads: dict[str, int] = {}
        self.unavailable = False
        self.read_failures = 0
        self.read_failure_code = NvmlCode.UNKNOWN

    def hold(self, uuid: str, pid: int, reads: int) -> None:
        self.holds.setdefault(uuid, {})[pid] = reads

    def processes(self, uuid: str) -> tuple[GpuProcess, ...]:
        self.reads[uuid] = self.reads.get(uuid, 0) + 1
        if self.unavailable:
            raise NvmlUnavailable(9, "driver not loaded")
        if self.read_failures > 0:
            self.read_failures -= 1
            raise ReadFailed(uuid, self.read_failure_code, "process list read failed")
        held = self.holds.get(uuid, {})
        shown = tuple(GpuProcess(pid=pid, used_bytes=1 << 20) for pid, left in
                      sorted(held.items()) if left > 0)
        for pid in held:
            held[pid] -= 1
        return shown


def runner(state_dir: pathlib.Path, gpus: GpuDouble, limits: JobLimits = QUICK) -> JobRunner:
    return JobRunner(state_dir, local_gpu_uuids=LOCAL_GPUS, gpus=gpus, limits=limits)


class Reaper:
    """Kills the process groups of the jobs a test started, and reaps them."""

    def __init__(self) -> None:
        self.started: list[Started] = []

    def add(self, started: Started) -> Started:
        self.started.append(started)
        return started

    def kill_all(self) -> None:
        for job in self.started:
            if procfs.job_members(job.pid, job.start_ticks, job.pgid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.pgid, signal.SIGKILL)
            reap(job.pid)


def reap(pid: int) -> None:
    """Reap `pid` if it is a child of this test process that has ended or is about to."""
    deadline = time.monotonic() + 5
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.01)


@dataclass
class Rig:
    """What a runner test works with: a state directory, the NVML double, the reaper."""

    state: pathlib.Path
    gpus: GpuDouble
    reaper: Reaper

    def runner(self) -> JobRunner:
        return runner(self.state, self.gpus)

    async def start(self, jobs: JobRunner, job: Binding) -> Started:
        outcome = await jobs.start(job)
        assert isinstance(outcome, Started), outcome
        return self.reaper.add(outcome)


async def next_exit(runner: JobRunner) -> Exited:
    with anyio.fail_after(WAIT_S):
        return await runner.exits.receive()


async def wait_for_output(started: Started, text: str) -> str:
    """The job's log once it holds `text`."""
    with anyio.fail_after(WAIT_S):
        while text not in (output := pathlib.Path(started.log_path).read_text()):
            await anyio.sleep(0.01)
    return output


async def wait_dead(pid: int, ticks: int) -> None:
    with anyio.fail_after(WAIT_S):
        while procfs.is_alive(pid, ticks):
            await anyio.sleep(0.01)
