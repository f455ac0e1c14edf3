"""A KILL_POD that meets a deferred start between its standing check and its launch: the job
must never launch after its kill was reported."""

from __future__ import annotations

import os
import pathlib
import signal
import time
from typing import Any

import anyio
import pytest

from agent.pods import Pods
from agent.store_link import StoreLink
from tests.agent.jobs_support import GPU_A, GpuDouble, Reaper, binding, runner
from tests.agent.recording_store import RecordingStore

pytestmark = pytest.mark.anyio


class EvictedAfterFirstLook(RecordingStore):
    """The gang is bound at the first query, and evicted right after it (a preemption):
    every later query says evicting, as the KILL_POD effect that follows does."""

    def __init__(self, node: str, gang: dict[str, Any]) -> None:
        super().__init__(node, gangs={gang["group"]: gang})
        self.looked = anyio.Event()

    async def gang(self, group: str, *, node: str | None = None) -> Any:
        answer = dict(self.gangs[group])
        if not self.looked.is_set():
            self.looked.set()
            self.gangs[group] = {**answer, "evicting": "preempted"}
        return answer


async def test_a_kill_during_a_deferred_start_never_leaves_a_job_reported_killed(
        tmp_path: pathlib.Path, monkeypatch) -> None:
    """The deferred start saw the pod bound; the gang is preempted and its KILL_POD handled
    before the start reaches the ledger: `_kill` finds nothing running or started, reports the
    pod killed before its start (137), and the start then launches it anyway, a job running on
    GPUs the store takes for free (until its refused ack stops it)."""
    pod = binding("pod-p", gpus=(GPU_A,))
    fake = EvictedAfterFirstLook("n0", {"group": pod.group, "evicting": "", "pods": [
        {"pod_uid": pod.pod_uid, "node": "n0", "phase": "bound"}]})
    reaper = Reaper()
    async with runner(tmp_path, GpuDouble()) as jobs:
        remember = jobs._remember

        def slow_remember(pod_uid: str) -> None:  # an fsync on a busy disk
            time.sleep(0.3)
            remember(pod_uid)

        monkeypatch.setattr(jobs, "_remember", slow_remember)
        pods = Pods(StoreLink(fake, "n0", retry_ms_max=200), jobs,  # type: ignore[arg-type]
                    tmp_path)
        try:
            with anyio.fail_after(20):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(pods._start_when_free, pod)
                    await fake.looked.wait()
                    await pods._kill(pod.group, pod.pod_uid)  # the KILL_POD effect
                    await anyio.sleep(1.0)
                    tasks.cancel_scope.cancel()
        finally:
            for record in jobs.running():
                os.killpg(record.pgid, signal.SIGKILL)
            reaper.kill_all()
    killed = [args for _, name, args in fake.calls if name == "exit" and args[3] == 137]
    launched = jobs.started_before(pod.pod_uid)
    not_started = [args for _, name, args in fake.calls if name == "exit" and args[3] == 127]
    assert not not_started, not_started
    assert not (killed and launched), (
        f"reported killed before start {killed} and launched too")
