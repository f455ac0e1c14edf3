"""A job record names its process by pid and start ticks, which name one process only
for the life of a boot. After a reboot, a process of the new boot can hold the recorded pid
with the same ticks (a boot sequence repeats itself: the agent starts its jobs seconds after
boot each time); the runner must not adopt it as the job, nor stop it as one the store no
longer wants. The record keeps the kernel's boot id; one from another boot is dead."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agent import procfs
from agent.job_state import FORMAT, JOBS_NAME, VERSION

pytestmark = pytest.mark.anyio


async def test_a_record_from_an_earlier_boot_never_adopts_a_stranger(rig) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                start_new_session=True)
    try:
        ticks = procfs.start_ticks(stranger.pid)
        assert ticks is not None
        rig.state.mkdir()
        job = {"group": "g", "pod_uid": "p1", "gpu_uuids": [], "command": ["sleep"],
               "env": [], "pid": stranger.pid, "pgid": stranger.pid, "start_ticks": ticks,
               "started_unix_ns": 1, "log_path": "/dev/null",
               "boot_id": "00000000-0000-0000-0000-000000000000"}
        (rig.state / JOBS_NAME).write_text(json.dumps(
            {"format": FORMAT, "version": VERSION, "jobs": [job]}))
        async with rig.runner() as jobs:
            report = await jobs.reconcile([])
            for binding in report.to_stop:
                await jobs.stop(binding.pod_uid)
            assert report.to_stop == () and jobs.running() == ()
        assert stranger.poll() is None, "the runner killed a process of the new boot"
    finally:
        stranger.kill()
        stranger.wait()
