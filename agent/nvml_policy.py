"""What an NVML error means to the agent: the policy table of reference/nvml.md §4.1, as code.

Every NVML return code falls in one class:

- capability absent (NotSupported, FunctionNotFound, VgpuEccNotSupported, and InvalidArgument
  when probing an NVLink index past the GPU's real count): the reading is UNSUPPORTED, which
  means unknown, never healthy;
- device fault (GpuIsLost, ResetRequired, GpuNotFound): that GPU is gone, `GpuGone` is raised
  and the other GPUs keep answering;
- node fault (LibraryNotFound, DriverNotLoaded, LibRmVersionMismatch, Uninitialized,
  OperatingSystem, NoPermission): NVML is unusable on this node, `NvmlUnavailable` is raised;
- anything else is transient (Timeout outside the event loop, NotReady, NoData, InUse, Unknown,
  CorruptedInforom, ...): the reading is `Failed` with the code, and the health policy decides
  whether it persists long enough to matter (CorruptedInforom is a WARN there).

Codes are compared as integers (`NVMLError.value`): NVML's exceptions are unhashable and their
`==` raises against an int.
"""

from __future__ import annotations

import enum
from typing import Final

from agent.gpu import UNSUPPORTED, Failed, GpuGone, NvmlCode, NvmlUnavailable, Unsupported


class ErrorClass(enum.Enum):
    CAPABILITY_ABSENT = "capability absent"
    TRANSIENT = "transient"
    DEVICE_FAULT = "device fault"
    NODE_FAULT = "node fault"


VGPU_ECC_NOT_SUPPORTED: Final = 22

CAPABILITY_ABSENT_CODES: Final = frozenset(
    {NvmlCode.NOT_SUPPORTED, NvmlCode.FUNCTION_NOT_FOUND, VGPU_ECC_NOT_SUPPORTED}
)
DEVICE_FAULT_CODES: Final = frozenset(
    {NvmlCode.GPU_IS_LOST, NvmlCode.RESET_REQUIRED, NvmlCode.GPU_NOT_FOUND}
)
NODE_FAULT_CODES: Final = frozenset({
    NvmlCode.LIBRARY_NOT_FOUND, NvmlCode.DRIVER_NOT_LOADED, NvmlCode.LIB_RM_VERSION_MISMATCH,
    NvmlCode.UNINITIALIZED, NvmlCode.OPERATING_SYSTEM, NvmlCode.NO_PERMISSION,
})

# NVML's own wording (nvmlErrorString), for messages the fakes make up.
MESSAGES: Final = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
    9: "Driver Not Loaded",
    10: "Timeout",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    14: "Corrupted infoROM",
    15: "GPU is lost",
    16: "GPU requires restart",
    17: "The operating system has blocked the request.",
    18: "RM has detected an NVML/RM version mismatch.",
    19: "In use by another client",
    21: "No data",
    27: "Not Ready",
    28: "GPU not found",
    999: "Unknown Error",
}


def classify(code: int, *, link_probe: bool = False) -> ErrorClass:
    """The class of an NVML return code; `link_probe` for calls that take an NVLink index."""
    if code in CAPABILITY_ABSENT_CODES or (link_probe and code == NvmlCode.INVALID_ARGUMENT):
        return ErrorClass.CAPABILITY_ABSENT
    if code in DEVICE_FAULT_CODES:
        return ErrorClass.DEVICE_FAULT
    if code in NODE_FAULT_CODES:
        return ErrorClass.NODE_FAULT
    return ErrorClass.TRANSIENT


def describe(code: int) -> str:
    """NVML's message for a return code, as pynvml prints it."""
    return MESSAGES.get(code, f"NVML Error with code {code}")


def reading_outcome(uuid: str, code: int, message: str, *,
                    link_probe: bool = False) -> Unsupported | Failed:
    """What one failed read on one GPU becomes: a reading, or `GpuGone` / `NvmlUnavailable`."""
    match classify(code, link_probe=link_probe):
        case ErrorClass.CAPABILITY_ABSENT:
            return UNSUPPORTED
        case ErrorClass.DEVICE_FAULT:
            raise GpuGone(uuid, code, message)
        case ErrorClass.NODE_FAULT:
            raise NvmlUnavailable(code, message)
        case ErrorClass.TRANSIENT:
            return Failed(code, message)
