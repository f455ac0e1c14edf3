"""One GPU's `DeviceSample`, read through NVML: which call feeds which reading.

Most readings are one call each and are listed in `SIMPLE_READINGS`, newest function first where
NVML deprecated one (TemperatureV before Temperature, ClocksEventReasons before
ClocksThrottleReasons). Calls that feed several readings (memory info, remapped rows, field
values) are read once. Field values are checked entry by entry: each carries its own return
code, and only the call as a whole raises; an entry missing, for another field or malformed
reads as failed, as a transient error would. NVLinks are read for the links that exist; an
InvalidArgument there means the link index is past the GPU's real count.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from agent import nvml_abi as abi
from agent.gpu import (
    DeviceSample,
    Fabric,
    Failed,
    NvLinkSample,
    NvmlCode,
    Reading,
    Unsupported,
)
from agent.nvml_calls import NvmlCalls, to_int
from agent.nvml_policy import describe, reading_outcome


@dataclass(frozen=True, slots=True)
class SimpleReading:
    field: str
    functions: tuple[str, ...]
    arguments: tuple[int, ...] = ()
    extract: Callable[[Any], int] = to_int


SIMPLE_READINGS: Final = (
    SimpleReading("temperature_c", ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"),
                  (abi.TEMPERATURE_GPU,)),
    SimpleReading("slowdown_temperature_c", ("nvmlDeviceGetTemperatureThreshold",),
                  (abi.THRESHOLD_SLOWDOWN,)),
    SimpleReading("shutdown_temperature_c", ("nvmlDeviceGetTemperatureThreshold",),
                  (abi.THRESHOLD_SHUTDOWN,)),
    SimpleReading("power_mw", ("nvmlDeviceGetPowerUsage",)),
    SimpleReading("power_limit_mw", ("nvmlDeviceGetEnforcedPowerLimit",)),
    SimpleReading("energy_mj", ("nvmlDeviceGetTotalEnergyConsumption",)),
    SimpleReading("sm_clock_mhz", ("nvmlDeviceGetClockInfo",), (abi.CLOCK_SM,)),
    SimpleReading("memory_clock_mhz", ("nvmlDeviceGetClockInfo",), (abi.CLOCK_MEM,)),
    SimpleReading("utilization_pct", ("nvmlDeviceGetUtilizationRates",),
                  extract=lambda rates: int(rates.gpu)),
    SimpleReading("clock_event_mask", ("nvmlDeviceGetCurrentClocksEventReasons",
                                       "nvmlDeviceGetCurrentClocksThrottleReasons")),
    SimpleReading("ecc_enabled", ("nvmlDeviceGetEccMode",),
                  extract=lambda modes: int(modes[0] == abi.FEATURE_ENABLED)),
    SimpleReading("ecc_volatile_corrected", ("nvmlDeviceGetTotalEccErrors",),
                  (abi.MEMORY_ERROR_CORRECTED, abi.VOLATILE_ECC)),
    SimpleReading("ecc_volatile_uncorrected", ("nvmlDeviceGetTotalEccErrors",),
                  (abi.MEMORY_ERROR_UNCORRECTED, abi.VOLATILE_ECC)),
    SimpleReading("ecc_aggregate_corrected", ("nvmlDeviceGetTotalEccErrors",),
                  (abi.MEMORY_ERROR_CORRECTED, abi.AGGREGATE_ECC)),
    SimpleReading("ecc_aggregate_uncorrected", ("nvmlDeviceGetTotalEccErrors",),
                  (abi.MEMORY_ERROR_UNCORRECTED, abi.AGGREGATE_ECC)),
    SimpleReading("retired_pages_sbe", ("nvmlDeviceGetRetiredPages",),
                  (abi.RETIREMENT_MULTIPLE_SINGLE_BIT,), extract=len),
    SimpleReading("retired_pages_dbe", ("nvmlDeviceGetRetiredPages",),
                  (abi.RETIREMENT_DOUBLE_BIT,), extract=len),
    SimpleReading("retired_pages_pending", ("nvmlDeviceGetRetiredPagesPendingStatus",)),
    SimpleReading("pcie_replays", ("nvmlDeviceGetPcieReplayCounter",)),
    SimpleReading("pcie_generation", ("nvmlDeviceGetCurrPcieLinkGeneration",)),
    SimpleReading("pcie_generation_max", ("nvmlDeviceGetMaxPcieLinkGeneration",)),
    SimpleReading("pcie_width", ("nvmlDeviceGetCurrPcieLinkWidth",)),
    SimpleReading("pcie_width_max", ("nvmlDeviceGetMaxPcieLinkWidth",)),
)
REMAP_FIELDS: Final = (
    "remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending", "remap_failure",
)
FIELD_READINGS: Final = {
    abi.FIELD_POWER_VIOLATION_NS: "power_violation_ns",
    abi.FIELD_THERMAL_VIOLATION_NS: "thermal_violation_ns",
    abi.FIELD_RECOVERY_ACTION: "recovery_action",
}
FIELD_MISSING: Final = Failed(NvmlCode.UNKNOWN, "not in nvmlDeviceGetFieldValues' answer")
# Where the field-values call is missing: the deprecated per-policy violation counters.
VIOLATION_POLICIES: Final = {
    "power_violation_ns": abi.PERF_POLICY_POWER,
    "thermal_violation_ns": abi.PERF_POLICY_THERMAL,
}
LINK_COUNTERS: Final = (
    abi.NVLINK_ERROR_REPLAY, abi.NVLINK_ERROR_RECOVERY, abi.NVLINK_ERROR_CRC_FLIT,
    abi.NVLINK_ERROR_CRC_DATA,
)


def read_sample(calls: NvmlCalls, uuid: str, handle: Any,
                links: tuple[int, ...]) -> DeviceSample:
    """Every polled signal of one GPU; raises GpuGone or NvmlUnavailable as the policy says."""
    readings = {reading.field: calls.reading(uuid, reading.functions, handle,
                                             *reading.arguments, extract=reading.extract)
                for reading in SIMPLE_READINGS}
    readings |= _memory(calls, uuid, handle)
    readings |= _remapped_rows(calls, uuid, handle)
    readings |= _field_values(calls, uuid, handle)
    return DeviceSample(uuid=uuid, fabric=read_fabric(calls, uuid, handle),
                        nvlinks=tuple(_link(calls, uuid, handle, link) for link in links),
                        **readings)


def _spread(result: Any, fields: tuple[str, ...],
            extract: Callable[[Any], tuple[int, ...]]) -> dict[str, Reading]:
    """One call's result over several readings; a failed call fails all of them alike."""
    if isinstance(result, Unsupported | Failed):
        return dict.fromkeys(fields, result)
    return dict(zip(fields, extract(result), strict=True))


def _memory(calls: NvmlCalls, uuid: str, handle: Any) -> dict[str, Reading]:
    result = calls.attempt(uuid, ("nvmlDeviceGetMemoryInfo",), handle)
    return _spread(result, ("memory_used_bytes", "memory_free_bytes"),
                   lambda memory: (int(memory.used), int(memory.free)))


def _remapped_rows(calls: NvmlCalls, uuid: str, handle: Any) -> dict[str, Reading]:
    result = calls.attempt(uuid, ("nvmlDeviceGetRemappedRows",), handle)
    return _spread(result, REMAP_FIELDS, lambda rows: tuple(int(count) for count in rows))


def _field_values(calls: NvmlCalls, uuid: str, handle: Any) -> dict[str, Reading]:
    result = calls.attempt(uuid, ("nvmlDeviceGetFieldValues",), handle, list(FIELD_READINGS))
    if isinstance(result, Unsupported | Failed):
        readings: dict[str, Reading] = {
            field: calls.reading(uuid, ("nvmlDeviceGetViolationStatus",), handle, policy,
                                 extract=lambda status: int(status.violationTime))
            for field, policy in VIOLATION_POLICIES.items()}
        return readings | {"recovery_action": result}
    readings = dict.fromkeys(FIELD_READINGS.values(), FIELD_MISSING)
    for field_id, entry in zip(FIELD_READINGS, result, strict=False):  # answered in order
        readings[FIELD_READINGS[field_id]] = _field_value(uuid, field_id, entry)
    return readings


def _field_value(uuid: str, field_id: int, entry: Any) -> Reading:
    """The entry of nvmlDeviceGetFieldValues in `field_id`'s place: its own return code first,
    then its value. An entry for another field, or one that does not read, is a failed read."""
    try:
        if int(entry.fieldId) != field_id:
            return Failed(NvmlCode.UNKNOWN, f"field {field_id}: field {entry.fieldId} answered")
        code = int(entry.nvmlReturn)
        if code != abi.SUCCESS:
            return reading_outcome(uuid, code, describe(code))
        member = abi.VALUE_UNION_MEMBERS.get(int(entry.valueType))
        if member is None:
            return Failed(NvmlCode.UNKNOWN, f"field {field_id}: value type {entry.valueType}")
        return int(getattr(entry.value, member))
    except (AttributeError, TypeError, ValueError, OverflowError) as error:  # inf: Overflow
        return Failed(NvmlCode.UNKNOWN, f"field {field_id}: malformed entry ({error})")


def read_fabric(calls: NvmlCalls, uuid: str, handle: Any) -> Fabric:
    """The NVSwitch fabric state; NOT_SUPPORTED where there is none or it cannot be read. A
    registration that completed with an error reads NOT_STARTED: the GPU is not on the fabric."""
    for function, struct in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                             ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
        make = getattr(calls.nvml, struct, None)
        if make is None or calls.lacks(function):
            continue
        info = make()  # the versioned struct sets its own version field
        result = calls.attempt(uuid, (function,), handle, ctypes.byref(info))
        if calls.lacks(function):
            continue
        state = _fabric_state(info.state)
        if isinstance(result, Unsupported | Failed) or state is None:
            return Fabric.NOT_SUPPORTED
        if state is Fabric.COMPLETED and int(info.status) != abi.SUCCESS:
            return Fabric.NOT_STARTED
        return state
    return Fabric.NOT_SUPPORTED


def _fabric_state(raw: Any) -> Fabric | None:
    try:
        return Fabric(int(raw))
    except ValueError:
        return None


def _link(calls: NvmlCalls, uuid: str, handle: Any, link: int) -> NvLinkSample:
    state = calls.reading(uuid, ("nvmlDeviceGetNvLinkState",), handle, link, link_probe=True)
    counters = [calls.reading(uuid, ("nvmlDeviceGetNvLinkErrorCounter",), handle, link, counter,
                              link_probe=True)
                for counter in LINK_COUNTERS]
    return NvLinkSample(link, state == abi.FEATURE_ENABLED, *counters)


def probe_links(calls: NvmlCalls, uuid: str, handle: Any) -> tuple[tuple[int, ...], bool]:
    """The NVLink indices this GPU has (their state reads, up or down), and whether the answer
    is final (no read failed transiently)."""
    links = []
    final = True
    for link in range(abi.NVLINK_LINKS_MAX):
        state = calls.reading(uuid, ("nvmlDeviceGetNvLinkState",), handle, link,
                              link_probe=True)
        if isinstance(state, int):
            links.append(link)
        elif isinstance(state, Failed):
            final = False
    return tuple(links), final

