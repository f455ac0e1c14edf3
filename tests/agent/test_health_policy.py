"""HealthPolicy: the defaults follow reference/nvml.md §2.4, the XID classification follows
the device plugin's lists with DCGM's levels (§2.1, §2.2), and every bad value, from a config
table or a constructor, is refused with an error naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from agent.health_policy import HealthPolicy, PolicyError, XidClass
from statemachine.commands import HealthStatus


def test_defaults_follow_the_reference() -> None:
    policy = HealthPolicy()
    assert policy.application_xids == {13, 31, 43, 45, 68, 109}  # §2.1
    assert policy.fail_xids == {48, 64, 74, 79, 95, 119, 120, 140}  # §2.2, §2.4
    assert {63, 92, 94} <= policy.warn_xids  # §2.4
    assert {31, 32, 43, 38, 39, 42, 60, 61, 62, 54, 56, 57, 58, 78, 67, 73, 121, 137, 93} <= \
        policy.warn_xids  # DCGM's subsystem lists, §2.2
    assert policy.unknown_xid_status is HealthStatus.WARN
    assert policy.clean_checks_to_recover == 3
    assert policy.retired_pages_max == 63
    assert policy.temperature_slowdown_margin_c == 5
    assert policy.nvlink_crc_fail_per_s == 100
    assert policy.pcie_replay_lane_rates_milli_per_min == (150, 300, 480, 960, 1920, 3840)


@pytest.mark.parametrize(("xid", "expected"), [
    (13, XidClass.JOB), (31, XidClass.JOB), (109, XidClass.JOB), (48, XidClass.FAIL),
    (79, XidClass.FAIL), (63, XidClass.WARN), (94, XidClass.WARN), (999, XidClass.WARN)])
def test_xid_classes(xid: int, expected: XidClass) -> None:
    assert HealthPolicy().classify_xid(xid) is expected


def test_force_enabled_xids_are_gpu_faults() -> None:
    policy = HealthPolicy(force_enabled_xids=frozenset({13, 31}),
                          unknown_xid_status=HealthStatus.PASS)
    assert policy.classify_xid(31) is XidClass.WARN  # on DCGM's memory list
    assert policy.classify_xid(13) is XidClass.WARN  # forced: at least a warning
    assert policy.classify_xid(999) is XidClass.IGNORED


def test_from_mapping_of_nothing_is_the_default() -> None:
    assert HealthPolicy.from_mapping({}) == HealthPolicy()


def test_from_mapping_converts_config_values() -> None:
    policy = HealthPolicy.from_mapping({
        "application_xids": [13, 43], "force_enabled_xids": [31],
        "unknown_xid_status": "fail", "clean_checks_to_recover": 5,
        "essential_signals": ["temperature_c"], "xid_watch_enabled": False,
        "pcie_replay_lane_rates_milli_per_min": [100, 200]})
    assert policy.application_xids == frozenset({13, 43})
    assert policy.force_enabled_xids == frozenset({31})
    assert policy.unknown_xid_status is HealthStatus.FAIL
    assert policy.clean_checks_to_recover == 5
    assert policy.essential_signals == ("temperature_c",)
    assert policy.xid_watch_enabled is False
    assert policy.pcie_replay_lane_rates_milli_per_min == (100, 200)


@pytest.mark.parametrize(("mapping", "key", "words"), [
    ({"clean_checks": 3}, "clean_checks", "unknown key"),
    ({"clean_checks_to_recover": 0}, "clean_checks_to_recover", "outside 1..1000"),
    ({"clean_checks_to_recover": True}, "clean_checks_to_recover", "expected an integer"),
    ({"clean_checks_to_recover": "3"}, "clean_checks_to_recover", "expected an integer"),
    ({"retired_pages_max": 2.5}, "retired_pages_max", "expected an integer"),
    ({"temperature_slowdown_margin_c": -1}, "temperature_slowdown_margin_c", "outside"),
    ({"pcie_replay_window_ms": 10}, "pcie_replay_window_ms", "outside"),
    ({"xid_watch_enabled": "yes"}, "xid_watch_enabled", "true or false"),
    ({"application_xids": "13,31"}, "application_xids", "expected a list"),
    ({"application_xids": ["13"]}, "application_xids", "list of XIDs"),
    ({"application_xids": [[13]]}, "application_xids", "list of XIDs"),
    ({"fail_xids": [0]}, "fail_xids", "is not an XID"),
    ({"force_enabled_xids": [1 << 32]}, "force_enabled_xids", "is not an XID"),
    ({"warn_xids": [48]}, "warn_xids", "also in fail_xids"),
    ({"unknown_xid_status": "unknown"}, "unknown_xid_status", "must be pass, warn or fail"),
    ({"unknown_xid_status": "maybe"}, "unknown_xid_status", "expected one of"),
    ({"essential_signals": ["fan_speed"]}, "essential_signals", "is not a signal"),
    ({"essential_signals": ["power_mw", "power_mw"]}, "essential_signals", "twice"),
    ({"essential_signals": [3]}, "essential_signals", "is not a signal"),
    ({"pcie_replay_lane_rates_milli_per_min": []}, "pcie_replay_lane_rates_milli_per_min",
     "rates"),
    ({"pcie_replay_lane_rates_milli_per_min": [0]}, "pcie_replay_lane_rates_milli_per_min",
     "integer in 1"),
])
def test_from_mapping_names_the_bad_key(mapping: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(PolicyError) as raised:
        HealthPolicy.from_mapping(mapping)
    assert raised.value.key == key
    assert f"health policy {key!r}" in str(raised.value)
    assert words in str(raised.value)


def test_construction_validates_too() -> None:
    with pytest.raises(PolicyError, match="failed_reads_to_unknown"):
        HealthPolicy(failed_reads_to_unknown=0)
    with pytest.raises(PolicyError, match="is not an XID"):
        HealthPolicy(application_xids=frozenset({-1}))


def test_policy_errors_are_value_errors() -> None:
    """A config loader that catches ValueError reports these too."""
    assert issubclass(PolicyError, ValueError)
