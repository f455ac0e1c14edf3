"""The numbers of NVML's C interface the agent uses: event bits, clock-event bits, enums and
field ids, as `nvml.h` defines them (and pynvml copies them).

They are part of NVML's stable ABI, so they are written out here once instead of being read off
the pynvml module: older bindings lack the newer names, and the fakes need the same numbers
without importing pynvml. `EventKind` is mapped from event bits here, in one place.
"""

from __future__ import annotations

from typing import Final

from agent.gpu import EventKind

# nvmlEventType* bits.
EVENT_SINGLE_BIT_ECC: Final = 0x1
EVENT_DOUBLE_BIT_ECC: Final = 0x2
EVENT_PSTATE: Final = 0x4
EVENT_XID: Final = 0x8
EVENT_CLOCK: Final = 0x10
EVENT_POWER_SOURCE_CHANGE: Final = 0x80
EVENT_MIG_CONFIG_CHANGE: Final = 0x100
EVENT_SINGLE_BIT_ECC_STORM: Final = 0x200
EVENT_DRAM_RETIREMENT: Final = 0x400
EVENT_DRAM_RETIREMENT_FAILURE: Final = 0x800
EVENT_NON_FATAL_POISON: Final = 0x1000
EVENT_FATAL_POISON: Final = 0x2000
EVENT_GPU_UNAVAILABLE: Final = 0x4000
EVENT_RECOVERY_ACTION: Final = 0x8000

# The events that say something about a GPU's health; PState, clock, power-source and MIG
# configuration changes are routine and stay unregistered. Registration is always masked by what
# nvmlDeviceGetSupportedEventTypes reports for the device.
HEALTH_EVENTS: Final = (
    EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID | EVENT_SINGLE_BIT_ECC_STORM
    | EVENT_DRAM_RETIREMENT | EVENT_DRAM_RETIREMENT_FAILURE | EVENT_NON_FATAL_POISON
    | EVENT_FATAL_POISON | EVENT_GPU_UNAVAILABLE | EVENT_RECOVERY_ACTION
)

EVENT_KINDS: Final = {
    EVENT_XID: EventKind.XID,
    EVENT_SINGLE_BIT_ECC: EventKind.SINGLE_BIT_ECC,
    EVENT_DOUBLE_BIT_ECC: EventKind.DOUBLE_BIT_ECC,
    EVENT_GPU_UNAVAILABLE: EventKind.GPU_UNAVAILABLE,
    EVENT_RECOVERY_ACTION: EventKind.RECOVERY_ACTION,
}


def event_kind(event_type: int) -> EventKind:
    """The kind of an event NVML delivered with this eventType (one bit)."""
    return EVENT_KINDS.get(event_type, EventKind.OTHER)


# nvmlClocksEventReason* bits (the clock_event_mask reading).
CLOCK_EVENT_GPU_IDLE: Final = 0x1
CLOCK_EVENT_SW_POWER_CAP: Final = 0x4
CLOCK_EVENT_HW_SLOWDOWN: Final = 0x8
CLOCK_EVENT_SW_THERMAL: Final = 0x20
CLOCK_EVENT_HW_THERMAL: Final = 0x40
CLOCK_EVENT_HW_POWER_BRAKE: Final = 0x80

# Arguments of the polled calls.
TEMPERATURE_GPU: Final = 0  # nvmlTemperatureSensors_t
THRESHOLD_SHUTDOWN: Final = 0  # nvmlTemperatureThresholds_t
THRESHOLD_SLOWDOWN: Final = 1
CLOCK_SM: Final = 1  # nvmlClockType_t
CLOCK_MEM: Final = 2
MEMORY_ERROR_CORRECTED: Final = 0  # nvmlMemoryErrorType_t
MEMORY_ERROR_UNCORRECTED: Final = 1
VOLATILE_ECC: Final = 0  # nvmlEccCounterType_t
AGGREGATE_ECC: Final = 1
RETIREMENT_MULTIPLE_SINGLE_BIT: Final = 0  # nvmlPageRetirementCause_t
RETIREMENT_DOUBLE_BIT: Final = 1
PERF_POLICY_POWER: Final = 0  # nvmlPerfPolicyType_t, for nvmlDeviceGetViolationStatus
PERF_POLICY_THERMAL: Final = 1
FEATURE_ENABLED: Final = 1  # nvmlEnableState_t
MIG_ENABLED: Final = 1

# NVLink.
NVLINK_LINKS_MAX: Final = 36  # NVML_NVLINK_MAX_LINKS in current NVML; older GPUs have fewer
NVLINK_ERROR_REPLAY: Final = 0  # nvmlNvLinkErrorCounter_t
NVLINK_ERROR_RECOVERY: Final = 1
NVLINK_ERROR_CRC_FLIT: Final = 2
NVLINK_ERROR_CRC_DATA: Final = 3
NVLINK_DEVICE_GPU: Final = 0  # nvmlIntNvLinkDeviceType_t
NVLINK_DEVICE_IBMNPU: Final = 1
NVLINK_DEVICE_SWITCH: Final = 2

# nvmlGpuTopologyLevel_t.
TOPOLOGY_INTERNAL: Final = 0
TOPOLOGY_SINGLE: Final = 10
TOPOLOGY_MULTIPLE: Final = 20
TOPOLOGY_HOSTBRIDGE: Final = 30
TOPOLOGY_NODE: Final = 40
TOPOLOGY_SYSTEM: Final = 50

# Field ids for nvmlDeviceGetFieldValues.
FIELD_POWER_VIOLATION_NS: Final = 74  # NVML_FI_DEV_PERF_POLICY_POWER
FIELD_THERMAL_VIOLATION_NS: Final = 75  # NVML_FI_DEV_PERF_POLICY_THERMAL
FIELD_RECOVERY_ACTION: Final = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION

# nvmlValueType_t: which member of a field value's union holds the value.
VALUE_UNION_MEMBERS: Final = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}
VALUE_TYPE_UNSIGNED_LONG_LONG: Final = 3

SUCCESS: Final = 0  # nvmlReturn_t

# XIDs the fakes emit for their scenarios (what real drivers log for the same faults).
XID_DOUBLE_BIT_ECC: Final = 48
XID_ROW_REMAP_PENDING: Final = 63
XID_ROW_REMAP_FAILURE: Final = 64
XID_FALLEN_OFF_BUS: Final = 79
