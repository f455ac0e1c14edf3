"""A KILL_POD whose stop finds nothing because a deferred start is launching the pod at that
moment (it holds the runner's lock, its ledger write under way on a busy disk): the kill waits
for the lock, learns the pod started, and must then stop the job it launched. It returned
instead, leaving the job running: the store accepts the ack of an evicting gang's pod, and
resends kills only to a preemption's victims, so a drained gang (or one evicted for a failed
pod) waited for that job to end on its own, its GPUs held and the drain stuck."""

from __future__ import annotations

import os
import pathlib
import signal
import threading
from typing import Any

import anyio
import pytest

from agent import procfs
from agent.pods import Pods
from agent.store_link import StoreLink
from tests.agent.jobs_support import GPU_A, WAIT_S, GpuDouble, Reaper, binding, runner
from tests.agent.recording_store import RecordingStore

pytestmark = pytest.mark.anyio


class DrainedAfterFirstLook(RecordingStore):
    """The gang is bound at the first query and drained right after it: every later query
    says evicting, as the KILL_POD effect that follows does."""

    async def gang(self, group: str, *, node: str | None = None) -> Any:
        answer = dict(self.gangs[group])
        self.gangs[group] = {**answer, "evicting": "node n0 draining"}
        return answer


async def test_a_kill_that_meets_a_launch_under_way_stops_the_job(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pod = binding("pod-p", gpus=(GPU_A,))
    fake = DrainedAfterFirstLook("n0", gangs={pod.group: {
        "group": pod.group, "evicting": "",
        "pods": [{"pod_uid": pod.pod_uid, "node": "n0", "phase": "bound"}]}})
    entered, go_on = threading.Event(), threading.Event()
    reaper = Reaper()
    async with runner(tmp_path, GpuDouble()) as jobs:
        remember = jobs._remember

        def slow_remember(pod_uid: str) -> None:  # the ledger's fsync on a busy disk
            entered.set()
            go_on.wait(WAIT_S)
            remember(pod_uid)

        monkeypatch.setattr(jobs, "_remember", slow_remember)
        pods = Pods(StoreLink(fake, "n0", retry_ms_max=200), jobs,  # type: ignore[arg-type]
                    tmp_path)
        try:
            with anyio.fail_after(WAIT_S):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(pods._start_when_free, pod)  # GPUs free: it launches
                    while not entered.is_set():
                        await anyio.sleep(0.01)
                    tasks.start_soon(pods._kill, pod.group, pod.pod_uid)  # the KILL_POD
                    while jobs._locked().statistics().tasks_waiting == 0:
                        await anyio.sleep(0.01)  # the kill found nothing; it waits to forbid
                    go_on.set()
            running = [record for record in jobs.running()
                       if procfs.is_alive(record.pid, record.start_ticks)]
        finally:
            go_on.set()
            for record in jobs.running():
                if procfs.is_alive(record.pid, record.start_ticks):
                    os.killpg(record.pgid, signal.SIGKILL)
            reaper.kill_all()
    assert jobs.started_before(pod.pod_uid)  # the launch won the lock, as arranged
    assert not running, f"the kill left {[record.pid for record in running]} running"
