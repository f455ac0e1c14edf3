"""A corrupted InfoROM (NVML 14) warns, whatever path the code comes by, and never reads UNKNOWN
or FAIL (reference/nvml.md §4.1: "Device fault | ... CorruptedInforom ... | Device -> FAIL
(CorruptedInforom: WARN)"; DCGM only warns on it).

The code arrives as a failed read of one signal (ECC counts, retired pages, remapped rows, a
field-value entry, an aggregate counter no rule reads) or as the GPU's handle lookup failing
(GpuGone with 14). The failed reads had been taken as transient: nothing at first, then UNKNOWN
("<signal>_unreadable") after `failed_reads_to_unknown` polls, and nothing at all for a signal
no rule reads.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent import nvml_abi as abi
from agent.exporter import AgentView
from agent.gpu import Failed, NvmlCode
from agent.health import HealthTracker
from agent.health_model import Action
from agent.health_policy import HealthPolicy
from agent.monitor import Monitor
from agent.nvml_backend import NvmlBackend
from agent.nvml_policy import describe
from agent.store_link import StoreLink
from statemachine.commands import HealthStatus
from tests.agent.fake_pynvml import FakePynvml
from tests.agent.recording_store import RecordingStore

pytestmark = pytest.mark.anyio
POLLS = 6  # past failed_reads_to_unknown (3) and clean_checks_to_recover (3)
INFOROM = NvmlCode.CORRUPTED_INFOROM
CORRUPTED = Failed(INFOROM, describe(INFOROM))

Fault = Callable[[FakePynvml, str], None]
FAULTS: list[tuple[str, Fault]] = [
    ("ecc counts", lambda nvml, uuid: nvml.fail_call("nvmlDeviceGetTotalEccErrors", INFOROM,
                                                     uuid)),
    ("retired pages", lambda nvml, uuid: nvml.fail_call("nvmlDeviceGetRetiredPages", INFOROM,
                                                        uuid)),
    ("retired pages pending", lambda nvml, uuid: nvml.fail_call(
        "nvmlDeviceGetRetiredPagesPendingStatus", INFOROM, uuid)),
    ("remapped rows", lambda nvml, uuid: nvml.fail_call("nvmlDeviceGetRemappedRows", INFOROM,
                                                        uuid)),
    ("aggregate ecc only", lambda nvml, uuid: nvml.set_reading(
        uuid, "ecc_aggregate_uncorrected", CORRUPTED)),
    ("field value entry", lambda nvml, uuid: nvml.fail_field(uuid, abi.FIELD_RECOVERY_ACTION,
                                                             INFOROM)),
]


def monitor_of(nvml: FakePynvml, now: list[int] | None = None) -> Monitor:
    """A monitor of node n0 over the real backend on `nvml` (started), reporting to a recording
    store; its clock reads `now[0]` when given."""
    backend = NvmlBackend(nvml)
    backend.start()
    devices = backend.devices()
    link = StoreLink(RecordingStore("n0"), "n0", retry_ms_max=200)  # type: ignore[arg-type]
    view = AgentView(node="n0")
    view.devices = devices
    monitor = Monitor(backend, HealthTracker(HealthPolicy(), devices, now_ms=0), link, view,
                      poll_ms=10, event_wait_ms=10, retry_ms_max=100)
    if now is not None:
        monitor.clock_ms = lambda: now[0]
    return monitor


async def polls_warn_for_inforom(monitor: Monitor, uuid: str, now: list[int]) -> None:
    """Every poll leaves the GPU WARN, its worst incident naming NVML 14 and INVESTIGATE."""
    for _ in range(POLLS):
        now[0] += 1000
        await monitor.poll_once()
        verdict = {v.uuid: v for v in monitor.tracker.verdicts()}[uuid]
        assert verdict.status is HealthStatus.WARN, verdict
        assert verdict.incidents[0].action is Action.INVESTIGATE, verdict
        assert "NVML 14" in verdict.reason, verdict


@pytest.mark.parametrize(("name", "fault"), FAULTS, ids=[fault[0] for fault in FAULTS])
async def test_a_read_failing_with_a_corrupted_inforom_warns(name: str, fault: Fault) -> None:
    nvml = FakePynvml.from_profile("a100-8", seed=1)
    now = [0]
    monitor = monitor_of(nvml, now)
    uuid = nvml.uuids()[2]
    fault(nvml, uuid)
    await polls_warn_for_inforom(monitor, uuid, now)
    others = [v.status for v in monitor.tracker.verdicts() if v.uuid != uuid]
    assert set(others) == {HealthStatus.PASS}
    monitor.backend.stop()


async def test_a_handle_lookup_failing_with_a_corrupted_inforom_warns() -> None:
    """The GPU did not answer its UUID at the start, so its handle is looked up by UUID at
    each sample, and that lookup fails with 14: GpuGone(14)."""
    nvml = FakePynvml.from_profile("a100-8", seed=1)
    now = [0]
    monitor = monitor_of(nvml, now)
    uuid = nvml.uuids()[2]
    monitor.backend.stop()
    nvml.fail_call("nvmlDeviceGetUUID", INFOROM, uuid)
    nvml.fail_call("nvmlDeviceGetHandleByUUID", INFOROM)
    monitor.backend.start()
    await polls_warn_for_inforom(monitor, uuid, now)
    monitor.backend.stop()


async def test_the_inforom_warning_closes_once_reads_succeed_again() -> None:
    nvml = FakePynvml.from_profile("a100-8", seed=1)
    now = [0]
    monitor = monitor_of(nvml, now)
    uuid = nvml.uuids()[2]
    nvml.set_reading(uuid, "ecc_aggregate_uncorrected", CORRUPTED)
    await polls_warn_for_inforom(monitor, uuid, now)
    nvml.set_reading(uuid, "ecc_aggregate_uncorrected", 0)
    statuses = []
    for _ in range(POLLS):
        now[0] += 1000
        await monitor.poll_once()
        statuses.append({v.uuid: v.status for v in monitor.tracker.verdicts()}[uuid])
    assert statuses[-1] is HealthStatus.PASS, statuses
    assert HealthStatus.UNKNOWN not in statuses
    monitor.backend.stop()
