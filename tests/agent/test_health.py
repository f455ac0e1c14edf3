"""The health tracker's contract: UNKNOWN before data and when NVML or the event wait fails,
lost GPUs, clearing with hysteresis, the operator's clear, verdict order and reasons,
take_changes, and the device list changing (reference/nvml.md §1.2, §1.6, §2.4, §4.1, §6)."""

from __future__ import annotations

import pytest

from agent.gpu import UNSUPPORTED, EventKind, NvmlCode
from agent.health import HealthTracker
from agent.health_model import SEVERITY, Action, Watch
from agent.health_policy import HealthPolicy
from statemachine.commands import HealthReport, HealthStatus
from statemachine.limits import REASON_LENGTH_MAX
from tests.agent.samples import GPU, OTHER_GPU, clean_sample, device_info, feed, nvlink

PASS, WARN, FAIL, UNKNOWN = (HealthStatus.PASS, HealthStatus.WARN, HealthStatus.FAIL,
                             HealthStatus.UNKNOWN)
TWO_GPUS = (device_info(OTHER_GPU, index=1), device_info(GPU))


def test_a_gpu_never_sampled_is_unknown_and_one_clean_sample_passes() -> None:
    """UNKNOWN is not PASS (§2.4): no data yet. It claimed no fault, so data closes it."""
    gpu = feed(sampled=False)
    verdict = gpu.verdict()
    assert (verdict.status, verdict.incidents[0].code) == (UNKNOWN, "no_sample")
    assert gpu.sample().status is PASS


def test_severity_order_is_fail_warn_unknown_pass() -> None:
    """A finding outranks a blind spot; neither is a pass."""
    assert sorted(SEVERITY, key=SEVERITY.__getitem__) == [PASS, UNKNOWN, WARN, FAIL]
    verdict = feed().sample(remap_pending=1, power_mw=UNSUPPORTED)
    assert verdict.status is WARN
    assert [i.status for i in verdict.incidents] == [WARN, UNKNOWN]
    assert verdict.reason.endswith("(+1 more)")


@pytest.mark.parametrize(("code", "status"), [
    (NvmlCode.GPU_IS_LOST, FAIL), (NvmlCode.RESET_REQUIRED, FAIL), (NvmlCode.UNKNOWN, FAIL),
    (NvmlCode.CORRUPTED_INFOROM, WARN)])
def test_a_gpu_gone_fails_until_it_answers_and_passes_clean_checks(
        code: NvmlCode, status: HealthStatus) -> None:
    """§1.6, §4.1: GpuIsLost / ResetRequired are FAIL (a corrupted InfoROM WARN) until the GPU
    answers again and then passes its clean checks."""
    gpu = feed()
    gpu.tracker.observe_gone(GPU, code, "GPU is lost", gpu.tick())
    verdict = gpu.verdict()
    assert (verdict.status, verdict.incidents[0].code) == (status, "gpu_gone")
    assert "GPU is lost" in verdict.reason
    gpu.tracker.observe_gone(GPU, code, "GPU is lost", gpu.tick())
    assert gpu.samples(2).status is status
    assert gpu.sample().status is PASS


def test_a_lost_gpu_answering_again_was_reset() -> None:
    """A GPU that fell off the bus answers only after a reset: XID FAILs start clearing."""
    gpu = feed()
    gpu.xid(79)
    gpu.tracker.observe_gone(GPU, NvmlCode.GPU_IS_LOST, "GPU is lost", gpu.tick())
    assert gpu.samples(2).status is FAIL
    assert gpu.sample().status is PASS


def test_nvml_unavailable_makes_every_gpu_unknown_never_pass() -> None:
    """§4.1, §6: NVML unavailable is a node condition: GPU count unknown, not zero."""
    gpu = feed(devices=TWO_GPUS, sampled=False)
    gpu.sample()
    gpu.tracker.observe_unavailable("NVML Shared Library Not Found", gpu.tick())
    verdicts = gpu.tracker.verdicts()
    assert [v.uuid for v in verdicts] == [GPU, OTHER_GPU]
    for verdict in verdicts:
        assert verdict.status is UNKNOWN
        assert "NVML unavailable: NVML Shared Library Not Found" in verdict.reason
    assert verdicts[0].incidents[0].action is Action.CHECK_DRIVER
    assert gpu.sample().status is PASS


def test_nvml_unavailable_does_not_hide_a_failure() -> None:
    gpu = feed()
    gpu.sample(remap_failure=1)
    gpu.tracker.observe_unavailable("Driver Not Loaded", gpu.tick())
    assert gpu.verdict().status is FAIL


def test_event_wait_failure_is_unknown_on_the_events_watch_until_a_wait_succeeds() -> None:
    """§1.2: any wait error but Timeout means events may be lost (the device plugin marks
    all devices unhealthy); polled counters catch up, so the next good wait clears it."""
    gpu = feed(devices=TWO_GPUS)
    gpu.tracker.observe_event_wait_failed("Unknown Error", gpu.tick())
    verdicts = gpu.tracker.verdicts()
    assert all(v.status is UNKNOWN for v in verdicts)
    assert all(v.incidents[0].watch is Watch.EVENTS for v in verdicts)
    assert gpu.samples(3).status is UNKNOWN  # samples do not vouch for events
    gpu.tracker.observe_event_wait_ok(gpu.tick())
    assert gpu.verdict().status is PASS


def test_fail_stays_through_clean_checks_and_a_recurrence_restarts_them() -> None:
    """§2.4: never flap back to healthy because one poll raised no exception."""
    gpu = feed(HealthPolicy(clean_checks_to_recover=4))
    gpu.sample(remap_failure=1)
    assert gpu.samples(3).status is FAIL
    gpu.sample(remap_failure=1)
    assert gpu.samples(3).status is FAIL
    assert gpu.sample().status is PASS


def test_an_open_incident_never_drops_to_a_lower_status() -> None:
    """While open, an incident keeps its worst status (no FAIL -> WARN -> FAIL flapping)."""
    gpu = feed(nvlinks=(nvlink(0),))
    gpu.sample(nvlinks=(nvlink(0, crc_flit=10_000),))
    verdict = gpu.sample(nvlinks=(nvlink(0, crc_flit=10_001),))
    assert (verdict.status, verdict.incidents[0].code) == (FAIL, "nvlink_crc")


def test_operator_clear_closes_everything_and_evidence_opens_again() -> None:
    """§2.1, §6: the device plugin never recovers a device; we have an explicit clear."""
    gpu = feed()
    gpu.xid(48)
    gpu.sample(remap_failure=1)
    assert gpu.tracker.clear(GPU)
    assert gpu.verdict().status is PASS
    gpu.sample(remap_failure=1)
    assert gpu.codes() == ["remap_failure"]
    assert not gpu.tracker.clear("GPU-unknown")


def test_incident_since_is_when_it_opened() -> None:
    gpu = feed()
    gpu.sample(remap_pending=1)
    opened_ms = gpu.now_ms
    gpu.samples(4, remap_pending=1)
    incident = gpu.incident("remap_pending")
    assert incident is not None
    assert incident.since_ms == opened_ms


def test_take_changes_reports_what_changed_since_the_last_call() -> None:
    gpu = feed(devices=TWO_GPUS, sampled=False)
    first = gpu.tracker.take_changes()
    assert [(v.uuid, v.status) for v in first] == [(GPU, UNKNOWN), (OTHER_GPU, UNKNOWN)]
    assert gpu.tracker.take_changes() == ()
    gpu.sample()
    assert [(v.uuid, v.status) for v in gpu.tracker.take_changes()] == [(GPU, PASS)]
    gpu.sample()
    assert gpu.tracker.take_changes() == ()
    gpu.sample(temperature_c=86)
    gpu.tracker.take_changes()
    gpu.sample(temperature_c=86, remap_pending=1)  # still WARN, another reason
    (changed,) = gpu.tracker.take_changes()
    assert changed.status is WARN
    assert changed.reason.endswith("(+1 more)")


def test_reason_is_capped_at_the_store_limit() -> None:
    gpu = feed()
    gpu.xid(79)
    gpu.tracker.observe_gone(GPU, NvmlCode.UNKNOWN, "x" * 1000, gpu.tick())
    verdict = gpu.verdict()
    assert len(verdict.reason) == REASON_LENGTH_MAX
    assert verdict.reason.endswith("… (+1 more)")
    assert verdict.reason.startswith("device/gpu_gone: the GPU stopped answering: unknown")
    assert all(len(i.message) <= REASON_LENGTH_MAX for i in verdict.incidents)


def test_verdict_reports_to_the_store() -> None:
    verdict = feed().sample(remap_pending=1)
    assert verdict.report() == HealthReport(uuid=GPU, status=WARN, reason=verdict.reason)
    assert verdict.reason == ("memory/remap_pending: row remapping pending: reset the GPU when "
                              "idle")


def test_verdicts_are_sorted_by_uuid_whatever_the_device_order() -> None:
    forward = HealthTracker(HealthPolicy(), TWO_GPUS)
    backward = HealthTracker(HealthPolicy(), TWO_GPUS[::-1])
    assert [v.uuid for v in forward.verdicts()] == [GPU, OTHER_GPU]
    assert forward.verdicts() == backward.verdicts()


def test_a_sample_or_loss_for_an_unknown_gpu_is_ignored() -> None:
    gpu = feed()
    gpu.tracker.observe_sample(clean_sample("GPU-stranger", remap_failure=1), gpu.tick())
    gpu.tracker.observe_gone("GPU-stranger", NvmlCode.GPU_IS_LOST, "lost", gpu.tick())
    assert [v.uuid for v in gpu.tracker.verdicts()] == [GPU]
    assert gpu.verdict().status is PASS


def test_the_device_list_adds_gpus_and_fails_missing_ones() -> None:
    """§1.6: the device count may change; a GPU that vanished is lost, not forgotten."""
    gpu = feed()
    gpu.tracker.observe_devices((device_info(OTHER_GPU, index=1),), gpu.tick())
    by_uuid = {v.uuid: v for v in gpu.tracker.verdicts()}
    assert by_uuid[OTHER_GPU].status is UNKNOWN
    assert (by_uuid[GPU].status, by_uuid[GPU].incidents[0].code) == (FAIL, "gpu_gone")
    gpu.tracker.observe_devices(TWO_GPUS, gpu.tick())
    assert gpu.samples(3).status is PASS


def test_events_between_samples_count_no_clean_checks() -> None:
    gpu = feed()
    gpu.sample(remap_failure=1)
    for _ in range(5):
        gpu.event(EventKind.SINGLE_BIT_ECC)
        gpu.tracker.observe_event_wait_ok(gpu.tick())
    assert gpu.verdict().status is FAIL
