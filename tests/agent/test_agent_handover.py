"""A node's jobs are handed over to the store, and GPUs from job to job, in order: a START_POD
replayed for a job that ran and ended, or a registration while its exit is on its way, leaves
that exit to be reported (it had been reported "could not start", or "lost", first, and the
store keeps the first exit it hears); a pod bound to GPUs a stopping job still holds starts
once that job has ended; and a killed job's exit is reported once NVML shows its GPUs free."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import time
from typing import Any

import anyio
import pytest

from agent import procfs
from agent.gpu import GpuProcess
from agent.job_limits import JobLimits
from agent.jobs import JobRunner
from agent.pods import EXIT_CODE_NOT_STARTED, Pods
from agent.store_link import StoreLink
from statemachine.effects import EffectKind
from statemachine.results import NodeRegistered, PodAssignment
from tests.agent.jobs_support import GPU_A, IGNORE_TERM, GpuDouble, python, runner
from tests.agent.recording_store import RecordingStore

pytestmark = pytest.mark.anyio


def bound_gang(group: str, pod_uid: str, node: str) -> dict[str, Any]:
    return {"group": group, "evicting": "",
            "pods": [{"pod_uid": pod_uid, "node": node, "phase": "bound"}]}


async def _started_and_ended(pods: Pods, jobs: JobRunner, tasks: anyio.abc.TaskGroup,
                             pod: PodAssignment) -> None:
    """Registration lists `pod`, reconcile starts it, and its job exits."""
    await pods.reconcile(NodeRegistered(node="n0", incarnation=1, pods=(pod,)), tasks)
    while jobs.runs(pod.pod_uid):
        await anyio.sleep(0.01)


async def test_a_replayed_start_of_a_pod_that_already_ran_is_not_reported_not_started(
        tmp_path: pathlib.Path) -> None:
    """The agent was away when the pod was bound: registration lists it and reconcile starts
    it; its START_POD effect is still ahead of the cursor and is replayed right after. A quick
    job has exited by then, its exit not yet heard by the store (which still has it bound):
    the replay must be a no-op, not a 'could not start' exit 127 that the store records
    first (the first exit reported wins) in place of the job's own exit code."""
    command = python("import sys; sys.exit(3)")
    pod = PodAssignment(group="g", pod_uid="p1", gpu_uuids=(GPU_A,), env=(), command=command)
    start = {"index": 1, "kind": EffectKind.START_POD.value, "node": "n0", "group": "g",
             "pod_uid": "p1", "gpu_uuids": [GPU_A], "env": [], "command": list(command)}
    fake = RecordingStore("n0", (pod,), gangs={"g": bound_gang("g", "p1", "n0")},
                          effects=(start,))
    link = StoreLink(fake, "n0", retry_ms_max=200)  # type: ignore[arg-type]
    async with runner(tmp_path, GpuDouble()) as jobs:
        pods = Pods(link, jobs, tmp_path)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                await _started_and_ended(pods, jobs, tasks, pod)  # report_exits is behind
                tasks.start_soon(pods.follow_effects)
                await anyio.sleep(0.5)
                tasks.start_soon(pods.report_exits)
                while not fake.times("exit"):
                    await anyio.sleep(0.01)
                await anyio.sleep(0.2)
                tasks.cancel_scope.cancel()
    exits = [args for _, name, args in fake.calls if name == "exit"]
    assert exits[0][3] == 3, exits
    assert all(args[3] != EXIT_CODE_NOT_STARTED for args in exits), exits


async def test_a_start_waits_for_the_job_still_on_its_gpus(tmp_path: pathlib.Path) -> None:
    """The store released gang `old` (ReleaseGroup, a hardware-failure release, a forced
    deregistration) and handed its GPU to gang `new` at once: KILL_POD old, then START_POD new
    on the same GPU. `old` ignores SIGTERM (grace period): `new` must not run on the GPU
    while `old` still does."""
    old_cmd = python(IGNORE_TERM)
    new_cmd = python("import time; print('ready', flush=True); time.sleep(60)")
    old = PodAssignment(group="old", pod_uid="old-pod", gpu_uuids=(GPU_A,), env=(),
                        command=old_cmd)
    kill = {"index": 2, "kind": EffectKind.KILL_POD.value, "node": "n0", "group": "old",
            "pod_uid": "old-pod", "reason": "released by client"}
    start = {"index": 3, "kind": EffectKind.START_POD.value, "node": "n0", "group": "new",
             "pod_uid": "new-pod", "gpu_uuids": [GPU_A], "env": [], "command": list(new_cmd)}
    fake = RecordingStore("n0", gangs={"new": bound_gang("new", "new-pod", "n0")},
                          effects=(kill, start))
    link = StoreLink(fake, "n0", retry_ms_max=200)  # type: ignore[arg-type]
    limits = JobLimits(jobs_max=8, logs_kept_max=16, grace_s=2.0, kill_wait_s=3.0,
                       gpu_release_timeout_s=0.5, gpu_poll_s=0.02, group_poll_s=0.02,
                       exit_poll_s=0.02)
    overlap = False
    async with runner(tmp_path, GpuDouble(), limits) as jobs:
        pods = Pods(link, jobs, tmp_path)
        try:
            with anyio.fail_after(15):
                async with anyio.create_task_group() as tasks:
                    await pods.reconcile(NodeRegistered(node="n0", incarnation=1,
                                                        pods=(old,)), tasks)
                    old_record = jobs.running()[0]
                    await anyio.sleep(0.3)  # the job has set SIG_IGN
                    tasks.start_soon(pods.follow_effects)
                    while procfs.is_alive(old_record.pid, old_record.start_ticks):
                        if jobs.runs("new-pod"):
                            overlap = True
                            break
                        await anyio.sleep(0.01)
                    tasks.cancel_scope.cancel()
        finally:
            for record in jobs.running():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(record.pgid, signal.SIGKILL)
    assert not overlap, "new-pod started on GPU_A while old-pod still ran there"


async def test_a_killed_pods_exit_is_reported_after_its_gpus_are_released(
        tmp_path: pathlib.Path) -> None:
    """reference/nvml.md 3.2 step 6: kill, reap, wait until NVML shows none of the job's pids
    on its GPUs, then clear the binding in the store. The exit report is what clears it (the
    store releases the gang and hands its GPUs to the preemptor waiting on them), so it must
    not reach the store while NVML still lists the job's process (a CUDA context being torn
    down) on the GPU."""


    class Nvml(GpuDouble):
        def __init__(self) -> None:
            super().__init__()
            self.last_listed_s = 0.0

        def processes(self, uuid: str) -> tuple[GpuProcess, ...]:
            shown = super().processes(uuid)
            if shown:
                self.last_listed_s = time.monotonic()
            return shown

    command = python("import time; print('ready', flush=True); time.sleep(60)")
    pod = PodAssignment(group="victim", pod_uid="v1", gpu_uuids=(GPU_A,), env=(),
                        command=command)
    kill = {"index": 5, "kind": EffectKind.KILL_POD.value, "node": "n0", "group": "victim",
            "pod_uid": "v1", "reason": "preempted by boss"}
    fake = RecordingStore("n0", effects=(kill,))
    nvml = Nvml()
    limits = JobLimits(jobs_max=8, logs_kept_max=16, grace_s=0.5, kill_wait_s=3.0,
                       gpu_release_timeout_s=5.0, gpu_poll_s=0.02, group_poll_s=0.02,
                       exit_poll_s=0.02)
    async with runner(tmp_path, nvml, limits) as jobs:
        pods = Pods(StoreLink(fake, "n0", retry_ms_max=200), jobs,  # type: ignore[arg-type]
                    tmp_path)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                await pods.reconcile(NodeRegistered(node="n0", incarnation=1, pods=(pod,)),
                                     tasks)
                (record,) = jobs.running()
                nvml.hold(GPU_A, record.pid, 40)  # ~0.8 s of reads after the kill
                tasks.start_soon(pods.report_exits)
                tasks.start_soon(pods.follow_effects)
                while not fake.times("exit") or nvml.holds[GPU_A][record.pid] > 0:
                    await anyio.sleep(0.01)
                await anyio.sleep(0.1)
                tasks.cancel_scope.cancel()
    (exit_at,) = fake.times("exit")
    assert exit_at > nvml.last_listed_s, (
        f"the exit reached the store {nvml.last_listed_s - exit_at:.2f} s before NVML "
        "stopped listing the job's process on its GPU")


async def test_a_re_registration_does_not_call_lost_a_job_whose_exit_is_queued(
        tmp_path: pathlib.Path) -> None:
    """The agent was cut off from the store for long: jobs ended meanwhile, their exits wait
    in the runner's stream behind report_exits (itself retrying). The store comes back, the
    watch says effects were trimmed, the agent registers again and reconciles: a job whose
    exit (with its code) is queued must not be reported 'lost, exit status unknown' first
    (the store keeps the first exit it hears)."""
    command = python("import sys; sys.exit(3)")
    pod = PodAssignment(group="g", pod_uid="p1", gpu_uuids=(GPU_A,), env=(), command=command)
    fake = RecordingStore("n0", gangs={"g": bound_gang("g", "p1", "n0")})
    link = StoreLink(fake, "n0", retry_ms_max=200)  # type: ignore[arg-type]
    async with runner(tmp_path, GpuDouble()) as jobs:
        pods = Pods(link, jobs, tmp_path)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                await _started_and_ended(pods, jobs, tasks, pod)  # its exit queued, unreported
                # registered again (incarnation 2): the store still has p1 bound here
                await pods.reconcile(NodeRegistered(node="n0", incarnation=2, pods=(pod,)),
                                     tasks)
                tasks.start_soon(pods.report_exits)
                while len(fake.times("exit")) < 1:
                    await anyio.sleep(0.01)
                await anyio.sleep(0.2)
                tasks.cancel_scope.cancel()
    exits = [args for _, name, args in fake.calls if name == "exit"]
    assert exits[0][3] == 3, exits
