"""The polled health rules, one test per rule, each citing reference/nvml.md: memory, driver,
thermal, power, PCIe, NVLink, fabric, MIG, and what unsupported and failed readings mean."""

from __future__ import annotations

from typing import Any

import pytest

from agent.gpu import UNSUPPORTED, Fabric, Failed, NvmlCode
from agent.health_links import replay_allowance
from agent.health_model import Action, Watch
from agent.health_policy import HealthPolicy
from statemachine.commands import HealthStatus
from tests.agent.samples import POLL_MS, device_info, feed, nvlink

PASS, WARN, FAIL, UNKNOWN = (HealthStatus.PASS, HealthStatus.WARN, HealthStatus.FAIL,
                             HealthStatus.UNKNOWN)


# Memory (§1.3, §2.2).


def test_volatile_dbe_fails_until_the_counter_resets_and_clean_checks_pass() -> None:
    """DCGM (§2.2): a volatile uncorrectable (DBE) count > 0 is FAIL; it clears with the
    volatile counter reset, after clean checks (§2.4)."""
    gpu = feed()
    verdict = gpu.sample(ecc_volatile_uncorrected=2)
    assert verdict.status is FAIL
    assert verdict.incidents[0].code == "dbe_volatile"
    assert verdict.incidents[0].watch is Watch.MEMORY
    assert verdict.incidents[0].action is Action.RESET_GPU
    assert gpu.samples(5, ecc_volatile_uncorrected=2).status is FAIL
    assert gpu.samples(2).status is FAIL
    assert gpu.sample().status is PASS


def test_pending_page_retirement_warns() -> None:
    """DCGM (§2.2): the retired-pages-pending flag is WARN: reset when idle (§1.3)."""
    incident = feed().sample(retired_pages_pending=1).incidents[0]
    assert (incident.code, incident.status) == ("retired_pending", WARN)
    assert incident.action is Action.RESET_WHEN_IDLE


@pytest.mark.parametrize(("sbe", "dbe", "status"), [(40, 23, FAIL), (40, 22, PASS),
                                                    (63, UNSUPPORTED, FAIL)])
def test_sixty_three_retired_pages_fail(sbe: object, dbe: object, status: HealthStatus) -> None:
    """DCGM (§2.2): SBE + DBE retired pages >= 63 is FAIL; the limit is retired_pages_max."""
    assert feed().sample(retired_pages_sbe=sbe, retired_pages_dbe=dbe).status is status


def test_retired_pages_unsupported_on_ampere_is_not_a_fault() -> None:
    """§1.3: Ampere and later replace page retirement by row remapping (NotSupported)."""
    verdict = feed().sample(retired_pages_sbe=UNSUPPORTED, retired_pages_dbe=UNSUPPORTED,
                            retired_pages_pending=UNSUPPORTED)
    assert verdict.status is PASS


def test_pending_row_remap_warns_reset_when_idle() -> None:
    """§1.3, §6: a pending remap means reset when idle, not unschedulable: WARN."""
    incident = feed().sample(remap_pending=1).incidents[0]
    assert (incident.code, incident.status, incident.action) == (
        "remap_pending", WARN, Action.RESET_WHEN_IDLE)


def test_row_remap_failure_fails_for_replacement() -> None:
    """§1.3, §2.2: the row-remap failure flag is FAIL (NVIDIA's RMA criterion)."""
    incident = feed().sample(remap_failure=1).incidents[0]
    assert (incident.code, incident.status, incident.action) == (
        "remap_failure", FAIL, Action.CONTACT_SUPPORT)


def test_many_uncorrectable_remapped_rows_warn() -> None:
    """DCGM (§2.2): uncorrectable remapped rows >= 512 is WARN."""
    assert feed().sample(remapped_rows_uncorrectable=511).status is PASS
    assert feed().sample(remapped_rows_uncorrectable=512).status is WARN


# Driver (§1.3, §2.2).


@pytest.mark.parametrize(("action", "status", "needed"), [
    (0, PASS, None), (1, FAIL, Action.RESET_GPU), (2, FAIL, Action.REBOOT_NODE),
    (3, WARN, Action.DRAIN_P2P), (4, FAIL, Action.RESET_GPU), (6, FAIL, Action.RESET_GPU),
    (99, WARN, Action.INVESTIGATE)])
def test_recovery_action(action: int, status: HealthStatus, needed: Action | None) -> None:
    """DCGM (§2.2): GPU_RESET, NODE_REBOOT, DRAIN_AND_RESET are FAIL, DRAIN_P2P is WARN; an
    action this agent does not know warns."""
    verdict = feed().sample(recovery_action=action)
    assert verdict.status is status
    if needed is not None:
        assert verdict.incidents[0].action is needed


def test_recovery_action_clears_when_back_to_none() -> None:
    """§2.4: recovery action back to NONE is the evidence gone; then clean checks."""
    gpu = feed()
    gpu.sample(recovery_action=1)
    assert gpu.samples(2).status is FAIL
    assert gpu.sample().status is PASS


# Thermal and power (§1.4, §2.2, §2.4).


@pytest.mark.parametrize(("temperature", "status"), [(84, PASS), (85, WARN), (94, WARN),
                                                     (95, FAIL), (120, FAIL)])
def test_temperature_against_the_thresholds(temperature: int, status: HealthStatus) -> None:
    """§2.4: within temperature_slowdown_margin_c (5) of the slowdown threshold is WARN; at
    the shutdown threshold the GPU is about to power off: FAIL."""
    verdict = feed().sample(temperature_c=temperature)
    assert verdict.status is status
    if status is not PASS:
        assert verdict.incidents[0].action is Action.CHECK_COOLING


def test_temperature_thresholds_unsupported_skip_the_rule() -> None:
    """§1.4: thresholds are often NotSupported on consumer boards; the rule cannot judge."""
    verdict = feed().sample(temperature_c=99, slowdown_temperature_c=UNSUPPORTED,
                            shutdown_temperature_c=UNSUPPORTED)
    assert verdict.status is PASS


@pytest.mark.parametrize(("bit", "watch", "code"), [
    (0x08, Watch.THERMAL, "hw_slowdown"), (0x40, Watch.THERMAL, "hw_thermal_slowdown"),
    (0x80, Watch.POWER, "hw_power_brake")])
def test_hardware_clock_events_warn(bit: int, watch: Watch, code: str) -> None:
    """§1.4: HW slowdown, HW thermal and HW power brake clock-event bits are worth a WARN."""
    incident = feed().sample(clock_event_mask=bit | 0x1).incidents[0]
    assert (incident.watch, incident.code, incident.status) == (watch, code, WARN)


@pytest.mark.parametrize("bit", [0x1, 0x2, 0x4, 0x10, 0x20, 0x100])
def test_benign_clock_events_pass(bit: int) -> None:
    """§1.4: idle, application clocks, SW power cap, sync boost, display are benign."""
    assert feed().sample(clock_event_mask=bit).status is PASS


def test_clock_event_mask_is_configurable() -> None:
    policy = HealthPolicy(clock_event_warn_mask=0x04)
    assert feed(policy).sample(clock_event_mask=0x04).incidents[0].code == "sw_power_cap"
    assert feed(policy).sample(clock_event_mask=0x40).status is PASS


@pytest.mark.parametrize(("signal", "code", "watch"), [
    ("thermal_violation_ns", "thermal_violation", Watch.THERMAL),
    ("power_violation_ns", "power_violation", Watch.POWER)])
def test_growing_violation_time_warns(signal: str, code: str, watch: Watch) -> None:
    """DCGM (§2.2): thermal or power violation time increasing in the window is WARN."""
    start: dict[str, Any] = {signal: 1_000}
    gpu = feed(**start)
    assert gpu.sample(**start).status is PASS
    incident = gpu.sample(**{signal: 2_000}).incidents[0]
    assert (incident.code, incident.watch, incident.status) == (code, watch, WARN)
    assert gpu.samples(2, **{signal: 2_000}).status is WARN
    assert gpu.sample(**{signal: 2_000}).status is PASS


# PCIe (§1.5, §2.2).


@pytest.mark.parametrize(("generation", "allowed"), [(1, 3), (2, 5), (3, 8), (4, 16), (5, 31),
                                                     (6, 62), (7, 62)])
def test_pcie_replay_allowance_is_dcgms_per_lane_rate(generation: int, allowed: int) -> None:
    """DCGM (§2.2): replays per minute allowed = ceil(lanes x per-lane rate), the rate being
    0.15, 0.3, 0.48, 0.96, 1.92, 3.84 per lane per minute for Gen1..Gen6 (x16 here); a newer
    generation is held to the newest rate known."""
    rates = HealthPolicy().pcie_replay_lane_rates_milli_per_min
    assert replay_allowance(rates, generation, 16, 60_000) == allowed


def test_pcie_replay_rate_over_the_window_warns_and_slides_out() -> None:
    """DCGM (§2.2): replays in the last minute above the allowance (31 for Gen5 x16) WARN."""
    gpu = feed()
    assert gpu.sample(pcie_replays=31).status is PASS
    verdict = gpu.sample(pcie_replays=32)
    assert (verdict.status, verdict.incidents[0].code) == (WARN, "pcie_replay_rate")
    windows = 60_000 // POLL_MS
    assert gpu.samples(windows - 1, pcie_replays=32).status is WARN
    assert gpu.samples(3, pcie_replays=32).status is PASS


def test_pcie_replays_spread_over_minutes_pass() -> None:
    gpu = feed()
    for minute in range(1, 6):
        gpu.samples(60_000 // POLL_MS, pcie_replays=20 * minute)
    assert gpu.verdict().status is PASS


def test_pcie_link_below_its_maximum_under_load_warns() -> None:
    """§1.5, §2.4: a link trained below its maximum under load is a degraded slot: WARN;
    an idle GPU may down-clock the link, so idle samples do not judge."""
    assert feed().sample(pcie_width=8, utilization_pct=10).status is PASS
    incident = feed().sample(pcie_width=8, utilization_pct=95).incidents[0]
    assert (incident.code, incident.status) == ("pcie_link_degraded", WARN)
    assert feed().sample(pcie_generation=4, utilization_pct=95).status is WARN


# NVLink (§1.5, §2.2).


def test_nvlink_that_was_up_going_down_fails_and_recovers_when_up() -> None:
    """DCGM (§2.2), §1.5: alarm only on links that were up and went down: FAIL."""
    links = tuple(nvlink(link) for link in range(4))
    gpu = feed(nvlinks=links)
    verdict = gpu.sample(nvlinks=(*links[:2], nvlink(2, up=False), links[3]))
    assert (verdict.status, verdict.incidents[0].code) == (FAIL, "nvlink_down")
    assert "NVLink 2 down" in verdict.reason
    assert gpu.samples(2).status is FAIL
    assert gpu.sample().status is PASS


def test_nvlink_down_from_the_start_never_alarms() -> None:
    """§1.5: record which links are up at start-up; a link never seen up is not a fault."""
    gpu = feed(nvlinks=(nvlink(0), nvlink(1, up=False)))
    assert gpu.samples(3).status is PASS


def test_nvlink_down_is_ignored_while_mig_is_on() -> None:
    """§1.5: NVML reports a MIG GPU's links as down; DCGM ignores down links with MIG on."""
    gpu = feed(nvlinks=(nvlink(0), nvlink(1)))
    gpu.tracker.observe_devices((device_info(mig_enabled=True),), gpu.now_ms)
    assert gpu.sample(nvlinks=(nvlink(0, up=False), nvlink(1, up=False))).status is PASS


@pytest.mark.parametrize(("counter", "code"), [("replay", "nvlink_replay"),
                                               ("recovery", "nvlink_recovery")])
def test_nvlink_replay_or_recovery_increment_fails(counter: str, code: str) -> None:
    """DCGM (§2.2): any NVLink replay or recovery error increment is FAIL."""
    gpu = feed(nvlinks=(nvlink(0), nvlink(1)))
    errors: dict[str, Any] = {counter: 1}
    verdict = gpu.sample(nvlinks=(nvlink(0), nvlink(1, **errors)))
    assert (verdict.status, verdict.incidents[0].code) == (FAIL, code)
    assert "link 1" in verdict.reason


def test_nvlink_crc_errors_warn_and_fail_at_the_rate() -> None:
    """DCGM (§2.2): NVLink CRC errors >= 1 are WARN, FAIL at 100/s or more (per link)."""
    slow = POLL_MS // 1000 * 100 - 1  # just under 100/s over one poll
    gpu = feed(nvlinks=(nvlink(0),))
    assert gpu.sample(nvlinks=(nvlink(0, crc_flit=slow),)).status is WARN
    gpu = feed(nvlinks=(nvlink(0),))
    verdict = gpu.sample(nvlinks=(nvlink(0, crc_flit=slow, crc_data=1),))
    assert (verdict.status, verdict.incidents[0].code) == (FAIL, "nvlink_crc")


# Fabric and MIG (§1.1, §1.5, §2.4).


@pytest.mark.parametrize(("fabric", "status"), [
    (Fabric.NOT_SUPPORTED, PASS), (Fabric.NOT_STARTED, FAIL), (Fabric.IN_PROGRESS, FAIL),
    (Fabric.COMPLETED, PASS)])
def test_fabric_not_completed_fails(fabric: Fabric, status: HealthStatus) -> None:
    """§1.5, §2.4: fabric state not COMPLETED where the fabric applies is FAIL."""
    verdict = feed().sample(fabric=fabric)
    assert verdict.status is status
    if status is FAIL:
        assert verdict.incidents[0].action is Action.CHECK_FABRIC_MANAGER


def test_mig_pending_fails_until_the_reset_applies_it() -> None:
    """§1.1, §2.4: a pending MIG mode different from the current one needs a reset: FAIL."""
    gpu = feed(devices=(device_info(mig_pending=True),), sampled=False)
    verdict = gpu.sample()
    assert (verdict.status, verdict.incidents[0].code) == (FAIL, "mig_pending")
    gpu.tracker.observe_devices((device_info(mig_enabled=True),), gpu.now_ms)
    assert gpu.samples(2).status is FAIL
    assert gpu.sample().status is PASS


# Unsupported and failed readings (§1.3, §4.1, §6).


def test_consumer_gpu_without_ecc_leaves_the_memory_watch_unknown() -> None:
    """§1.3: ECC NotSupported on consumer GPUs: every ECC signal is unknown, not healthy."""
    verdict = feed().sample(ecc_enabled=UNSUPPORTED, ecc_volatile_uncorrected=UNSUPPORTED,
                            ecc_volatile_corrected=UNSUPPORTED)
    assert verdict.status is UNKNOWN
    assert [(i.watch, i.code) for i in verdict.incidents] == [(Watch.MEMORY,
                                                               "ecc_enabled_unsupported")]


def test_ecc_disabled_is_unknown_unless_ecc_is_not_essential() -> None:
    assert feed().sample(ecc_enabled=0).incidents[0].code == "ecc_disabled"
    policy = HealthPolicy(essential_signals=("temperature_c",))
    assert feed(policy).sample(ecc_enabled=0).status is PASS
    assert feed(policy).sample(ecc_enabled=UNSUPPORTED).status is PASS


def test_ecc_enabled_without_counters_is_unknown() -> None:
    """A GPU that claims ECC but cannot count its errors hides exactly what ECC is for."""
    verdict = feed().sample(ecc_volatile_uncorrected=UNSUPPORTED)
    assert (verdict.status, verdict.incidents[0].code) == (UNKNOWN, "ecc_counters_unsupported")


@pytest.mark.parametrize(("signal", "watch"), [("temperature_c", Watch.THERMAL),
                                               ("power_mw", Watch.POWER)])
def test_essential_signal_unsupported_is_unknown(signal: str, watch: Watch) -> None:
    """§6: NotSupported means UNKNOWN, not healthy, for a signal a watch depends on."""
    incident = feed().sample(**{signal: UNSUPPORTED}).incidents[0]
    assert (incident.watch, incident.code, incident.status) == (
        watch, f"{signal}_unsupported", UNKNOWN)


@pytest.mark.parametrize("signal", ["recovery_action", "pcie_replays", "remap_pending",
                                    "clock_event_mask", "thermal_violation_ns", "pcie_width"])
def test_non_essential_signal_unsupported_passes(signal: str) -> None:
    """Signals an older GPU or driver lacks (recovery action, violation counters) do not make
    the GPU unknown: the other watches still see."""
    assert feed().sample(**{signal: UNSUPPORTED}).status is PASS


def test_failed_reading_keeps_the_last_good_value_and_escalates_to_unknown() -> None:
    """§4.1: a transient failure keeps the last good value with its age; escalate if it
    persists (failed_reads_to_unknown polls); a good read closes the UNKNOWN at once."""
    gpu = feed()
    good_at_ms = gpu.now_ms
    failed = Failed(NvmlCode.TIMEOUT, "Timeout")
    assert gpu.samples(2, temperature_c=failed).status is PASS
    assert gpu.tracker.last_good(gpu.uuid, "temperature_c") == (40, good_at_ms)
    verdict = gpu.sample(temperature_c=failed)
    assert (verdict.status, verdict.incidents[0].code) == (UNKNOWN, "temperature_c_unreadable")
    assert f"last good value 40 read at {good_at_ms} ms" in verdict.reason
    assert "NVML 10" in verdict.reason
    assert gpu.sample().status is PASS


def test_failed_reading_is_no_clean_check() -> None:
    """A FAIL stays while its signal cannot be read: an unread signal is no evidence."""
    gpu = feed()
    gpu.sample(ecc_volatile_uncorrected=1)
    failed = Failed(NvmlCode.UNKNOWN, "Unknown Error")
    assert gpu.samples(5, ecc_volatile_uncorrected=failed).status is FAIL
    assert gpu.samples(2).status is FAIL
    assert gpu.sample().status is PASS


def test_failed_reading_loses_no_counter_increment() -> None:
    """Deltas run from the last good value, across failed reads."""
    gpu = feed(nvlinks=(nvlink(0),))
    gpu.sample(nvlinks=(nvlink(0, replay=Failed(NvmlCode.TIMEOUT, "Timeout")),))
    assert gpu.sample(nvlinks=(nvlink(0, replay=1),)).status is FAIL
