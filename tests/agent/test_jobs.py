"""The job runner with real child processes (scripts run by this interpreter), on trio and on
asyncio: the environment a job sees, exit codes, start failures and refusals, stops (SIGTERM,
SIGKILL after grace, grandchildren, NVML confirmation), at-most-once starts, and
reconciliation after an agent restart."""

from __future__ import annotations

import functools
import os
import pathlib
import signal

import anyio
import pytest

from agent import process_watch, procfs
from agent.binding import Binding
from agent.gpu import NvmlCode
from agent.job_outcomes import (
    EXIT_CODE_UNKNOWN,
    REASON_ADOPTED_EXIT,
    REASON_LOST,
    Exited,
    GpuRelease,
    Started,
    StartFailed,
    StartRefused,
    Termination,
)
from agent.job_state import JobRecord, JobRecords
from tests.agent.jobs_support import (
    GPU_A,
    GPU_B,
    IGNORE_TERM,
    LEAVES_CHILD,
    STUBBORN_CHILD,
    WAIT_S,
    binding,
    child_of,
    next_exit,
    wait_dead,
    wait_for_output,
)

pytestmark = pytest.mark.anyio
SHOW_ENV = ("import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')), "
            "os.environ.get('CUDA_DEVICE_ORDER'), os.environ.get('FROM_STORE'))")


async def test_a_job_sees_its_gpus_by_uuid_in_pci_order(rig) -> None:
    async with rig.runner() as jobs:
        job = binding("p1", SHOW_ENV, gpus=(GPU_B, GPU_A),
                      env=(("FROM_STORE", "yes"), ("CUDA_VISIBLE_DEVICES", "0")))
        started = await rig.start(jobs, job)
        assert (await next_exit(jobs)).exit_code == 0
    output = pathlib.Path(started.log_path).read_text()
    assert output == f"'{GPU_B},{GPU_A}' PCI_BUS_ID yes\n"


async def test_a_cpu_only_job_sees_an_empty_device_list_not_an_unset_one(rig) -> None:
    async with rig.runner() as jobs:
        started = await rig.start(jobs, binding("cpu", SHOW_ENV))
        assert (await next_exit(jobs)).exit_code == 0
    assert pathlib.Path(started.log_path).read_text() == "'' PCI_BUS_ID None\n"


@pytest.mark.parametrize(("script", "code", "reason"), [
    ("pass", 0, "exited with code 0"),
    ("import sys; sys.exit(3)", 3, "exited with code 3"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGUSR1)", 128 + signal.SIGUSR1,
     "killed by signal 10 (SIGUSR1)"),
])
async def test_exits_are_reported_with_the_shell_convention(rig, script, code,
                                                            reason) -> None:
    async with rig.runner() as jobs:
        await rig.start(jobs, binding("p1", script))
        assert await next_exit(jobs) == Exited(pod_uid="p1", group="gang-p1", exit_code=code,
                                               reason=reason)
        assert jobs.running() == ()


async def test_exits_are_seen_without_pidfd_too(rig, monkeypatch) -> None:
    monkeypatch.setattr(process_watch, "pidfd_supported", lambda: False)
    async with rig.runner() as jobs:
        await rig.start(jobs, binding("p1", "import sys; sys.exit(7)"))
        assert (await next_exit(jobs)).exit_code == 7


@pytest.mark.parametrize(("command", "reason"), [
    (("/nonexistent/program",), "No such file"),
    (("no-such-command-anywhere",), "not found in PATH"),
    (("{not_executable}",), "Permission denied"),
])
async def test_a_command_that_cannot_start_fails_and_the_runner_goes_on(
        rig, tmp_path, command, reason) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\n")
    command = tuple(arg.format(not_executable=script) for arg in command)
    async with rig.runner() as jobs:
        outcome = await jobs.start(Binding(group="g", pod_uid="bad", gpu_uuids=(),
                                           command=command))
        assert isinstance(outcome, StartFailed), outcome
        assert reason in outcome.reason
        assert jobs.running() == ()
        await rig.start(jobs, binding("good", "pass"))
        assert (await next_exit(jobs)).pod_uid == "good"
        again = await jobs.start(binding("bad"))
        assert isinstance(again, StartRefused)


@pytest.mark.parametrize(("job", "reason"), [
    (binding("p1", gpus=("GPU-ffffffff-0000-0000-0000-000000000000",)),
     "GPU GPU-ffffffff-0000-0000-0000-000000000000 is not on this node"),
    (binding("p1", gpus=(GPU_A, GPU_A)), "a GPU is named twice"),
    (binding("p1", "x" * 200_000), "argument 2 is over 131072 bytes"),
    (binding("", "pass"), "the pod uid is empty"),
])
async def test_an_invalid_binding_is_refused_with_the_reason(rig, job, reason) -> None:
    async with rig.runner() as jobs:
        outcome = await jobs.start(job)
        assert outcome == StartRefused(pod_uid=job.pod_uid, reason=reason)
        assert jobs.running() == ()


async def test_a_pod_is_started_at_most_once_even_by_a_new_runner(rig) -> None:
    async with rig.runner() as jobs:
        await rig.start(jobs, binding("once", "pass"))
        assert isinstance(await jobs.start(binding("once", "pass")), StartRefused)
        await next_exit(jobs)
        assert isinstance(await jobs.start(binding("once", "pass")), StartRefused)
    async with rig.runner() as jobs:
        refused = await jobs.start(binding("once", "pass"))
        assert isinstance(refused, StartRefused)
        assert "at most once" in refused.reason


async def test_the_record_is_on_disk_while_the_job_runs(rig) -> None:
    async with rig.runner() as jobs:
        started = await rig.start(jobs, binding("p1"))
        (record,) = JobRecords(rig.state).all()
        assert (record.pid, record.pgid, record.start_ticks) == (
            started.pid, started.pgid, started.start_ticks)
        assert record.binding == binding("p1")
        assert record.started_unix_ns > 0
        assert jobs.running() == (record,)
        await jobs.stop("p1")
        await next_exit(jobs)
        assert JobRecords(rig.state).all() == ()


async def test_stop_sends_sigterm_and_the_job_ends_cleanly(rig) -> None:
    async with rig.runner() as jobs:
        started = await rig.start(jobs, binding("p1"))
        await wait_for_output(started, "ready")
        outcome = await jobs.stop("p1", grace_s=5.0)
        assert outcome.termination is Termination.STOPPED
        assert outcome.gpu_release is GpuRelease.NO_GPUS
        assert not outcome.needs_attention
        exited = await next_exit(jobs)
        assert exited.exit_code == 128 + signal.SIGTERM
        assert exited.reason == "stopped by the agent; killed by signal 15 (SIGTERM)"


async def test_a_job_ignoring_sigterm_is_killed_after_the_grace(rig) -> None:
    async with rig.runner() as jobs:
        started = await rig.start(jobs, binding("p1", IGNORE_TERM))
        await wait_for_output(started, "ready")
        outcome = await jobs.stop("p1", grace_s=0.2)
        assert outcome.termination is Termination.KILLED
        assert (await next_exit(jobs)).exit_code == 128 + signal.SIGKILL


async def test_stop_kills_grandchildren_in_the_group(rig) -> None:
    async with rig.runner() as jobs:
        started = await rig.start(jobs, binding("p1", STUBBORN_CHILD))
        child, child_ticks = child_of(await wait_for_output(started, "child"))
        assert procfs.read_stat(child).pgid == started.pgid  # type: ignore[union-attr]
        outcome = await jobs.stop("p1", grace_s=0.2)
        assert outcome.termination is Termination.KILLED  # the child outlived SIGTERM
        assert (await next_exit(jobs)).exit_code == 128 + signal.SIGTERM
        assert not procfs.is_alive(child, child_ticks)


async def test_processes_a_job_leaves_behind_end_with_it(rig) -> None:
    async with rig.runner() as jobs:
        started = await rig.start(jobs, binding("p1", LEAVES_CHILD))
        child, child_ticks = child_of(await wait_for_output(started, "child"))
        assert (await next_exit(jobs)).exit_code == 0
        assert not procfs.is_alive(child, child_ticks)


async def test_a_stop_cancelled_part_way_still_ends_the_jobs_processes(rig) -> None:
    """The agent cancels its stops when it registers again: the processes the job's leader
    leaves behind are still ended before its exit is reported (their GPUs go to the next
    gang)."""
    async with rig.runner() as jobs:
        started = await rig.start(jobs, binding("p1", STUBBORN_CHILD))
        child, child_ticks = child_of(await wait_for_output(started, "child"))
        async with anyio.create_task_group() as stops:
            stops.start_soon(functools.partial(jobs.stop, "p1", grace_s=WAIT_S))
            await wait_dead(started.pid, started.start_ticks)  # the leader died of SIGTERM
            stops.cancel_scope.cancel()  # the child, which ignores SIGTERM, still runs
        exited = await next_exit(jobs)
        assert exited.reason.startswith("stopped by the agent"), exited
        assert not procfs.is_alive(child, child_ticks)


async def test_stop_waits_until_nvml_lets_go_of_the_job(rig) -> None:
    async with rig.runner() as jobs:
        started = await rig.start(jobs, binding("p1", gpus=(GPU_A, GPU_B)))
        rig.gpus.hold(GPU_B, started.pid, reads=3)
        rig.gpus.hold(GPU_B, os.getpid(), reads=100)  # another process: not the job's
        outcome = await jobs.stop("p1")
        assert outcome.gpu_release is GpuRelease.RELEASED
        assert not outcome.needs_attention
        assert rig.gpus.reads[GPU_B] >= 4


async def test_a_job_lingering_on_its_gpu_needs_attention(rig) -> None:
    async with rig.runner() as jobs:
        started = await rig.start(jobs, binding("p1", gpus=(GPU_A,)))
        rig.gpus.hold(GPU_A, started.pid, reads=10**6)
        outcome = await jobs.stop("p1")
        assert outcome.termination is Termination.STOPPED
        assert outcome.gpu_release is GpuRelease.LINGERING
        assert outcome.lingering_pids == (started.pid,)
        assert outcome.needs_attention


async def test_nvml_down_during_a_stop_leaves_the_release_unchecked(rig) -> None:
    async with rig.runner() as jobs:
        await rig.start(jobs, binding("p1", gpus=(GPU_A,)))
        rig.gpus.unavailable = True
        outcome = await jobs.stop("p1")
        assert outcome.gpu_release is GpuRelease.UNCHECKED
        assert "NVML unavailable" in outcome.detail
        assert outcome.needs_attention


async def test_a_process_list_that_fails_to_read_is_read_again(rig) -> None:
    async with rig.runner() as jobs:
        await rig.start(jobs, binding("p1", gpus=(GPU_A,)))
        rig.gpus.read_failures = 2
        outcome = await jobs.stop("p1")
        assert outcome.gpu_release is GpuRelease.RELEASED
        # Two failed reads and one that shows the GPU free, at least: the watcher checks the
        # release too before it reports the exit, and may meet some of the failures first.
        assert rig.gpus.reads[GPU_A] >= 3


async def test_a_process_list_that_never_reads_leaves_the_release_unchecked(rig) -> None:
    async with rig.runner() as jobs:
        await rig.start(jobs, binding("p1", gpus=(GPU_A,)))
        rig.gpus.read_failures = 10**6
        outcome = await jobs.stop("p1")
        assert outcome.gpu_release is GpuRelease.UNCHECKED
        assert "process list read failed" in outcome.detail
        assert outcome.needs_attention
        assert rig.gpus.reads[GPU_A] > 1


async def test_a_gpu_without_process_lists_leaves_the_release_unchecked_at_once(rig) -> None:
    async with rig.runner() as jobs:
        await rig.start(jobs, binding("p1", gpus=(GPU_A,)))
        rig.gpus.read_failures = 10**6
        rig.gpus.read_failure_code = NvmlCode.NOT_SUPPORTED
        outcome = await jobs.stop("p1")
        assert outcome.gpu_release is GpuRelease.UNCHECKED
        await next_exit(jobs)  # the exit's watcher has had its look too (it may come later)
        assert rig.gpus.reads[GPU_A] == 2  # once by the stop, once by the exit's watcher


async def test_stopping_an_unknown_or_ended_pod_does_nothing(rig) -> None:
    async with rig.runner() as jobs:
        assert (await jobs.stop("nobody")).termination is Termination.NOT_RUNNING
        await rig.start(jobs, binding("p1", "pass"))
        await next_exit(jobs)
        outcome = await jobs.stop("p1")
        assert outcome.termination is Termination.NOT_RUNNING
        assert not outcome.needs_attention


async def test_a_restarted_runner_reconciles_with_the_store(rig) -> None:
    async with rig.runner() as first:
        adopted = await rig.start(first, binding("adopt"))
        dead = await rig.start(first, binding("dead"))
        await rig.start(first, binding("unknown"))
    # The agent is gone; its jobs run on. One of them dies meanwhile.
    os.killpg(dead.pgid, signal.SIGKILL)
    await wait_dead(dead.pid, dead.start_ticks)
    async with rig.runner() as second:
        report = await second.reconcile([binding("new"), binding("dead"), binding("adopt")])
        assert report.adopted == (binding("adopt"),)
        assert report.lost == (Exited(pod_uid="dead", group="gang-dead",
                                      exit_code=EXIT_CODE_UNKNOWN, reason=REASON_LOST),)
        assert report.to_start == (binding("new"),)
        assert report.to_stop == (binding("unknown"),)
        assert (await second.stop("unknown")).termination is Termination.STOPPED
        assert (await next_exit(second)).pod_uid == "unknown"
        os.kill(adopted.pid, signal.SIGTERM)
        assert await next_exit(second) == Exited(
            pod_uid="adopt", group="gang-adopt", exit_code=EXIT_CODE_UNKNOWN,
            reason=REASON_ADOPTED_EXIT)
        assert isinstance(await second.start(binding("dead")), StartRefused)
        assert isinstance(await rig.start(second, binding("new", "pass")), Started)
    assert {record.binding.pod_uid for record in JobRecords(rig.state).all()} <= {"new"}


async def test_a_lost_job_s_leftover_processes_are_stopped(rig) -> None:
    async with rig.runner() as first:
        started = await rig.start(first, binding("p1", STUBBORN_CHILD))
        child, child_ticks = child_of(await wait_for_output(started, "child"))
    os.kill(started.pid, signal.SIGKILL)
    await wait_dead(started.pid, started.start_ticks)
    assert procfs.is_alive(child, child_ticks)
    async with rig.runner() as second:
        report = await second.reconcile([binding("p1", STUBBORN_CHILD)])
        assert [lost.pod_uid for lost in report.lost] == ["p1"]
        assert not procfs.is_alive(child, child_ticks)


async def test_adopted_jobs_are_watched_without_pidfd_too(rig, monkeypatch) -> None:
    async with rig.runner() as first:
        started = await rig.start(first, binding("p1"))
    monkeypatch.setattr(process_watch, "pidfd_supported", lambda: False)
    async with rig.runner() as second:
        assert (await second.reconcile([binding("p1")])).adopted == (binding("p1"),)
        os.kill(started.pid, signal.SIGTERM)
        assert (await next_exit(second)).exit_code == EXIT_CODE_UNKNOWN


async def test_a_recorded_pid_reused_by_another_process_counts_as_dead(rig) -> None:
    ticks = procfs.start_ticks(os.getpid())
    assert ticks is not None
    rig.state.mkdir()
    JobRecords(rig.state).put(JobRecord(
        binding=binding("p1"), pid=os.getpid(), pgid=os.getpid(), start_ticks=ticks + 1,
        started_unix_ns=0, log_path="/dev/null"))
    async with rig.runner() as jobs:
        report = await jobs.reconcile([binding("p1")])
        assert report.adopted == ()
        assert [lost.pod_uid for lost in report.lost] == ["p1"]
        assert jobs.running() == ()
    assert JobRecords(rig.state).all() == ()


async def test_the_runner_refuses_more_than_jobs_max(rig) -> None:
    async with rig.runner() as jobs:
        for index in range(jobs.limits.jobs_max):
            await rig.start(jobs, binding(f"p{index}"))
        refused = await jobs.start(binding("one-more"))
        assert isinstance(refused, StartRefused)
        assert "jobs_max" in refused.reason


async def test_an_error_in_the_body_comes_out_unwrapped(rig) -> None:
    with pytest.raises(KeyError):
        async with rig.runner() as jobs:
            await rig.start(jobs, binding("p1"))
            raise KeyError("the caller's own")
