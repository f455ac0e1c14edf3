"""Ended jobs' processes left on a GPU (`agent.gpu_leftovers`): the job runner tells the monitor,
the GPU fails in what the monitor reports to the store before the exit goes out, and it recovers
by itself once NVML no longer lists them; a pid reused by another process is not the job's; the
registry stays bounded. On the fake GPU backend, a recording store and real child processes."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import pytest

from agent import procfs
from agent.exporter import AgentView
from agent.fake_backend import FakeGpuBackend
from agent.gpu_leftovers import LEFTOVERS, GpuLeftovers, Look
from agent.health import HealthTracker
from agent.health_policy import HealthPolicy
from agent.job_outcomes import Started
from agent.jobs import JobRunner
from agent.monitor import Monitor
from agent.store_link import StoreLink
from statemachine.commands import GpuInventory, HealthReport, HealthStatus
from tests.agent.agent_support import (
    ADMIN,
    SCHEDULER,
    configured_cluster,
    eventually,
    gpu_view,
    store,
)
from tests.agent.agent_support import running_agent as agent_of
from tests.agent.jobs_support import QUICK, Reaper, binding, next_exit
from tests.agent.recording_store import RecordingStore
from tests.agent.test_agent_pods import bind, job, until_phase, until_started

pytestmark = pytest.mark.anyio
FAIL, PASS = HealthStatus.FAIL, HealthStatus.PASS
CLEAN_CHECKS = HealthPolicy().clean_checks_to_recover
QUICK_EXIT = "print('done', flush=True)"


@dataclass
class Node:
    """A monitor of a fake backend's GPUs with an empty leftovers registry, reporting to a
    recording store, and the GPU the tests use."""

    backend: FakeGpuBackend
    monitor: Monitor
    store: RecordingStore
    uuid: str

    def reports(self) -> list[HealthReport]:
        """Every health report sent for the test's GPU, oldest first."""
        return [report for _, name, args in self.store.calls if name == "health"
                for report in args[2] if report.uuid == self.uuid]

    def status(self) -> HealthStatus:
        (verdict,) = [verdict for verdict in self.monitor.tracker.verdicts()
                      if verdict.uuid == self.uuid]
        return verdict.status

    def runner(self, state_dir: pathlib.Path) -> JobRunner:
        return JobRunner(state_dir, local_gpu_uuids=self.backend.uuids(), gpus=self.backend,
                         limits=QUICK, leftovers=self.monitor)

    async def start(self, jobs: JobRunner, script: str, reaper: Reaper) -> Started:
        """A job on the test's GPU, which NVML lists it on from now on."""
        started = await jobs.start(binding("p1", script, gpus=(self.uuid,)))
        assert isinstance(started, Started), started
        self.backend.add_process(self.uuid, started.pid, 1 << 30)
        return reaper.add(started)


@asynccontextmanager
async def watched_node() -> AsyncIterator[Node]:
    backend = FakeGpuBackend.from_profile("a100-8", seed=1)
    backend.start()
    devices = backend.devices()
    store = RecordingStore("n0")
    link = StoreLink(store, "n0", retry_ms_max=200)  # type: ignore[arg-type]

    async def read_gpus() -> tuple[list[GpuInventory], list[object]]:
        return [GpuInventory(uuid=device.uuid, index=device.index,
                             pci_bus_id=f"00000000:0{device.index}:00.0", model="A100",
                             memory_mib=81_920) for device in devices], []

    await link.register("boot", read_gpus)  # type: ignore[arg-type]
    view = AgentView(node="n0")
    view.devices = devices
    monitor = Monitor(backend, HealthTracker(HealthPolicy(), devices, now_ms=0), link, view,
                      poll_ms=10, event_wait_ms=10, retry_ms_max=100, clock_ms=lambda: 0,
                      leftovers=GpuLeftovers())
    node = Node(backend=backend, monitor=monitor, store=store, uuid=devices[2].uuid)
    await monitor.poll_once()
    assert node.status() is PASS
    yield node


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    kept = Reaper()
    yield kept
    kept.kill_all()


def ended_process() -> tuple[int, int]:
    """The pid and start ticks of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    ticks = procfs.start_ticks(child.pid)
    assert ticks is not None
    child.communicate(b"")
    return child.pid, ticks


async def test_a_job_left_on_its_gpu_fails_it_before_its_exit_goes_out(
        tmp_path: pathlib.Path, reaper: Reaper) -> None:
    async with watched_node() as node, node.runner(tmp_path) as jobs:
        started = await node.start(jobs, "import time; time.sleep(0.2)", reaper)
        exited = await next_exit(jobs)
        assert exited.pod_uid == "p1"
        # Reported before the exit was handed out, which frees the GPU in the store.
        last = node.reports()[-1]
        assert last.status is FAIL
        assert last.reason == (f"device/ended_job_processes: processes of an ended job still "
                               f"on the GPU after 0.5 s: pids [{started.pid}]; pod p1")
        assert node.monitor.leftovers.uuids() == (node.uuid,)
        others = [verdict.status for verdict in node.monitor.tracker.verdicts()
                  if verdict.uuid != node.uuid]
        assert others == [PASS] * 7


async def test_a_pid_reused_by_another_process_does_not_fail_the_gpu(
        tmp_path: pathlib.Path, reaper: Reaper, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML lists the job's pid number after the job ended, but /proc shows another process
    under it (another start time): it is not the job's, and the GPU stays healthy."""
    real_start_ticks = procfs.start_ticks
    job_pids: dict[int, int] = {}

    def reused(pid: int) -> int | None:
        ticks = real_start_ticks(pid)
        if ticks is None and pid in job_pids:
            return job_pids[pid] + 1  # a new process took the number
        return ticks

    async with watched_node() as node, node.runner(tmp_path) as jobs:
        monkeypatch.setattr(procfs, "start_ticks", reused)
        started = await node.start(jobs, QUICK_EXIT, reaper)
        job_pids[started.pid] = started.start_ticks
        await next_exit(jobs)
        await node.monitor.poll_once()
        assert node.status() is PASS
        assert all(report.status is PASS for report in node.reports())
        assert node.monitor.leftovers.uuids() == ()


async def test_the_gpu_recovers_after_the_processes_go_and_the_clean_checks() -> None:
    pid, ticks = ended_process()
    async with watched_node() as node:
        node.backend.add_process(node.uuid, pid, 1 << 30)
        await node.monitor.job_lingers("p1", {node.uuid: {pid: ticks}}, 30.0)
        assert node.reports()[-1].status is FAIL
        assert "still on the GPU after 30 s: pids [" in node.reports()[-1].reason
        for _ in range(2 * CLEAN_CHECKS):  # NVML still lists the context: it stays failed
            await node.monitor.poll_once()
            assert node.status() is FAIL
        node.backend.remove_process(node.uuid, pid)
        for _ in range(CLEAN_CHECKS - 1):  # the run of clean checks, as for any FAIL
            await node.monitor.poll_once()
            assert node.status() is FAIL
            assert node.monitor.leftovers.uuids() == (node.uuid,)
        await node.monitor.poll_once()
        assert node.status() is PASS
        assert node.reports()[-1].status is PASS
        assert node.monitor.leftovers.uuids() == ()  # the record is forgotten


async def test_a_listing_again_during_the_clean_run_restarts_it() -> None:
    pid, ticks = ended_process()
    async with watched_node() as node:
        await node.monitor.job_lingers("p1", {node.uuid: {pid: ticks}}, 30.0)
        for _ in range(CLEAN_CHECKS - 1):
            await node.monitor.poll_once()
        node.backend.add_process(node.uuid, pid, 1 << 30)
        await node.monitor.poll_once()
        node.backend.remove_process(node.uuid, pid)
        for _ in range(CLEAN_CHECKS - 1):
            await node.monitor.poll_once()
            assert node.status() is FAIL
        await node.monitor.poll_once()
        assert node.status() is PASS


async def test_a_pid_reused_after_the_note_lets_the_gpu_recover() -> None:
    """The pid was the job's when the release timed out; a new process has it now and NVML
    lists that one: the evidence is gone."""
    ticks = procfs.start_ticks(os.getpid())
    assert ticks is not None
    async with watched_node() as node:
        node.backend.add_process(node.uuid, os.getpid(), 1 << 20)
        await node.monitor.job_lingers("p1", {node.uuid: {os.getpid(): ticks + 1}}, 30.0)
        assert node.status() is FAIL
        for _ in range(CLEAN_CHECKS):
            await node.monitor.poll_once()
        assert node.status() is PASS
        assert node.monitor.leftovers.uuids() == ()


async def test_an_operator_clear_with_the_processes_gone_forgets_the_record() -> None:
    pid, ticks = ended_process()
    async with watched_node() as node:
        await node.monitor.job_lingers("p1", {node.uuid: {pid: ticks}}, 30.0)
        assert node.monitor.tracker.clear(node.uuid)
        await node.monitor.poll_once()
        assert node.status() is PASS
        assert node.monitor.leftovers.uuids() == ()


async def test_the_agent_fails_the_gpu_in_the_store_before_the_exit_and_recovers_it(
        tmp_path: pathlib.Path) -> None:
    """The daemon's wiring: the runner tells the monitor, which reports to the store before
    the exit frees the GPU there; the store sees the GPU pass again once NVML lets go."""
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    marks = tmp_path / "jobs"
    marks.mkdir()
    with anyio.fail_after(30):
        async with configured_cluster() as cluster, store(cluster, SCHEDULER) as scheduler, \
                store(cluster, ADMIN) as admin, agent_of(cluster, "n0", gpus, tmp_path / "agent"):
            await bind(scheduler, "left", job(marks, "left", seconds=1.0), pods=2)
            pid, uuid = await until_started(marks, "left")
            gpus.add_process(uuid, int(pid), 1 << 30)
            await until_phase(admin, "left", "exited")
            view = await gpu_view(admin, "n0", uuid)
            assert view["status"] == "fail" and not view["placeable"], view
            assert "processes of an ended job still on the GPU after 1 s" in view["reason"]
            gpus.remove_process(uuid, int(pid))

            async def recovered() -> bool | None:
                return True if (await gpu_view(admin, "n0", uuid))["status"] == "pass" else None
            await eventually(recovered, what="the GPU passing again")


def test_the_registry_stays_bounded() -> None:
    leftovers = GpuLeftovers(gpus_max=2, pids_per_gpu_max=3, pods_per_gpu_max=2)
    for ended in range(100):
        for gpu in range(4):
            leftovers.note(f"GPU-{gpu}", f"pod-{ended}",
                           {1000 * ended + pid: 7 for pid in range(5)}, 30.0)
    assert leftovers.uuids() == ("GPU-0", "GPU-1")
    assert leftovers.notes_dropped == 200
    assert all(len(leftovers.pids(uuid)) == 3 for uuid in leftovers.uuids())
    finding = leftovers.note("GPU-0", "pod-last", {1: 7}, 30.0)
    assert finding is not None and finding.status is FAIL
    assert "pods pod-0, pod-1 (+99 more)" in finding.message
    assert "(+497 more)" in finding.message  # the untracked pids
    for uuid in leftovers.uuids():
        leftovers.forget(uuid)
    assert leftovers.uuids() == ()


def test_with_untracked_pids_any_listed_process_keeps_the_gpu_failed() -> None:
    leftovers = GpuLeftovers(pids_per_gpu_max=1)
    leftovers.note("GPU-0", "p1", {10: 1, 11: 1}, 30.0)
    listed = leftovers.judge("GPU-0", Look(lingering=(), listed_count=1))
    assert listed is not None and listed.status is FAIL and listed.key == LEFTOVERS
    empty = leftovers.judge("GPU-0", Look(lingering=(), listed_count=0))
    assert empty is not None and empty.status is PASS
    assert leftovers.judge("GPU-1", Look(lingering=(), listed_count=0)) is None
