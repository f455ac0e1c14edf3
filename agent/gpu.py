"""What the agent knows of a node's GPUs, and the one interface it reads them through.

`GpuBackend` is the seam between the agent and NVML: `agent.nvml_backend.NvmlBackend` implements
it over `pynvml` (the only module that imports it) and `agent.fake_backend.FakeGpuBackend` plays
scenarios without a GPU. Only the plain frozen dataclasses below cross it; no pynvml type does.

Every polled signal is a `Reading`: an integer in the unit its name says, `UNSUPPORTED` when the
GPU or driver lacks it (NVML NotSupported, FunctionNotFound: that signal is then unknown, never
healthy), or `Failed` with the NVML code when reading it failed this time. Identity is the UUID,
never the index. Errors that concern the whole node raise `NvmlUnavailable` (the GPU count is then
unknown, not zero); errors that concern one GPU raise `GpuGone` (fallen off the bus, needs a
reset), and the other GPUs keep answering. A read with no `Reading` to carry a failure (the
process list) raises `ReadFailed` rather than answer "none".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Protocol


@dataclass(frozen=True, slots=True)
class Unsupported:
    """The GPU or driver does not offer this signal."""


UNSUPPORTED: Final = Unsupported()


@dataclass(frozen=True, slots=True)
class Failed:
    """Reading the signal failed this time: NVML's return code and message."""

    code: int
    message: str


Reading = int | Unsupported | Failed


def value_of(reading: Reading) -> int | None:
    """The reading's value, or None when there is none."""
    return reading if isinstance(reading, int) else None


# NVML return codes the agent tells apart (pynvml's NVML_ERROR_*).
class NvmlCode(enum.IntEnum):
    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    NOT_FOUND = 6
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    CORRUPTED_INFOROM = 14
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    OPERATING_SYSTEM = 17
    LIB_RM_VERSION_MISMATCH = 18
    NO_DATA = 21
    NOT_READY = 27
    GPU_NOT_FOUND = 28
    UNKNOWN = 999


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node (no library, no driver, version skew, no permission):
    the agent reports the condition and retries with back-off; it never reports zero GPUs."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"NVML unavailable ({code}): {message}")
        self.code = code
        self.message = message


class GpuGone(Exception):
    """One GPU stopped answering (fallen off the bus, reset required, not found)."""

    def __init__(self, uuid: str, code: int, message: str) -> None:
        super().__init__(f"{uuid}: {message} ({code})")
        self.uuid = uuid
        self.code = code
        self.message = message


class EventWaitFailed(Exception):
    """Waiting for events failed with something other than a timeout: events may be lost."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"event wait failed ({code}): {message}")
        self.code = code
        self.message = message


class ReadFailed(Exception):
    """A read on one GPU that has no `Reading` to carry a failure (its process list) failed
    this time, or the GPU does not offer it; the GPU may be fine: retry. Never read as "none"."""

    def __init__(self, uuid: str, code: int, message: str) -> None:
        super().__init__(f"{uuid}: {message} ({code})")
        self.uuid = uuid
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class DriverInfo:
    driver_version: str
    nvml_version: str
    cuda_driver_version: int  # e.g. 12040 for 12.4


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One GPU's identity and fixed properties."""

    uuid: str  # "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    index: int  # NVML's index: not stable across boots, never an identity
    minor: int  # /dev/nvidia<minor>
    pci_bus_id: str  # normalised: "0000:3b:00.0" (lower case, 4-digit domain, as sysfs)
    model: str  # nvmlDeviceGetName, e.g. "NVIDIA H100 80GB HBM3"
    serial: str  # "" where unsupported
    memory_bytes: int
    compute_capability: tuple[int, int]
    numa_node: int  # -1 when unknown
    mig_enabled: bool
    mig_pending: bool  # the pending MIG mode differs from the current one: needs a reset


class Fabric(enum.IntEnum):
    """NVSwitch fabric state (nvmlDeviceGetGpuFabricInfo); NOT_SUPPORTED off fabric systems."""

    NOT_SUPPORTED = 0
    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


@dataclass(frozen=True, slots=True)
class NvLinkSample:
    link: int
    up: bool
    replay_errors: Reading
    recovery_errors: Reading
    crc_flit_errors: Reading
    crc_data_errors: Reading


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSample:
    """Every polled signal of one GPU at one moment; counters are cumulative as NVML keeps
    them (volatile ones since the last reset, aggregate ones for the GPU's lifetime)."""

    uuid: str
    temperature_c: Reading
    slowdown_temperature_c: Reading
    shutdown_temperature_c: Reading
    power_mw: Reading
    power_limit_mw: Reading
    energy_mj: Reading
    sm_clock_mhz: Reading
    memory_clock_mhz: Reading
    utilization_pct: Reading
    memory_used_bytes: Reading
    memory_free_bytes: Reading
    clock_event_mask: Reading  # nvmlClocksEventReason* bits
    ecc_enabled: Reading  # 1 or 0
    ecc_volatile_corrected: Reading
    ecc_volatile_uncorrected: Reading
    ecc_aggregate_corrected: Reading
    ecc_aggregate_uncorrected: Reading
    retired_pages_sbe: Reading
    retired_pages_dbe: Reading
    retired_pages_pending: Reading  # 1 or 0
    remapped_rows_correctable: Reading
    remapped_rows_uncorrectable: Reading
    remap_pending: Reading  # 1 or 0
    remap_failure: Reading  # 1 or 0
    recovery_action: Reading  # NVML_GPU_RECOVERY_ACTION_*: 0 none, 1 reset, 2 reboot, ...
    pcie_replays: Reading
    pcie_generation: Reading
    pcie_generation_max: Reading
    pcie_width: Reading
    pcie_width_max: Reading
    thermal_violation_ns: Reading
    power_violation_ns: Reading
    fabric: Fabric = Fabric.NOT_SUPPORTED
    nvlinks: tuple[NvLinkSample, ...] = ()


class EventKind(enum.StrEnum):
    XID = "xid"
    SINGLE_BIT_ECC = "single_bit_ecc"
    DOUBLE_BIT_ECC = "double_bit_ecc"
    GPU_UNAVAILABLE = "gpu_unavailable"
    RECOVERY_ACTION = "recovery_action"
    OTHER = "other"


WHOLE_DEVICE: Final = 0xFFFFFFFF  # the GPU/compute instance id of an event not tied to MIG


@dataclass(frozen=True, slots=True)
class GpuEvent:
    uuid: str
    kind: EventKind
    xid: int | None = None  # for XID events: the XID number (NVML's eventData)
    data: int = 0
    gpu_instance: int = WHOLE_DEVICE
    compute_instance: int = WHOLE_DEVICE


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding a CUDA context on a GPU (host pid)."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuPair:
    """How two GPUs are connected: NVML's topology level (0 same board, 10 one PCIe switch,
    20 several, 30 host bridge, 40 same NUMA node, 50 across sockets) and NVLink links."""

    uuid_a: str
    uuid_b: str
    level: int
    nvlinks: int


@dataclass(frozen=True, slots=True)
class Topology:
    pairs: tuple[GpuPair, ...] = ()
    nvswitch: bool = False  # GPUs reach each other through NVSwitches (fabric systems)
    notes: tuple[str, ...] = ()


class GpuBackend(Protocol):
    """One node's GPUs. Calls block (NVML does): the agent runs them in worker threads.
    `wait_event` blocks until an event arrives or `timeout_ms` passes (then None), never
    returning early with nothing."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def driver(self) -> DriverInfo: ...
    def devices(self) -> tuple[DeviceInfo, ...]: ...
    def sample(self, uuid: str) -> DeviceSample: ...
    def processes(self, uuid: str) -> tuple[GpuProcess, ...]: ...  # raises ReadFailed
    def topology(self) -> Topology: ...
    def wait_event(self, timeout_ms: int) -> GpuEvent | None: ...
