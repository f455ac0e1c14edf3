"""Two gangs may name a pod alike (the store keeps pod uids unique only within a gang,
statemachine/group_commands.bind_pod) while the node agent keys its jobs by the pod uid. A
KILL_POD for one gang's pod must not stop another gang's job of that uid (it did: one gang's
eviction killed another tenant's running pod), and the second gang's START_POD is no replay of
the first's (it was taken for one, never started nor reported): a uid starts at most once on a
node, so it is refused and reported exited 127."""

from __future__ import annotations

import pathlib
from typing import Any

import anyio
import pytest

from agent.pods import Pods
from agent.store_link import StoreLink
from statemachine.commands import BindPod
from statemachine.effects import EffectKind
from statemachine.results import PodBound
from tests.agent.jobs_support import SLEEP, GpuDouble, python, runner
from tests.agent.recording_store import RecordingStore
from tests.statemachine.builders import SCHEDULER, Driver, gang, rack_spec

pytestmark = pytest.mark.anyio


def test_the_store_binds_one_pod_uid_in_two_gangs_on_one_node() -> None:
    """The precondition: nothing in the store keeps two gangs' pods on a node apart by uid."""
    driver = Driver()
    driver.configure(rack_spec())
    driver.register("n0")  # the only node up: both gangs land on it
    driver.submit(gang("y", "a", 0, (1, 1)))
    driver.submit(gang("x", "a", 0, (1, 1)))
    bound = [driver.run(BindPod(group=name, member=0, pod_uid="p"), SCHEDULER)
             for name in ("y", "x")]
    assert all(isinstance(result, PodBound) for result in bound), bound
    assert {result.node for result in bound} == {"n0"}  # type: ignore[union-attr]


def _gang(group: str, evicting: str = "") -> dict[str, Any]:
    return {"group": group, "evicting": evicting,
            "pods": [{"pod_uid": "p", "node": "n0", "phase": "bound"}]}


def _start(index: int, group: str) -> dict[str, Any]:
    return {"index": index, "kind": EffectKind.START_POD.value, "node": "n0", "group": group,
            "pod_uid": "p", "gpu_uuids": [], "env": [], "command": list(python(SLEEP))}


async def test_a_kill_for_one_gangs_pod_does_not_stop_another_gangs_job(
        tmp_path: pathlib.Path) -> None:
    effects = (_start(1, "y"), _start(2, "x"),
               {"index": 3, "kind": EffectKind.KILL_POD.value, "node": "n0", "group": "x",
                "pod_uid": "p", "reason": "preempted by boss"})
    fake = RecordingStore("n0", gangs={"y": _gang("y"), "x": _gang("x", "preempted by boss")},
                          effects=effects)
    async with runner(tmp_path, GpuDouble()) as jobs:
        pods = Pods(StoreLink(fake, "n0", retry_ms_max=200),  # type: ignore[arg-type]
                    jobs, tmp_path)
        try:
            with anyio.fail_after(15):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(pods.follow_effects)
                    while not fake.times("ack"):  # y's pod started
                        await anyio.sleep(0.01)
                    # until the kill of x's pod was handled: reported, or some job stopped
                    while not fake.times("exit") and jobs.runs("p"):
                        await anyio.sleep(0.01)
                    await anyio.sleep(0.2)
                    tasks.cancel_scope.cancel()
            y_still_runs = jobs.runs("p")
        finally:
            if jobs.runs("p"):
                await jobs.stop("p")
    assert y_still_runs, "KILL_POD for gang x stopped gang y's running job"
    exits = [args for _, name, args in fake.calls if name == "exit"]
    assert exits and all(args[1] == "x" for args in exits), exits  # x's pod told gone
