"""Every knob of the agent's GPU health policy, with defaults from reference/nvml.md §2.

`HealthPolicy` is a frozen value the tracker reads and never changes. The defaults follow the
proposed classification of §2.4: the device plugin's application XIDs (§2.1) are job faults, not
GPU faults; DCGM's devastating XIDs fail the GPU and its per-subsystem XIDs warn (§2.2); an XID
on no list warns, or fails where configured (as the device plugin does). The polled thresholds
are DCGM's. Construction validates every field, however the policy was built;
`from_mapping` builds one from the agent's TOML table, and every error names the key.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Final

from agent.health_signals import SIGNAL_WATCHES
from statemachine.commands import HealthStatus

XID_MAX: Final = 0xFFFF_FFFF  # NVML's eventData is 32 bits
DAY_MS: Final = 86_400_000
MINUTE_MS: Final = 60_000
CLOCK_EVENT_MASK_MAX: Final = (1 << 64) - 1

# Signals whose absence on a GPU makes a watch blind: DeviceSample field names, any of
# agent.health_signals.SIGNAL_WATCHES.
ESSENTIAL_SIGNALS_DEFAULT: Final = ("ecc_enabled", "power_mw", "temperature_c")


class PolicyError(ValueError):
    """A health policy key has a value the agent cannot use; the message names the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"health policy {key!r}: {problem}")
        self.key = key
        self.problem = problem


class XidClass(enum.Enum):
    """What an XID means for the GPU it was reported on."""

    IGNORED = "ignored"  # the XID watch is off, or unknown XIDs are configured to pass
    JOB = "job"  # an application fault: attached to the job, escalating only on repetition
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthPolicy:
    # XIDs (reference/nvml.md §2.1, §2.2, §2.4).
    xid_watch_enabled: bool = True  # False: like DP_DISABLE_HEALTHCHECKS=xids
    application_xids: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
    force_enabled_xids: frozenset[int] = frozenset()  # like DP_ENABLE_HEALTHCHECKS: GPU faults
    fail_xids: frozenset[int] = frozenset({48, 64, 74, 79, 95, 119, 120, 140})
    warn_xids: frozenset[int] = frozenset({31, 32, 38, 39, 42, 43, 54, 56, 57, 58, 60, 61, 62,
                                           63, 67, 73, 78, 92, 93, 94, 121, 137})
    unknown_xid_status: HealthStatus = HealthStatus.WARN  # PASS ignores them; FAIL as the plugin
    xid_warn_quiet_ms: int = 3_600_000  # a WARN XID clears after this long without a repeat
    job_fault_repeats_to_warn: int = 3  # application XIDs on one GPU within the window: WARN
    job_fault_window_ms: int = 3_600_000
    # Clearing (reference/nvml.md §2.4: never flap back to healthy).
    clean_checks_to_recover: int = 3  # consecutive clean checks before a FAIL or WARN closes
    failed_reads_to_unknown: int = 3  # consecutive failed reads of a signal: UNKNOWN
    essential_signals: tuple[str, ...] = ESSENTIAL_SIGNALS_DEFAULT  # unsupported: UNKNOWN
    # Memory (DCGM, §2.2).
    retired_pages_max: int = 63  # SBE + DBE retired pages at or above: FAIL
    remapped_rows_uncorrectable_max: int = 512  # at or above: WARN
    # Thermal and power (§1.4, §2.2).
    temperature_slowdown_margin_c: int = 5  # within this of the slowdown threshold: WARN
    clock_event_warn_mask: int = 0x08 | 0x40 | 0x80  # HW slowdown, HW thermal, HW power brake
    # NVLink and PCIe (§2.2).
    nvlink_crc_fail_per_s: int = 100  # CRC errors on one link at or above this rate: FAIL
    pcie_replay_window_ms: int = MINUTE_MS
    # DCGM's allowed replays per lane per minute, in thousandths, for Gen1, Gen2, ...
    pcie_replay_lane_rates_milli_per_min: tuple[int, ...] = (150, 300, 480, 960, 1920, 3840)
    pcie_degraded_utilization_pct: int = 80  # a link below its maximum at this load: WARN

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name in _COUNT_RANGES:
                _check_count(field.name, value)
            elif isinstance(value, frozenset):
                _check_xids(field.name, value)
        _check_relations(self)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, object]) -> HealthPolicy:
        """A policy from a config table: missing keys keep their defaults; an unknown key, a
        value of the wrong type or out of range raises PolicyError naming the key."""
        default = cls()
        known = tuple(sorted(field.name for field in fields(cls)))
        changes: dict[str, Any] = {}  # each converted to its field's type, checked below
        for key in sorted(mapping):
            if key not in known:
                raise PolicyError(key, f"unknown key (known: {', '.join(known)})")
            changes[key] = _converted(key, mapping[key], getattr(default, key))
        return replace(default, **changes)

    def classify_xid(self, xid: int) -> XidClass:
        """The device plugin's lists with DCGM's levels: a force-enabled XID is a GPU fault
        even when it is on the application list."""
        if not self.xid_watch_enabled:
            return XidClass.IGNORED
        forced = xid in self.force_enabled_xids
        if xid in self.application_xids and not forced:
            return XidClass.JOB
        if xid in self.fail_xids:
            return XidClass.FAIL
        if xid in self.warn_xids:
            return XidClass.WARN
        if self.unknown_xid_status is HealthStatus.FAIL:
            return XidClass.FAIL
        if self.unknown_xid_status is HealthStatus.WARN or forced:
            return XidClass.WARN
        return XidClass.IGNORED

    def clean_checks_needed(self, status: HealthStatus) -> int:
        """Clean checks that close an incident: FAIL and WARN need the configured run; an
        UNKNOWN closes as soon as the signal is seen again (it never claimed a fault)."""
        return 1 if status is HealthStatus.UNKNOWN else self.clean_checks_to_recover


_COUNT_RANGES: Final[Mapping[str, tuple[int, int]]] = {
    "xid_warn_quiet_ms": (0, 30 * DAY_MS),
    "job_fault_repeats_to_warn": (1, 1000),
    "job_fault_window_ms": (1, 30 * DAY_MS),
    "clean_checks_to_recover": (1, 1000),
    "failed_reads_to_unknown": (1, 1000),
    "retired_pages_max": (1, 1 << 20),
    "remapped_rows_uncorrectable_max": (1, 1 << 20),
    "temperature_slowdown_margin_c": (0, 100),
    "clock_event_warn_mask": (0, CLOCK_EVENT_MASK_MAX),
    "nvlink_crc_fail_per_s": (1, 1 << 40),
    "pcie_replay_window_ms": (1000, DAY_MS),
    "pcie_degraded_utilization_pct": (1, 100),
}
UNKNOWN_XID_STATUSES: Final = (HealthStatus.PASS, HealthStatus.WARN, HealthStatus.FAIL)
PCIE_GENERATIONS_MAX: Final = 16


def _check_count(key: str, value: object) -> None:
    low, high = _COUNT_RANGES[key]
    if type(value) is not int:
        raise PolicyError(key, f"expected an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise PolicyError(key, f"{value} is outside {low}..{high}")


def _check_xids(key: str, xids: frozenset[object]) -> None:
    for xid in sorted(xids, key=repr):
        if type(xid) is not int or not 1 <= xid <= XID_MAX:
            raise PolicyError(key, f"{xid!r} is not an XID (an integer in 1..{XID_MAX})")


def _check_relations(policy: HealthPolicy) -> None:
    both = sorted(policy.fail_xids & policy.warn_xids)
    if both:
        raise PolicyError("warn_xids", f"XIDs {both} are also in fail_xids")
    if policy.unknown_xid_status not in UNKNOWN_XID_STATUSES:
        raise PolicyError("unknown_xid_status", "must be pass, warn or fail")
    _check_signals(policy.essential_signals)
    rates = policy.pcie_replay_lane_rates_milli_per_min
    if not 1 <= len(rates) <= PCIE_GENERATIONS_MAX:
        raise PolicyError("pcie_replay_lane_rates_milli_per_min",
                          f"expected 1..{PCIE_GENERATIONS_MAX} rates, one per generation")
    if any(type(rate) is not int or not 1 <= rate <= 1 << 30 for rate in rates):
        raise PolicyError("pcie_replay_lane_rates_milli_per_min",
                          "every rate must be an integer in 1..2**30")


def _check_signals(names: tuple[str, ...]) -> None:
    for name in names:
        if type(name) is not str or name not in SIGNAL_WATCHES:
            raise PolicyError("essential_signals",
                              f"{name!r} is not a signal (one of {', '.join(SIGNAL_WATCHES)})")
    if len(set(names)) != len(names):
        raise PolicyError("essential_signals", "names a signal twice")


def _converted(key: str, value: object, default: object) -> object:
    """`value` from a config table, in the type of the field's default."""
    if isinstance(default, bool):
        if type(value) is not bool:
            raise PolicyError(key, f"expected true or false, got {value!r}")
        return value
    if isinstance(default, HealthStatus):
        if type(value) is not str or value not in tuple(HealthStatus):
            raise PolicyError(key, f"expected one of pass, warn, fail, got {value!r}")
        return HealthStatus(value)
    if isinstance(default, frozenset | tuple):
        if not isinstance(value, list | tuple):
            raise PolicyError(key, f"expected a list, got {type(value).__name__}")
        if isinstance(default, frozenset):
            if any(type(item) is not int for item in value):
                raise PolicyError(key, f"expected a list of XIDs (integers), got {value!r}")
            return frozenset(value)
        return tuple(value)
    return value  # integers: checked by the constructor
