"""The agent's incarnation loop (`agent.daemon`): what it does around registering, against a
store stand-in that records when each call was made."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import sys

import anyio
import pytest

from agent.binding import Binding
from agent.daemon import Agent
from agent.fake_backend import FakeGpuBackend
from agent.job_limits import JobLimits
from agent.jobs import JobRunner
from tests.agent.agent_support import agent_config
from tests.agent.recording_store import RecordingStore

pytestmark = pytest.mark.anyio

GRACE_S = 3.0
# Ignores SIGTERM, as many trainers do while they checkpoint; says when it is ready.
STUBBORN = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "open(sys.argv[1], 'w').close(); time.sleep(60)")


async def test_heartbeats_are_not_held_back_by_the_stops_of_a_reconcile(
        tmp_path: pathlib.Path) -> None:
    """Stopping a job takes up to grace + kill wait + GPU release wait (45 s with the
    defaults), longer than a lease: the node's lease must be renewed meanwhile."""
    gpus = FakeGpuBackend.from_profile("a100-8", seed=1)
    state = tmp_path / "agent"
    state.mkdir()
    ready = tmp_path / "ready"
    limits = JobLimits(grace_s=GRACE_S, kill_wait_s=1.0, gpu_release_timeout_s=1.0,
                       gpu_poll_s=0.02, exit_poll_s=0.05)
    async with JobRunner(state, local_gpu_uuids=gpus.uuids(), gpus=gpus,
                         limits=limits) as runner:  # an earlier agent, with a job unknown now
        outcome = await runner.start(Binding(
            group="old", pod_uid="old-pod", gpu_uuids=(),
            command=(sys.executable, "-c", STUBBORN, str(ready))))
        pid = outcome.pid  # type: ignore[union-attr]
        with anyio.fail_after(10):
            while not ready.exists():
                await anyio.sleep(0.02)
    fake = RecordingStore("n0")
    agent = Agent(agent_config("n0", state, jobs=limits), gpus, fake)  # type: ignore[arg-type]
    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(agent.run)
                while not fake.times("exit"):  # the stop finished and the exit was reported
                    await anyio.sleep(0.05)
                tasks.cancel_scope.cancel()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    registered = fake.times("register")[0]
    beats = fake.times("heartbeat")
    assert beats, "no heartbeat at all"
    assert beats[0] - registered < GRACE_S / 2, (
        f"first heartbeat {beats[0] - registered:.2f} s after registering")
