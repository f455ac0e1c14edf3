"""Pod uids are unique only within a gang (tests/agent/test_pod_uid_shared_by_gangs.py),
and the runner's reconcile matched the store's bindings with its jobs by uid alone. Another
gang's job of the same uid was adopted as the wanted pod, and the wanted pod was neither
started nor reported: its gang waited for it for ever."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.agent.jobs_support import binding

pytestmark = pytest.mark.anyio


async def test_a_released_gangs_job_is_not_adopted_for_another_gang_of_its_uid(rig) -> None:
    old = replace(binding("p"), group="y")
    new = replace(binding("p"), group="x")
    async with rig.runner() as first:
        await rig.start(first, old)
    async with rig.runner() as second:  # y was released while the agent was away; x bound
        report = await second.reconcile([new])
        assert report.adopted == ()
        assert report.to_stop == (old,)
        assert [(lost.group, lost.pod_uid) for lost in report.lost] + [
            (b.group, b.pod_uid) for b in report.to_start] == [("x", "p")]
        await second.stop("p")


async def test_both_gangs_of_one_uid_are_accounted_for(rig) -> None:
    running = replace(binding("p"), group="y")
    other = replace(binding("p"), group="x")
    async with rig.runner() as first:
        await rig.start(first, running)
    async with rig.runner() as second:
        report = await second.reconcile([other, running])  # the store lists gangs by id
        assert report.adopted == (running,)
        assert [(lost.group, lost.pod_uid) for lost in report.lost] + [
            (b.group, b.pod_uid) for b in report.to_start] == [("x", "p")]
        await second.stop("p")
