"""A START_POD handled twice must not report a running pod as "could not start".

After an agent restart the registration lists pod P (bound, never started) and `reconcile`
defers its start, as the GPUs are still held by a job being stopped; the pods loop then
replays P's START_POD from the saved cursor (the cursor was saved before P was handled) and
defers it a second time. Both deferred starts wake once the GPUs are free; the first launches
P, the second finds P not yet tracked by the runner (the launch is still in progress), asks
the runner to start it again, is refused ("already started"), and reports P exited with 127:
the store then takes a running pod for a failed one.
"""

from __future__ import annotations

import pathlib

import anyio
import pytest

from agent.binding import Binding
from agent.pods import Pods
from agent.store_link import StoreLink
from tests.agent.jobs_support import GPU_A, GpuDouble, binding, runner
from tests.agent.recording_store import RecordingStore

pytestmark = pytest.mark.anyio


def bound_gang(group: str, pod_uid: str, node: str) -> dict[str, object]:
    return {"group": group, "evicting": "",
            "pods": [{"pod_uid": pod_uid, "node": node, "phase": "bound"}]}


async def test_a_start_deferred_twice_starts_once_and_reports_no_exit(
        tmp_path: pathlib.Path) -> None:
    pod: Binding = binding("pod-p", gpus=(GPU_A,))
    old: Binding = binding("pod-old", gpus=(GPU_A,))
    fake = RecordingStore("n0", gangs={pod.group: bound_gang(pod.group, pod.pod_uid, "n0")})
    async with runner(tmp_path, GpuDouble()) as jobs:
        pods = Pods(StoreLink(fake, "n0", retry_ms_max=200), jobs,  # type: ignore[arg-type]
                    tmp_path)
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(pods.report_exits)
                await pods.start(old)  # the job that still holds GPU_A
                assert jobs.runs("pod-old")
                await pods._start_or_defer(pod, tasks)  # from the registration's reconcile
                await pods._start_or_defer(pod, tasks)  # the replayed START_POD
                await pods.stop("pod-old")
                while not jobs.runs("pod-p"):
                    await anyio.sleep(0.01)
                await anyio.sleep(0.5)  # let the second deferred start finish
                await pods.stop("pod-p")
                while len(fake.times("exit")) < 2:
                    await anyio.sleep(0.01)
                tasks.cancel_scope.cancel()
    exits = [args for _, name, args in fake.calls if name == "exit"]
    wrong = [args for args in exits if args[2] == "pod-p" and args[3] == 127]
    assert not wrong, f"a running pod was reported as not started: {wrong}"
    assert pods.counts["jobs_not_started"] == 0
