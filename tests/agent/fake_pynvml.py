"""`FakePynvml`: the part of the pynvml module `NvmlBackend` calls, answering from a node
snapshot (agent.gpu_snapshot) the way nvidia-ml-py 13 does, so the adapter is tested without a
GPU.

What makes it a faithful stand-in, not a mock:

- errors are pynvml's real `NVMLError_*` classes (taken from `agent.nvml_backend.REAL_PYNVML`:
  nothing but the backend imports pynvml), raised by code; struct results are pynvml's real
  ctypes structures, so `busId` comes back as upper-case `bytes` with an 8-digit domain;
- handles are pointers (`ctypes.c_void_p`), and an event's handle is the same pointer;
- every call before `nvmlInit` raises Uninitialized, a lost GPU raises GpuIsLost on every call,
  NVLink indices past a GPU's links raise InvalidArgument (NotSupported on a GPU with none);
- `nvmlDeviceRegisterEvents` refuses bits the GPU does not support, and `nvmlEventSetWait`
  blocks for its timeout and then raises Timeout.

Knobs, for the adapter's details: `remove_function` (the driver lacks it: FunctionNotFound),
`drop_from_binding` (an old nvidia-ml-py lacks it), `fail_call`, `fail_field`, `set_reading`,
`strings_as_bytes`, `spurious_timeouts`, `fail_next_wait`, `break_event_sets`, `set_processes`
and more; `calls`
records every function called.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from agent import nvml_abi as abi
from agent.gpu import WHOLE_DEVICE, Fabric, Failed, NvLinkSample, Reading, Unsupported
from agent.gpu_profiles import build_profile
from agent.gpu_snapshot import DeviceSnapshot, NodeSnapshot, link_peers
from agent.nvml_backend import REAL_PYNVML

real = REAL_PYNVML
SWITCH_BUS_ID = b"00000000:C5:00.0"
UNKNOWN_PEER_BUS_ID = b"00000000:FF:00.0"
ECC_FIELDS = {
    (abi.MEMORY_ERROR_CORRECTED, abi.VOLATILE_ECC): "ecc_volatile_corrected",
    (abi.MEMORY_ERROR_UNCORRECTED, abi.VOLATILE_ECC): "ecc_volatile_uncorrected",
    (abi.MEMORY_ERROR_CORRECTED, abi.AGGREGATE_ECC): "ecc_aggregate_corrected",
    (abi.MEMORY_ERROR_UNCORRECTED, abi.AGGREGATE_ECC): "ecc_aggregate_uncorrected",
}
FIELD_ID_READINGS = {
    abi.FIELD_POWER_VIOLATION_NS: "power_violation_ns",
    abi.FIELD_THERMAL_VIOLATION_NS: "thermal_violation_ns",
    abi.FIELD_RECOVERY_ACTION: "recovery_action",
}
VIOLATION_READINGS = {abi.PERF_POLICY_POWER: "power_violation_ns",
                      abi.PERF_POLICY_THERMAL: "thermal_violation_ns"}
LINK_COUNTER_FIELDS = {
    abi.NVLINK_ERROR_REPLAY: "replay_errors", abi.NVLINK_ERROR_RECOVERY: "recovery_errors",
    abi.NVLINK_ERROR_CRC_FLIT: "crc_flit_errors", abi.NVLINK_ERROR_CRC_DATA: "crc_data_errors",
}
# pynvml wraps these unversioned calls so that a driver without their _v3 raises this instead.
VERSION_CHECKED = frozenset({"nvmlDeviceGetComputeRunningProcesses",
                             "nvmlDeviceGetGraphicsRunningProcesses"})
REMAP_FIELDS = ("remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending",
                "remap_failure")


def raw_bus_id(bus_id: str) -> bytes:
    """What NVML's pciInfo.busId holds for a sysfs bus id: 8-digit domain, upper case."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}".encode()


@dataclass
class FakeDevice:
    record: DeviceSnapshot
    handle: ctypes.c_void_p
    peers: tuple[str | None, ...]
    lost: bool = False
    compute: list[tuple[int, int | None]] | None = None  # None: the snapshot's processes
    graphics: list[tuple[int, int | None]] = field(default_factory=list)

    @property
    def uuid(self) -> str:
        return self.record.info.uuid

    def reading(self, name: str) -> int:
        value: Reading = getattr(self.record.sample, name)
        if isinstance(value, Unsupported):
            raise real.NVMLError_NotSupported()
        if isinstance(value, Failed):
            raise real.NVMLError(value.code)
        return value

    def link(self, index: int) -> NvLinkSample:
        links = self.record.sample.nvlinks
        if not links:
            raise real.NVMLError_NotSupported()
        if not 0 <= index < len(links):
            raise real.NVMLError_InvalidArgument()
        return links[index]


@dataclass
class FakeEventSet:
    registered: dict[int, int] = field(default_factory=dict)  # handle address -> event bits
    queue: collections.deque[Any] = field(default_factory=collections.deque)
    freed: bool = False
    broken: int | None = None  # every wait on it fails with this code


class FakePynvml:
    NVMLError = real.NVMLError
    NVMLLibraryMismatchError = real.NVMLLibraryMismatchError
    c_nvmlGpuFabricInfoV_t = real.c_nvmlGpuFabricInfoV_t  # noqa: N815 - pynvml's name
    c_nvmlGpuFabricInfo_t = real.c_nvmlGpuFabricInfo_t  # noqa: N815 - pynvml's name

    def __init__(self, snapshot: NodeSnapshot) -> None:
        peers = link_peers(snapshot)
        self.snapshot = snapshot
        self.devices = [FakeDevice(device, ctypes.c_void_p(0x1000 * (index + 1)),
                                   peers[device.info.uuid])
                        for index, device in enumerate(snapshot.devices)]
        self._levels = {}
        for pair in snapshot.topology.pairs:
            self._levels[pair.uuid_a, pair.uuid_b] = pair.level
            self._levels[pair.uuid_b, pair.uuid_a] = pair.level
        self._changed = threading.Condition()
        self.initialised = 0
        self.calls: list[str] = []
        self.event_sets: list[FakeEventSet] = []
        self.registrations: dict[str, int] = {}
        self.strings_as_bytes = False
        self.fabric_status = int(real.NVML_SUCCESS)  # the fabric registration's own result
        self._init_error: int | None = None
        self._missing: set[str] = set()
        self._absent: set[str] = set()
        self._call_failures: dict[tuple[str, str | None], int] = {}
        self._field_failures: dict[tuple[str, int], int] = {}
        self._field_answers: dict[str, list[int]] = {}
        self._bus_ids: dict[str, bytes] = {}
        self._wait_failures: list[int] = []
        self._spurious_timeouts = 0

    @classmethod
    def from_profile(cls, name: str, seed: int = 0) -> FakePynvml:
        return cls(build_profile(name, seed))

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "_absent"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # Knobs.

    def uuids(self) -> list[str]:
        return [device.uuid for device in self.devices]

    def library_missing(self) -> None:
        self._init_error = real.NVML_ERROR_LIBRARY_NOT_FOUND

    def fail_init(self, code: int) -> None:
        self._init_error = code

    def remove_function(self, name: str) -> None:
        """The driver lacks this function: calling it raises FunctionNotFound."""
        self._missing.add(name)

    def drop_from_binding(self, name: str) -> None:
        """The pynvml module has no such attribute (an older nvidia-ml-py)."""
        self._absent.add(name)

    def fail_call(self, function: str, code: int, uuid: str | None = None) -> None:
        """`function` raises NVMLError(code), on one GPU or on all."""
        self._call_failures[function, uuid] = code

    def fail_field(self, uuid: str, field_id: int, code: int) -> None:
        """One entry of nvmlDeviceGetFieldValues comes back with this return code."""
        self._field_failures[uuid, field_id] = code

    def answer_fields(self, uuid: str, field_ids: list[int]) -> None:
        """nvmlDeviceGetFieldValues answers entries for these fields, whatever was asked."""
        self._field_answers[uuid] = list(field_ids)

    def set_bus_id(self, uuid: str, raw: bytes) -> None:
        """nvmlDeviceGetPciInfo answers this busId, a bus id or not."""
        self._bus_ids[uuid] = raw

    def set_reading(self, uuid: str, name: str, value: Reading) -> None:
        self._update_sample(uuid, **{name: value})

    def set_link_up(self, uuid: str, link: int, up: bool) -> None:
        device = self._named(uuid)
        links = list(device.record.sample.nvlinks)
        links[link] = dataclasses.replace(links[link], up=up)
        self._update_sample(uuid, nvlinks=tuple(links))

    def set_fabric(self, uuid: str, state: Fabric) -> None:
        self._update_sample(uuid, fabric=state)

    def set_supported_events(self, uuid: str, mask: int) -> None:
        device = self._named(uuid)
        device.record = dataclasses.replace(device.record, supported_events=mask)

    def set_info(self, uuid: str, **changes: Any) -> None:
        device = self._named(uuid)
        info = dataclasses.replace(device.record.info, **changes)
        device.record = dataclasses.replace(device.record, info=info)

    def set_processes(self, uuid: str, *, compute: list[tuple[int, int | None]] | None = None,
                      graphics: list[tuple[int, int | None]] | None = None) -> None:
        device = self._named(uuid)
        device.compute = None if compute is None else list(compute)
        device.graphics = list(graphics or [])

    def lose(self, uuid: str) -> None:
        """Fallen off the bus: XID 79 is queued first, then every call on the GPU fails."""
        self.inject_xid(uuid, abi.XID_FALLEN_OFF_BUS)
        self._named(uuid).lost = True

    def inject_xid(self, uuid: str, xid: int) -> None:
        self.inject_event(uuid, abi.EVENT_XID, xid)

    def inject_event(self, uuid: str, event_type: int, data: int, *,
                     gpu_instance: int = WHOLE_DEVICE,
                     compute_instance: int = WHOLE_DEVICE) -> None:
        handle = self._named(uuid).handle
        self._deliver(handle, event_type, data, gpu_instance, compute_instance)

    def inject_foreign_event(self, event_type: int, data: int) -> None:
        """An event whose device handle matches no GPU the backend knows."""
        self._deliver(ctypes.c_void_p(0xDEAD000), event_type, data, WHOLE_DEVICE, WHOLE_DEVICE,
                      registered_only=False)

    def spurious_timeouts(self, count: int) -> None:
        """The next `count` waits end at once with Timeout, as a signal would end them."""
        self._spurious_timeouts = count

    def fail_next_wait(self, code: int) -> None:
        self._wait_failures.append(code)

    def break_event_sets(self, code: int) -> None:
        """Every wait on the event sets made so far fails with `code`, however often it is
        tried; a set made later works."""
        with self._changed:
            for event_set in self.event_sets:
                event_set.broken = code

    def _named(self, uuid: str) -> FakeDevice:
        for device in self.devices:
            if device.uuid == uuid:
                return device
        raise KeyError(uuid)

    def _update_sample(self, uuid: str, **changes: Any) -> None:
        device = self._named(uuid)
        sample = dataclasses.replace(device.record.sample, **changes)
        device.record = dataclasses.replace(device.record, sample=sample)

    def _deliver(self, handle: ctypes.c_void_p, event_type: int, data: int, gpu_instance: int,
                 compute_instance: int, *, registered_only: bool = True) -> None:
        event = SimpleNamespace(device=handle, eventType=event_type, eventData=data,
                                gpuInstanceId=gpu_instance, computeInstanceId=compute_instance)
        with self._changed:
            for event_set in self.event_sets:
                wanted = event_set.registered.get(handle.value or 0, 0) & event_type
                if not event_set.freed and (wanted or not registered_only):
                    event_set.queue.append(event)
            self._changed.notify_all()

    # The gate every call passes.

    def _node_call(self, function: str) -> None:
        self.calls.append(function)
        if function in self._missing and function in VERSION_CHECKED:
            raise real.NVMLLibraryMismatchError(f"{function}: no _v3 in this driver")
        if function in self._missing:
            raise real.NVMLError_FunctionNotFound()
        if self.initialised == 0:
            raise real.NVMLError_Uninitialized()
        code = self._call_failures.get((function, None))
        if code is not None:
            raise real.NVMLError(code)

    def _device_call(self, function: str, handle: Any) -> FakeDevice:
        self._node_call(function)
        device = self._device(handle)
        code = self._call_failures.get((function, device.uuid))
        if code is not None:
            raise real.NVMLError(code)
        if device.lost:
            raise real.NVMLError_GpuIsLost()
        return device

    def _device(self, handle: Any) -> FakeDevice:
        if isinstance(handle, ctypes.c_void_p):
            for device in self.devices:
                if device.handle.value == handle.value:
                    return device
        raise real.NVMLError_InvalidArgument()

    def _text(self, value: str) -> str | bytes:
        return value.encode() if self.strings_as_bytes else value

    # Initialisation and the system.

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self._init_error is not None:
            raise real.NVMLError(self._init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._node_call("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._node_call("nvmlSystemGetDriverVersion")
        return self._text(self.snapshot.driver.driver_version)

    def nvmlSystemGetNVMLVersion(self) -> str | bytes:
        self._node_call("nvmlSystemGetNVMLVersion")
        return self._text(self.snapshot.driver.nvml_version)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._node_call("nvmlSystemGetCudaDriverVersion")
        return self.snapshot.driver.cuda_driver_version

    # Identity.

    def nvmlDeviceGetCount(self) -> int:
        self._node_call("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ctypes.c_void_p:
        self._node_call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devices):
            raise real.NVMLError_InvalidArgument()
        return self.devices[index].handle

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> ctypes.c_void_p:
        self._node_call("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for device in self.devices:
            if device.uuid == text:
                if device.lost:
                    raise real.NVMLError_GpuIsLost()
                return device.handle
        raise real.NVMLError_NotFound()

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:
        return self._text(self._device_call("nvmlDeviceGetUUID", handle).uuid)

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        return self._text(self._device_call("nvmlDeviceGetName", handle).record.info.model)

    def nvmlDeviceGetSerial(self, handle: Any) -> str | bytes:
        serial = self._device_call("nvmlDeviceGetSerial", handle).record.info.serial
        if not serial:
            raise real.NVMLError_NotSupported()
        return self._text(serial)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        minor = self._device_call("nvmlDeviceGetMinorNumber", handle).record.info.minor
        if minor < 0:
            raise real.NVMLError_NotSupported()
        return minor

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        info = self._device_call("nvmlDeviceGetPciInfo", handle).record.info
        pci = self._pci_info(raw_bus_id(info.pci_bus_id))
        pci.busId = self._bus_ids.get(info.uuid, pci.busId)
        return pci

    @staticmethod
    def _pci_info(bus_id: bytes) -> Any:
        domain, bus, slot = bus_id.decode().split(":")
        return real.nvmlPciInfo_t(busIdLegacy=bus_id[-12:], domain=int(domain, 16),
                                  bus=int(bus, 16), device=int(slot.split(".")[0], 16),
                                  pciDeviceId=0x233010DE, pciSubSystemId=0x16C110DE,
                                  busId=bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        device = self._device_call("nvmlDeviceGetMemoryInfo", handle)
        return real.c_nvmlMemory_t(total=device.record.info.memory_bytes,
                                   free=device.reading("memory_free_bytes"),
                                   used=device.reading("memory_used_bytes"))

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        device = self._device_call("nvmlDeviceGetCudaComputeCapability", handle)
        return device.record.info.compute_capability

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        numa_node = self._device_call("nvmlDeviceGetNumaNodeId", handle).record.info.numa_node
        if numa_node < 0:
            raise real.NVMLError_NotSupported()
        return numa_node

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        info = self._device_call("nvmlDeviceGetMigMode", handle).record.info
        pending_mode = info.mig_enabled != info.mig_pending
        return [int(info.mig_enabled), int(pending_mode)]

    # Thermal, power, clocks.

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int, version: int = 0) -> int:
        device = self._device_call("nvmlDeviceGetTemperatureV", handle)
        assert sensor == abi.TEMPERATURE_GPU
        return device.reading("temperature_c")

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        device = self._device_call("nvmlDeviceGetTemperature", handle)
        assert sensor == abi.TEMPERATURE_GPU
        return device.reading("temperature_c")

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        device = self._device_call("nvmlDeviceGetTemperatureThreshold", handle)
        names = {abi.THRESHOLD_SLOWDOWN: "slowdown_temperature_c",
                 abi.THRESHOLD_SHUTDOWN: "shutdown_temperature_c"}
        if threshold not in names:
            raise real.NVMLError_NotSupported()
        return device.reading(names[threshold])

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._device_call("nvmlDeviceGetPowerUsage", handle).reading("power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        device = self._device_call("nvmlDeviceGetEnforcedPowerLimit", handle)
        return device.reading("power_limit_mw")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        device = self._device_call("nvmlDeviceGetTotalEnergyConsumption", handle)
        return device.reading("energy_mj")

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        device = self._device_call("nvmlDeviceGetClockInfo", handle)
        names = {abi.CLOCK_SM: "sm_clock_mhz", abi.CLOCK_MEM: "memory_clock_mhz"}
        return device.reading(names[clock])

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        device = self._device_call("nvmlDeviceGetUtilizationRates", handle)
        return real.c_nvmlUtilization_t(gpu=device.reading("utilization_pct"), memory=0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        device = self._device_call("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return device.reading("clock_event_mask")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        device = self._device_call("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return device.reading("clock_event_mask")

    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any:
        device = self._device_call("nvmlDeviceGetViolationStatus", handle)
        return real.c_nvmlViolationTime_t(
            referenceTime=0, violationTime=device.reading(VIOLATION_READINGS[policy]))

    # Memory errors.

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        enabled = self._device_call("nvmlDeviceGetEccMode", handle).reading("ecc_enabled")
        return [enabled, enabled]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        device = self._device_call("nvmlDeviceGetTotalEccErrors", handle)
        return device.reading(ECC_FIELDS[error_type, counter])

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        device = self._device_call("nvmlDeviceGetRetiredPages", handle)
        name = ("retired_pages_sbe" if cause == abi.RETIREMENT_MULTIPLE_SINGLE_BIT
                else "retired_pages_dbe")
        return [0x1000 * page for page in range(device.reading(name))]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        device = self._device_call("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        return device.reading("retired_pages_pending")

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, ...]:
        device = self._device_call("nvmlDeviceGetRemappedRows", handle)
        return tuple(device.reading(name) for name in REMAP_FIELDS)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[int]) -> list[Any]:
        device = self._device_call("nvmlDeviceGetFieldValues", handle)
        answered = self._field_answers.get(device.uuid, field_ids)
        return [self._field_value(device, field_id) for field_id in answered]

    def _field_value(self, device: FakeDevice, field_id: int) -> Any:
        entry = real.c_nvmlFieldValue_t(fieldId=field_id, scopeId=0, timestamp=0,
                                        latencyUsec=0, valueType=0, nvmlReturn=0)
        failure = self._field_failures.get((device.uuid, field_id))
        try:
            if failure is not None:
                raise real.NVMLError(failure)
            name = FIELD_ID_READINGS.get(field_id)  # a field this fake does not model: 0
            entry.value.ullVal = 0 if name is None else device.reading(name)
            entry.valueType = abi.VALUE_TYPE_UNSIGNED_LONG_LONG
        except real.NVMLError as error:
            entry.nvmlReturn = error.value
        return entry

    # PCIe and NVLink.

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        device = self._device_call("nvmlDeviceGetPcieReplayCounter", handle)
        return device.reading("pcie_replays")

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        device = self._device_call("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        return device.reading("pcie_generation")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        device = self._device_call("nvmlDeviceGetMaxPcieLinkGeneration", handle)
        return device.reading("pcie_generation_max")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        device = self._device_call("nvmlDeviceGetCurrPcieLinkWidth", handle)
        return device.reading("pcie_width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        device = self._device_call("nvmlDeviceGetMaxPcieLinkWidth", handle)
        return device.reading("pcie_width_max")

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        device = self._device_call("nvmlDeviceGetNvLinkState", handle)
        return abi.FEATURE_ENABLED if device.link(link).up else 0

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        device = self._device_call("nvmlDeviceGetNvLinkErrorCounter", handle)
        reading: Reading = getattr(device.link(link), LINK_COUNTER_FIELDS[counter])
        if isinstance(reading, Unsupported):
            raise real.NVMLError_NotSupported()
        if isinstance(reading, Failed):
            raise real.NVMLError(reading.code)
        return reading

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        device = self._device_call("nvmlDeviceGetNvLinkRemoteDeviceType", handle)
        device.link(link)
        return abi.NVLINK_DEVICE_SWITCH if self.snapshot.topology.nvswitch \
            else abi.NVLINK_DEVICE_GPU

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
        device = self._device_call("nvmlDeviceGetNvLinkRemotePciInfo", handle)
        device.link(link)
        if self.snapshot.topology.nvswitch:
            return self._pci_info(SWITCH_BUS_ID)
        peer = device.peers[link]
        if peer is None:
            return self._pci_info(UNKNOWN_PEER_BUS_ID)
        return self._pci_info(raw_bus_id(self._named(peer).record.info.pci_bus_id))

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
        device = self._device_call("nvmlDeviceGetGpuFabricInfoV", handle)
        return self._fabric(device, info)

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info: Any) -> int:
        device = self._device_call("nvmlDeviceGetGpuFabricInfo", handle)
        return self._fabric(device, info)

    def _fabric(self, device: FakeDevice, reference: Any) -> int:
        info = getattr(reference, "_obj", None)  # NVML writes through a pointer: byref(info)
        if info is None:
            raise real.NVMLError_InvalidArgument()
        if device.record.sample.fabric is Fabric.NOT_SUPPORTED:
            raise real.NVMLError_NotSupported()
        info.state = int(device.record.sample.fabric)
        info.status = self.fabric_status
        return int(real.NVML_SUCCESS)

    def nvmlDeviceGetTopologyCommonAncestor(self, first: Any, second: Any) -> int:
        device_a = self._device_call("nvmlDeviceGetTopologyCommonAncestor", first)
        device_b = self._device_call("nvmlDeviceGetTopologyCommonAncestor", second)
        level = self._levels.get((device_a.uuid, device_b.uuid))
        if level is None:
            raise real.NVMLError_NotSupported()
        return level

    # Processes.

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._compute(self._device_call("nvmlDeviceGetComputeRunningProcesses", handle))

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return self._compute(self._device_call("nvmlDeviceGetComputeRunningProcesses_v2",
                                               handle))

    def _compute(self, device: FakeDevice) -> list[Any]:
        listed = device.compute if device.compute is not None else [
            (process.pid, process.used_bytes) for process in device.record.processes]
        return [self._process(pid, used) for pid, used in listed]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        device = self._device_call("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return [self._process(pid, used) for pid, used in device.graphics]

    @staticmethod
    def _process(pid: int, used: int | None) -> Any:
        return SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=WHOLE_DEVICE,
                               computeInstanceId=WHOLE_DEVICE)

    # Events.

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._node_call("nvmlEventSetCreate")
        event_set = FakeEventSet()
        with self._changed:
            self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        device = self._device_call("nvmlDeviceGetSupportedEventTypes", handle)
        return device.record.supported_events

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, event_set: FakeEventSet) -> None:
        device = self._device_call("nvmlDeviceRegisterEvents", handle)
        if mask & ~device.record.supported_events:
            raise real.NVMLError_NotSupported()
        with self._changed:
            address = device.handle.value or 0
            event_set.registered[address] = event_set.registered.get(address, 0) | mask
            self.registrations[device.uuid] = self.registrations.get(device.uuid, 0) | mask

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeout_ms: int) -> Any:
        self._node_call("nvmlEventSetWait")
        deadline = time.monotonic() + timeout_ms / 1000
        with self._changed:
            if self._wait_failures:
                raise real.NVMLError(self._wait_failures.pop(0))
            if event_set.broken is not None:
                raise real.NVMLError(event_set.broken)
            if self._spurious_timeouts > 0:
                self._spurious_timeouts -= 1
                raise real.NVMLError_Timeout()
            while not event_set.queue:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    raise real.NVMLError_Timeout()
                self._changed.wait(remaining_s)
            return event_set.queue.popleft()

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self._node_call("nvmlEventSetFree")
        event_set.freed = True
