"""Two gangs may name a pod alike on one node (uids are unique only within a gang). While one
gang's pod waits for its GPUs (a deferred start: a released gang's job still ends there), the
other gang's START_POD of the same uid was taken for a replay of it (`_starting` held uids, not
gangs' pods) and dropped: that pod was neither started nor reported, and its gang waited for
it until the agent happened to register again."""

from __future__ import annotations

import os
import pathlib
import signal

import anyio
import pytest

from agent.binding import Binding
from agent.job_outcomes import Started
from agent.pods import Pods
from agent.store_link import StoreLink
from tests.agent.jobs_support import GPU_A, SLEEP, WAIT_S, GpuDouble, binding, python, runner
from tests.agent.recording_store import RecordingStore

pytestmark = pytest.mark.anyio


async def test_a_start_deferred_for_one_gang_does_not_swallow_anothers_of_that_uid(
        tmp_path: pathlib.Path) -> None:
    old = binding("old", gpus=(GPU_A,))  # a released gang's job, still ending on GPU_A
    waiting = Binding(group="y", pod_uid="p", gpu_uuids=(GPU_A,), command=python(SLEEP))
    other = Binding(group="x", pod_uid="p", gpu_uuids=(), command=python(SLEEP))
    fake = RecordingStore("n0", gangs={group: {"group": group, "evicting": "", "pods": [
        {"pod_uid": "p", "node": "n0", "phase": "bound"}]} for group in ("x", "y")})
    async with runner(tmp_path, GpuDouble()) as jobs:
        pods = Pods(StoreLink(fake, "n0", retry_ms_max=200), jobs,  # type: ignore[arg-type]
                    tmp_path)
        try:
            assert isinstance(await jobs.start(old), Started)
            with anyio.fail_after(WAIT_S):
                async with anyio.create_task_group() as tasks:
                    await pods._start_or_defer(waiting, tasks)  # deferred: GPU_A is held
                    await pods._start_or_defer(other, tasks)
                    tasks.cancel_scope.cancel()
        finally:
            for record in jobs.running():
                os.killpg(record.pgid, signal.SIGKILL)
    heard = [args for _, name, args in fake.calls
             if name in ("ack", "exit") and args[1:3] == ("x", "p")]
    assert heard, "gang x's pod p was neither started nor reported"
