"""The pods loop (`agent.pods`) on its own: effects in, exits out, against a store stand-in
that records what the agent reports."""

from __future__ import annotations

import pathlib
from typing import Any

import anyio
import pytest

from agent.pods import EXIT_CODE_KILLED, REASON_KILLED_BEFORE_START, Pods
from agent.store_link import StoreLink
from statemachine.effects import EffectKind
from tests.agent.jobs_support import GpuDouble, runner
from tests.agent.recording_store import RecordingStore

pytestmark = pytest.mark.anyio


def evicting_gang(group: str, pod_uid: str, node: str) -> dict[str, Any]:
    """A gang query's answer: one pod bound on `node`, the gang being evicted."""
    return {"group": group, "evicting": "preempted by boss",
            "pods": [{"pod_uid": pod_uid, "node": node, "phase": "bound"}]}


async def test_a_kill_for_a_pod_never_started_here_reports_it_exited(
        tmp_path: pathlib.Path) -> None:
    """The store may still have the pod bound here (its start was never seen): the gang
    being evicted waits for that pod's exit before it can leave."""
    kill = {"index": 1, "kind": EffectKind.KILL_POD.value, "node": "n0", "group": "victim",
            "pod_uid": "victim-pod", "reason": "preempted by boss"}
    fake = RecordingStore("n0", gangs={"victim": evicting_gang("victim", "victim-pod", "n0")},
                          effects=(kill,))
    async with runner(tmp_path, GpuDouble()) as jobs:
        pods = Pods(StoreLink(fake, "n0", retry_ms_max=200), jobs,  # type: ignore[arg-type]
                    tmp_path)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(pods.follow_effects)
                while not fake.times("exit"):
                    await anyio.sleep(0.01)
                tasks.cancel_scope.cancel()
    (exit_call,) = [args for _, name, args in fake.calls if name == "exit"]
    assert exit_call == ("n0", "victim", "victim-pod", EXIT_CODE_KILLED,
                         REASON_KILLED_BEFORE_START)
    assert not jobs.started_before("victim-pod")

