"""The polled health rules that judge one sample alone: memory, driver, thermal, power, fabric, MIG.

Each rule reads fresh values (agent.health_signals) and yields one Check per key: PASS when it
could judge and found nothing, its status when it found something, nothing at all when the
signals it needs were not read this time (the incident, if any, then stays as it was). Sources,
all in reference/nvml.md:

| key | condition | status | § |
| --- | --- | --- | --- |
| memory/dbe_volatile | volatile uncorrectable ECC count > 0 | FAIL | 2.2, 2.4 |
| memory/retired_pending | page retirement pending | WARN | 2.2 |
| memory/retired_pages_limit | SBE + DBE retired pages >= retired_pages_max (63) | FAIL | 2.2 |
| memory/remap_pending | row remap pending | WARN | 1.3, 6 |
| memory/remap_failure | row remap failure | FAIL | 1.3, 2.2 |
| memory/remapped_rows_limit | uncorrectable remapped rows >= 512 | WARN | 2.2 |
| memory/ecc_disabled | ECC off, while ecc_enabled is an essential signal | UNKNOWN | 1.3 |
| memory/ecc_counters_unsupported | ECC on, but no volatile counter | UNKNOWN | 1.3 |
| driver/recovery_action | GPU_RESET, NODE_REBOOT, DRAIN_AND_RESET (and 5..7) | FAIL | 2.2 |
| driver/recovery_action | DRAIN_P2P, or a value this agent does not know | WARN | 2.2 |
| thermal/temperature_shutdown | temperature >= the shutdown threshold | FAIL | 1.4 |
| thermal/temperature_slowdown | temperature >= slowdown threshold - margin | WARN | 2.4 |
| thermal/thermal_violation | thermal violation time grew | WARN | 2.2 |
| thermal, power/clock events | HW slowdown, HW thermal, HW power brake bits | WARN | 1.4 |
| power/power_violation | power violation time grew | WARN | 2.2 |
| fabric/fabric_incomplete | fabric NOT_STARTED or IN_PROGRESS | FAIL | 1.5, 2.4 |
| mig/mig_pending | pending MIG mode differs from the current one | FAIL | 1.1, 2.4 |
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from agent.gpu import DeviceInfo, Fabric
from agent.health_model import Action, Check, Watch, clean
from agent.health_policy import HealthPolicy
from agent.health_signals import Values
from statemachine.commands import HealthStatus

FAIL: Final = HealthStatus.FAIL
WARN: Final = HealthStatus.WARN
UNKNOWN: Final = HealthStatus.UNKNOWN


@dataclass(frozen=True, slots=True)
class Context:
    """What the rules judge: one GPU's fixed properties and one resolved sample."""

    policy: HealthPolicy
    device: DeviceInfo
    values: Values
    fabric: Fabric


def judged(found: bool | None, finding: Check) -> Iterator[Check]:
    """A yes/no rule's answer: `finding` when found, clean when not, nothing when it could not
    judge (found is None)."""
    if found is None:
        return
    yield finding if found else clean(finding.watch, finding.code)


def polled_checks(context: Context) -> Iterator[Check]:
    """Every single-sample rule, in a fixed order."""
    yield from memory_checks(context)
    yield from ecc_coverage_checks(context)
    yield from recovery_checks(context.values.get("recovery_action"))
    yield from temperature_checks(context)
    yield from violation_checks(context.values)
    yield from clock_event_checks(context.values.get("clock_event_mask"),
                                  context.policy.clock_event_warn_mask)
    yield from fabric_checks(context.fabric)
    yield from judged(context.device.mig_pending, Check(
        Watch.MIG, "mig_pending", FAIL, "MIG mode change pending: the GPU needs a reset",
        Action.RESET_GPU))


def _at_least(value: int | None, limit: int) -> bool | None:
    return None if value is None else value >= limit


def _set(value: int | None) -> bool | None:
    return None if value is None else value != 0


def memory_checks(context: Context) -> Iterator[Check]:
    values, policy = context.values, context.policy
    dbe = values.get("ecc_volatile_uncorrected")
    yield from judged(_at_least(dbe, 1), Check(
        Watch.MEMORY, "dbe_volatile", FAIL, f"{dbe} uncorrectable ECC errors since the last reset",
        Action.RESET_GPU))
    yield from judged(_set(values.get("retired_pages_pending")), Check(
        Watch.MEMORY, "retired_pending", WARN, "page retirement pending: reset the GPU when idle",
        Action.RESET_WHEN_IDLE))
    retired = _sum_known(values.get("retired_pages_sbe"), values.get("retired_pages_dbe"))
    yield from judged(_at_least(retired, policy.retired_pages_max), Check(
        Watch.MEMORY, "retired_pages_limit", FAIL,
        f"{retired} retired pages, at or above {policy.retired_pages_max}",
        Action.CONTACT_SUPPORT))
    yield from judged(_set(values.get("remap_pending")), Check(
        Watch.MEMORY, "remap_pending", WARN, "row remapping pending: reset the GPU when idle",
        Action.RESET_WHEN_IDLE))
    yield from judged(_set(values.get("remap_failure")), Check(
        Watch.MEMORY, "remap_failure", FAIL,
        "row remapping failed: the GPU is due for replacement", Action.CONTACT_SUPPORT))
    rows = values.get("remapped_rows_uncorrectable")
    limit = policy.remapped_rows_uncorrectable_max
    yield from judged(_at_least(rows, limit), Check(
        Watch.MEMORY, "remapped_rows_limit", WARN,
        f"{rows} rows remapped for uncorrectable errors, at or above {limit}",
        Action.CONTACT_SUPPORT))


def _sum_known(first: int | None, second: int | None) -> int | None:
    if first is None and second is None:
        return None
    return (first or 0) + (second or 0)


def ecc_coverage_checks(context: Context) -> Iterator[Check]:
    """ECC that is off, or on without counters, leaves the memory watch blind (§1.3)."""
    values = context.values
    enabled = values.get("ecc_enabled")
    if "ecc_enabled" in context.policy.essential_signals:
        yield from judged(None if enabled is None else enabled == 0, Check(
            Watch.MEMORY, "ecc_disabled", UNKNOWN, "ECC is disabled: memory errors cannot be seen"))
    if enabled == 1:
        yield from judged("ecc_volatile_uncorrected" in values.unsupported, Check(
            Watch.MEMORY, "ecc_counters_unsupported", UNKNOWN,
            "ECC is enabled but its error counters are not supported"))


RECOVERY_ACTIONS: Final[Mapping[int, tuple[str, HealthStatus, Action]]] = {
    1: ("GPU_RESET", FAIL, Action.RESET_GPU),
    2: ("NODE_REBOOT", FAIL, Action.REBOOT_NODE),
    3: ("DRAIN_P2P", WARN, Action.DRAIN_P2P),
    4: ("DRAIN_AND_RESET", FAIL, Action.RESET_GPU),
    5: ("RECOVER_IMEX_DOMAIN", FAIL, Action.CHECK_FABRIC_MANAGER),
    6: ("BUS_RESET", FAIL, Action.RESET_GPU),
    7: ("SYSTEM_REBOOT", FAIL, Action.REBOOT_NODE),
}


def recovery_checks(action: int | None) -> Iterator[Check]:
    """The driver's own verdict on what the GPU needs (NVML_GPU_RECOVERY_ACTION_*)."""
    if action is None:
        return
    name, status, needed = RECOVERY_ACTIONS.get(action, (f"unknown ({action})", WARN,
                                                          Action.INVESTIGATE))
    yield from judged(action != 0, Check(
        Watch.DRIVER, "recovery_action", status,
        f"the driver asks for recovery action {name}", needed))


def temperature_checks(context: Context) -> Iterator[Check]:
    values = context.values
    temperature = values.get("temperature_c")
    shutdown = values.get("shutdown_temperature_c")
    slowdown = values.get("slowdown_temperature_c")
    if temperature is None:
        return
    if shutdown is not None:
        yield from judged(temperature >= shutdown, Check(
            Watch.THERMAL, "temperature_shutdown", FAIL,
            f"temperature at or above the shutdown threshold ({shutdown} C)",
            Action.CHECK_COOLING))
    if slowdown is not None:
        margin = context.policy.temperature_slowdown_margin_c
        yield from judged(temperature >= slowdown - margin, Check(
            Watch.THERMAL, "temperature_slowdown", WARN,
            f"temperature within {margin} C of the slowdown threshold ({slowdown} C)",
            Action.CHECK_COOLING))


def violation_checks(values: Values) -> Iterator[Check]:
    """DCGM's thermal and power watches: violation time that grew since the last read."""
    for name, watch, what, action in (
            ("thermal_violation_ns", Watch.THERMAL, "thermal", Action.CHECK_COOLING),
            ("power_violation_ns", Watch.POWER, "power", Action.CHECK_POWER)):
        growth = values.increase(name)
        yield from judged(None if growth is None else growth[0] > 0, Check(
            watch, name.removesuffix("_ns"), WARN,
            f"{what} violation time is growing: clocks are held down", action))


CLOCK_EVENTS: Final[Mapping[int, tuple[Watch, str, str]]] = {
    0x04: (Watch.POWER, "sw_power_cap", "software power cap"),
    0x08: (Watch.THERMAL, "hw_slowdown", "hardware slowdown"),
    0x20: (Watch.THERMAL, "sw_thermal_slowdown", "software thermal slowdown"),
    0x40: (Watch.THERMAL, "hw_thermal_slowdown", "hardware thermal slowdown"),
    0x80: (Watch.POWER, "hw_power_brake", "hardware power brake (PSU or chassis)"),
    0x200: (Watch.POWER, "board_limit", "board limit"),
    0x400: (Watch.DEVICE, "reliability", "reliability limit"),
}


def clock_event_checks(mask: int | None, warn_mask: int) -> Iterator[Check]:
    """One check per bit the policy warns on, while the clocks are held down for it."""
    if mask is None:
        return
    for bit_index in range(warn_mask.bit_length()):
        bit = 1 << bit_index
        if warn_mask & bit:
            watch, code, name = CLOCK_EVENTS.get(bit, (Watch.DEVICE, f"clock_event_{bit:#x}",
                                                       f"clock event {bit:#x}"))
            action = Action.CHECK_POWER if watch is Watch.POWER else Action.CHECK_COOLING
            yield from judged(bool(mask & bit), Check(
                watch, code, WARN, f"clocks held down by {name}", action))


def fabric_checks(fabric: Fabric) -> Iterator[Check]:
    """On NVSwitch systems a GPU whose fabric is not COMPLETED cannot join NVLink jobs."""
    yield from judged(fabric in (Fabric.NOT_STARTED, Fabric.IN_PROGRESS), Check(
        Watch.FABRIC, "fabric_incomplete", FAIL,
        f"NVSwitch fabric {fabric.name}: is the fabric manager running?",
        Action.CHECK_FABRIC_MANAGER))
