"""A MIG mode change made while the agent runs is seen at the next poll (it had not been).

reference/nvml.md §1.1 / §2.4: "If pending != current, a reset is needed; do not schedule on the
GPU until then" (FAIL mig/mig_pending). The backend reads the MIG mode only in devices(); the
monitor's polls read samples only, and devices() is re-read only at (re)registration or after
NVML itself went away. So `nvidia-smi -i N -mig 1` on a running node leaves the GPU PASS, and
jobs keep being placed on it.
"""

from __future__ import annotations

import pytest

from agent.exporter import AgentView
from agent.health import HealthTracker
from agent.health_policy import HealthPolicy
from agent.monitor import Monitor
from agent.nvml_backend import NvmlBackend
from agent.store_link import StoreLink
from statemachine.commands import HealthStatus
from tests.agent.fake_pynvml import FakePynvml
from tests.agent.recording_store import RecordingStore

pytestmark = pytest.mark.anyio


async def test_mig_mode_pending_set_while_running_fails_the_gpu() -> None:
    nvml = FakePynvml.from_profile("a100-8", seed=1)
    backend = NvmlBackend(nvml)
    backend.start()
    devices = backend.devices()
    uuid = devices[2].uuid
    link = StoreLink(RecordingStore("n0"), "n0", retry_ms_max=200)  # type: ignore[arg-type]
    view = AgentView(node="n0")
    view.devices = devices
    now = [0]
    monitor = Monitor(backend, HealthTracker(HealthPolicy(), devices, now_ms=0), link, view,
                      poll_ms=10, event_wait_ms=10, retry_ms_max=100,
                      clock_ms=lambda: now[0])
    await monitor.poll_once()
    status = {v.uuid: v.status for v in monitor.tracker.verdicts()}
    assert status[uuid] is HealthStatus.PASS

    # An operator enables MIG on the GPU: NVML now says current=0, pending=1.
    nvml.set_info(uuid, mig_pending=True)
    assert backend.devices()[2].mig_pending  # the backend can see it when asked

    for _ in range(5):
        now[0] += 1000
        await monitor.poll_once()
    verdict = {v.uuid: v for v in monitor.tracker.verdicts()}[uuid]
    assert verdict.status is HealthStatus.FAIL, verdict
    assert any(incident.code == "mig_pending" for incident in verdict.incidents)
    backend.stop()
