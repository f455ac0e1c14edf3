"""Events: the XID policy (application XIDs are job faults, force-enable, unknown XIDs, fatal
and warning XIDs with their clearing, repetition), ECC, recovery-action and unavailable events,
citing reference/nvml.md §1.2, §2.1, §2.2 and §2.4."""

from __future__ import annotations

import pytest

from agent.gpu import UNSUPPORTED, EventKind, GpuEvent
from agent.health import XID_INCIDENTS_MAX
from agent.health_model import Action, Watch
from agent.health_policy import HealthPolicy
from statemachine.commands import HealthStatus
from tests.agent.samples import GPU, OTHER_GPU, POLL_MS, clean_sample, device_info, feed

PASS, WARN, FAIL, UNKNOWN = (HealthStatus.PASS, HealthStatus.WARN, HealthStatus.FAIL,
                             HealthStatus.UNKNOWN)


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_job_faults_not_gpu_faults(xid: int) -> None:
    """Device plugin (§2.1), §2.4: XIDs 13, 31, 43, 45, 68, 109 are application errors: they
    attach to the job that ran, and the GPU stays healthy."""
    gpu = feed()
    assert gpu.xid(xid, gpu_instance=1, compute_instance=0).status is PASS
    (fault,) = gpu.tracker.take_job_faults()
    assert (fault.uuid, fault.xid, fault.at_ms) == (GPU, xid, gpu.now_ms)
    assert (fault.gpu_instance, fault.compute_instance) == (1, 0)
    assert "GPU instance 1, compute instance 0" in fault.label
    assert gpu.tracker.take_job_faults() == ()


def test_repeated_application_xids_warn() -> None:
    """§2.2 (the Xid catalog's repetition workflows), §2.4: repeats on the same GPU point at
    the hardware: WARN after job_fault_repeats_to_warn within the window."""
    gpu = feed()
    gpu.xid(13)
    assert gpu.xid(31).status is PASS
    verdict = gpu.xid(13)
    assert (verdict.status, verdict.incidents[0].code) == (WARN, "job_faults_repeated")
    assert verdict.incidents[0].action is Action.INVESTIGATE
    assert len(gpu.tracker.take_job_faults()) == 3


def test_application_xids_spread_beyond_the_window_do_not_warn() -> None:
    gpu = feed(HealthPolicy(job_fault_window_ms=2 * POLL_MS))
    for _ in range(6):
        gpu.xid(43)
        gpu.sample()
    assert gpu.verdict().status is PASS


def test_repeated_job_faults_clear_after_a_quiet_window() -> None:
    gpu = feed(HealthPolicy(job_fault_window_ms=4 * POLL_MS))
    for _ in range(3):
        gpu.xid(13)
    assert gpu.samples(3).status is WARN
    assert gpu.samples(2).status is WARN  # quiet at the 4th sample: 2 of 3 clean checks
    assert gpu.sample().status is PASS


@pytest.mark.parametrize("xid", [48, 64, 74, 79, 95, 119, 120, 140])
def test_fatal_xids_fail_until_a_reset_is_seen(xid: int) -> None:
    """DCGM (§2.2), §2.4: XIDs 48, 64, 74, 79, 95, 119, 120, 140 are FAIL; they stay until a
    reset is observed plus clean checks: clean samples alone never clear them."""
    gpu = feed(energy_mj=5_000_000)
    verdict = gpu.xid(xid)
    assert (verdict.status, verdict.incidents[0].code) == (FAIL, f"xid_{xid}")
    assert verdict.incidents[0].watch is Watch.XID
    assert gpu.samples(10, energy_mj=5_000_000).status is FAIL
    assert gpu.sample(energy_mj=1_000).status is FAIL  # the reset: the first clean check
    assert gpu.sample(energy_mj=2_000).status is FAIL
    assert gpu.sample(energy_mj=3_000).status is PASS


def test_a_volatile_ecc_drop_is_a_reset() -> None:
    """§1.3: volatile ECC counts run since the last reset: a drop means the GPU was reset."""
    gpu = feed(ecc_volatile_corrected=7)
    gpu.xid(79)
    assert gpu.samples(4, ecc_volatile_corrected=7).status is FAIL
    gpu.sample(ecc_volatile_corrected=0)
    assert gpu.samples(2, ecc_volatile_corrected=0).status is PASS


def test_xid_79_asks_for_a_reboot() -> None:
    assert feed().xid(79).incidents[0].action is Action.REBOOT_NODE


@pytest.mark.parametrize("xid", [63, 92, 94, 62, 74 + 1000])
def test_warning_and_unknown_xids_warn(xid: int) -> None:
    """§2.4: XIDs 63, 92, 94 and DCGM's subsystem XIDs are WARN; so is an XID on no list."""
    verdict = feed().xid(xid)
    assert (verdict.status, verdict.incidents[0].code) == (WARN, f"xid_{xid}")


def test_warning_xid_clears_after_its_quiet_window_and_clean_checks() -> None:
    gpu = feed(HealthPolicy(xid_warn_quiet_ms=3 * POLL_MS))
    gpu.xid(94)
    assert gpu.samples(2).status is WARN
    gpu.xid(94)  # a repeat restarts the quiet window
    assert gpu.samples(4).status is WARN  # quiet at the 3rd sample: 2 of 3 clean checks
    assert gpu.sample().status is PASS


@pytest.mark.parametrize(("status", "expected"), [(HealthStatus.FAIL, FAIL),
                                                  (HealthStatus.PASS, PASS)])
def test_unknown_xid_status_is_configurable(status: HealthStatus,
                                            expected: HealthStatus) -> None:
    """§2.4: unknown XIDs warn by default, configurable up to FAIL (the device plugin's
    behaviour) or down to ignored."""
    assert feed(HealthPolicy(unknown_xid_status=status)).xid(150).status is expected


def test_force_enabled_xids_override_the_application_list() -> None:
    """Device plugin (§2.1): DP_ENABLE_HEALTHCHECKS overrides the built-in ignore list. A
    forced XID takes its level from the fail and warn lists, else the unknown-XID status."""
    policy = HealthPolicy(force_enabled_xids=frozenset({13, 31}),
                          unknown_xid_status=HealthStatus.FAIL)
    gpu = feed(policy)
    assert gpu.xid(31).status is WARN
    assert gpu.xid(13).status is FAIL
    assert gpu.tracker.take_job_faults() == ()


def test_ignored_application_xids_are_configurable() -> None:
    """Device plugin (§2.1): DP_DISABLE_HEALTHCHECKS adds XIDs to ignore as job faults."""
    gpu = feed(HealthPolicy(application_xids=frozenset({13, 94})))
    assert gpu.xid(94).status is PASS
    assert gpu.xid(31).status is WARN  # no longer an application XID: DCGM's memory WARN


def test_xid_watch_can_be_disabled() -> None:
    """Device plugin (§2.1): DP_DISABLE_HEALTHCHECKS=xids turns the XID watch off."""
    gpu = feed(HealthPolicy(xid_watch_enabled=False))
    assert gpu.xid(79).status is PASS
    assert gpu.xid(13).status is PASS
    assert gpu.tracker.take_job_faults() == ()


def test_xid_in_data_when_the_xid_field_is_empty() -> None:
    """§1.2: for XID events eventData is the XID number."""
    assert feed().event(EventKind.XID, None, data=48).incidents[0].code == "xid_48"


def test_many_distinct_xids_fold_into_one_incident() -> None:
    """A limit on everything: a stream of distinct XIDs cannot grow a GPU's incidents."""
    gpu = feed()
    for xid in range(1000, 1000 + 2 * XID_INCIDENTS_MAX):
        gpu.xid(xid)
    codes = gpu.codes()
    assert len(codes) == XID_INCIDENTS_MAX + 1
    assert "xid_many" in codes


def test_a_fatal_xid_folded_into_many_still_waits_for_a_reset() -> None:
    gpu = feed(HealthPolicy(xid_warn_quiet_ms=0))
    for xid in range(1000, 1001 + XID_INCIDENTS_MAX):
        gpu.xid(xid)
    incident = gpu.incident("xid_many")
    assert incident is not None
    assert incident.status is WARN
    gpu.xid(48)
    assert gpu.samples(10).incidents[0].code == "xid_many"
    assert gpu.verdict().status is FAIL
    assert gpu.codes() == ["xid_many"]


def test_mig_instance_named_in_the_incident() -> None:
    """§1.2: GI/CI are 0xFFFFFFFF unless the event is attributable to a MIG instance."""
    verdict = feed().xid(48, gpu_instance=2)
    assert "XID 48 (double-bit ECC error) on GPU instance 2" in verdict.reason


def test_double_bit_ecc_event_fails_until_reset() -> None:
    """§2.4: an uncorrectable ECC error is FAIL until reset (a DBE also raises XID 48)."""
    gpu = feed()
    verdict = gpu.event(EventKind.DOUBLE_BIT_ECC)
    assert (verdict.status, verdict.incidents[0].code) == (FAIL, "dbe_event")
    assert gpu.samples(5).status is FAIL


def test_single_bit_ecc_and_other_events_are_logged_not_judged() -> None:
    """Device plugin (§2.1): it acts on XID events only; SBE events are skipped."""
    gpu = feed()
    assert gpu.event(EventKind.SINGLE_BIT_ECC).status is PASS
    assert gpu.event(EventKind.OTHER).status is PASS


def test_recovery_action_event_holds_until_the_polled_action_is_none() -> None:
    """§1.3: the recovery-action event bit carries the driver's verdict at once."""
    gpu = feed()
    verdict = gpu.event(EventKind.RECOVERY_ACTION, data=2)
    assert (verdict.status, verdict.incidents[0].action) == (FAIL, Action.REBOOT_NODE)
    assert gpu.samples(2).status is FAIL
    assert gpu.sample().status is PASS
    assert gpu.event(EventKind.RECOVERY_ACTION, data=0).status is PASS


def test_recovery_action_event_without_the_polled_field_waits_for_the_operator() -> None:
    gpu = feed(recovery_action=UNSUPPORTED)
    gpu.event(EventKind.RECOVERY_ACTION, data=1)
    assert gpu.samples(5).status is FAIL
    assert gpu.tracker.clear(GPU)
    assert gpu.sample().status is PASS


def test_gpu_unavailable_event_fails_until_reset() -> None:
    gpu = feed()
    verdict = gpu.event(EventKind.GPU_UNAVAILABLE)
    assert (verdict.status, verdict.incidents[0].code) == (FAIL, "gpu_unavailable")
    assert gpu.samples(5).status is FAIL


def test_event_for_an_unknown_gpu_makes_every_gpu_unknown() -> None:
    """Device plugin (§1.2): an event whose UUID cannot be resolved concerns any GPU."""
    gpu = feed(HealthPolicy(xid_warn_quiet_ms=POLL_MS),
               devices=(device_info(), device_info(OTHER_GPU, index=1)))
    gpu.tracker.observe_sample(clean_sample(OTHER_GPU), gpu.now_ms)
    gpu.tracker.observe_event(GpuEvent(uuid="GPU-stranger", kind=EventKind.XID, xid=79),
                              gpu.tick())
    verdicts = gpu.tracker.verdicts()
    assert [v.status for v in verdicts] == [UNKNOWN, UNKNOWN]
    assert all(v.incidents[0].code == "unattributed_event" for v in verdicts)
    assert gpu.sample().status is PASS


def test_ignored_event_for_an_unknown_gpu_changes_nothing() -> None:
    gpu = feed()
    gpu.tracker.observe_event(GpuEvent(uuid="GPU-stranger", kind=EventKind.SINGLE_BIT_ECC),
                              gpu.tick())
    assert gpu.verdict().status is PASS

