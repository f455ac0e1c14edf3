"""An agent killed between a job's launch and its record (`JobRunner._launch`: the
ledger has the uid, the process runs, jobs.json does not name it) must not leave that job
running once a restarted runner has called it lost: the store frees its GPUs on that report."""

from __future__ import annotations

import os

import pytest

from agent import procfs
from agent.binding import job_environment
from agent.spawn import spawn
from agent.started_ledger import StartedLedger
from tests.agent.jobs_support import QUICK, binding, reap, wait_dead

pytestmark = pytest.mark.anyio


async def test_a_job_launched_but_never_recorded_is_stopped_when_called_lost(rig) -> None:
    job = binding("p1")
    rig.state.mkdir()
    # What a crash right after `_spawn` leaves: the uid in the ledger, the job running.
    StartedLedger(rig.state, QUICK.started_remembered_max).remember(job.pod_uid)
    log_fd = os.open(rig.state / "p1.log", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        pid = spawn(job.command, job_environment(job, os.environ), log_fd)
    finally:
        os.close(log_fd)
    ticks = procfs.start_ticks(pid)
    assert ticks is not None
    try:
        async with rig.runner() as jobs:
            report = await jobs.reconcile([job])
            assert [lost.pod_uid for lost in report.lost] == ["p1"]
            await wait_dead(pid, ticks)  # fails: the lost job runs on, on GPUs freed for others
    finally:
        if procfs.is_alive(pid, ticks):
            os.kill(pid, 9)
        reap(pid)
