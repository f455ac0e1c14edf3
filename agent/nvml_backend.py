"""`NvmlBackend`: the `GpuBackend` over NVML, and the only module in Cellar that imports pynvml
(the `nvidia-ml-py` distribution).

The pynvml module is a constructor argument, so tests pass a fake that raises pynvml's real
exception classes (`REAL_PYNVML` hands them out). Everything NVML-shaped stops here:

- errors become readings or exceptions once, by the policy of agent.nvml_policy (UNSUPPORTED,
  `Failed`, `GpuGone`, `NvmlUnavailable`), through agent.nvml_calls, which also falls back from
  new functions to deprecated ones when the driver lacks the new one;
- bytes and str from the binding are decoded, and PCI bus ids normalised to sysfs' form
  (`b"00000000:3B:00.0"` -> `"0000:3b:00.0"`), in one helper each;
- handles stay inside: the agent names GPUs by UUID, and an event's handle is resolved back to a
  UUID by its address (which works for a GPU that just fell off the bus) or by asking NVML;
- events: one event set, each GPU registered for the health events it supports; a wait that
  NVML ends with Timeout (also early, on a signal) goes on until the caller's full timeout. A
  set whose waits keep failing otherwise is made again (the old one freed, every GPU registered
  anew) after EVENT_SET_REBUILD_FAILURES failures in a row, that run doubling after each
  rebuild up to EVENT_SET_REBUILD_FAILURES_MAX: events are not lost for ever to one bad set.

A GPU that cannot be identified right now (its handle or UUID fails) is left out of
`devices()` and `topology()`; `sample(uuid)` on one already known raises `GpuGone`. `stop()`
waits for a `wait_event` in progress to come back from NVML before it frees the event set.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import pathlib
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

import pynvml

from agent import nvml_abi as abi
from agent.gpu import (
    DeviceInfo,
    DeviceSample,
    DriverInfo,
    EventKind,
    EventWaitFailed,
    Failed,
    GpuEvent,
    GpuGone,
    GpuPair,
    GpuProcess,
    NvmlCode,
    NvmlUnavailable,
    ReadFailed,
    Topology,
    Unsupported,
)
from agent.nvml_calls import NvmlCallError, NvmlCalls
from agent.nvml_policy import ErrorClass, classify
from agent.nvml_sample import probe_links, read_sample

logger = logging.getLogger("cellar.agent.nvml")
REAL_PYNVML: Final[Any] = pynvml  # tests raise its real NVMLError_* classes from fakes
SYSFS: Final = pathlib.Path("/sys")
# The unversioned process lists call _v3; drivers before it have _v2.
COMPUTE_PROCESSES: Final = ("nvmlDeviceGetComputeRunningProcesses",
                            "nvmlDeviceGetComputeRunningProcesses_v2")
GRAPHICS_PROCESSES: Final = ("nvmlDeviceGetGraphicsRunningProcesses",
                             "nvmlDeviceGetGraphicsRunningProcesses_v2")
# Failed waits (not Timeout) in a row before the event set is made again; the run doubles after
# each rebuild that did not help, up to the max, and is back to the first after a good wait.
EVENT_SET_REBUILD_FAILURES: Final = 3
EVENT_SET_REBUILD_FAILURES_MAX: Final = 96


def decode_text(raw: object) -> str:
    """A string from the binding: `str` from wrapped functions, `bytes` from ctypes fields."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    return str(raw).strip("\x00").strip()


def normalise_bus_id(raw: object) -> str:
    """A PCI bus id as sysfs writes it: `b"00000000:3B:00.0"` -> `"0000:3b:00.0"`."""
    text = decode_text(raw).lower()
    parts = text.split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    try:
        domain, bus, slot = parts
        device, function = slot.split(".")
        return (f"{int(domain, 16):04x}:{int(bus, 16):02x}:"
                f"{int(device, 16):02x}.{int(function, 16):x}")
    except ValueError:
        raise ValueError(f"not a PCI bus id: {text!r}") from None


def handle_address(handle: Any) -> int | None:
    """The address a device handle points at: equal for every handle of one GPU."""
    try:
        address: int | None = ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None
    return address


def _raise_if_node_fault(error: NvmlCallError) -> None:
    if classify(error.code) is ErrorClass.NODE_FAULT:
        raise NvmlUnavailable(error.code, error.message) from error


def _raise_if_nvml_is_gone(error: NvmlCallError) -> None:
    """For event registration: a GPU that cannot be registered (too old, lost, or events need
    privileges the agent lacks) goes unwatched, its counters still polled; only NVML itself
    going away stops the start."""
    if classify(error.code) is ErrorClass.NODE_FAULT and error.code != NvmlCode.NO_PERMISSION:
        raise NvmlUnavailable(error.code, error.message) from error


@dataclass(frozen=True, slots=True)
class _Member:
    """One GPU as topology() sees it: its handle, bus id, and the bus ids of the GPUs at the
    far end of its up NVLinks (one entry per link)."""

    handle: Any
    bus_id: str
    remotes: tuple[str, ...]


class _Unidentified(Exception):
    """A GPU's identity (PCI info, name, memory) cannot be read right now."""


def _bus_id(uuid: str, raw: object) -> str:
    """A bus id NVML gave for `uuid`'s GPU; one that is not a bus id leaves it unidentified."""
    try:
        return normalise_bus_id(raw)
    except ValueError as error:
        raise _Unidentified(f"{uuid}: {error}") from None


class NvmlBackend:
    def __init__(self, nvml: Any = None, *, sysfs_root: pathlib.Path = SYSFS) -> None:
        self._calls = NvmlCalls(REAL_PYNVML if nvml is None else nvml)
        self._sysfs_root = sysfs_root
        self._lock = threading.RLock()  # guards everything below
        self._event_lock = threading.Lock()  # one NVML wait at a time; stop() waits for it
        self._stopping = threading.Event()
        self._started = False
        self._handles: dict[str, Any] = {}
        self._uuid_by_address: dict[int, str] = {}
        self._links: dict[str, tuple[int, ...]] = {}
        self._event_set: Any = None
        self._watched: set[str] = set()  # GPUs registered in the event set (or that cannot be)
        # Guarded by _event_lock: failed waits in a row, and the run that rebuilds the set.
        self._wait_failures = 0
        self._rebuild_after = EVENT_SET_REBUILD_FAILURES
        self.event_set_rebuilds = 0  # since construction, for logs and tests

    # Lifecycle.

    def start(self) -> None:
        """nvmlInit, find the GPUs, register their events. Raises NvmlUnavailable (12 when
        there is no driver); starting a started backend does nothing."""
        with self._lock:
            if self._started:
                return
            self._calls.forget_missing()
            self._handles, self._uuid_by_address, self._links = {}, {}, {}
            self._watched = set()
            self._wait_ok()
            self._node(("nvmlInit",))
            self._started = True
            self._stopping.clear()
            try:
                self._event_set = self._register_events(self._enumerate())
            except BaseException:
                self._started = False
                with contextlib.suppress(NvmlCallError):
                    self._calls.call(("nvmlShutdown",))
                raise

    def stop(self) -> None:
        """Free the event set and nvmlShutdown; never raises for a driver already gone."""
        self._stopping.set()
        with self._event_lock, self._lock:
            if not self._started:
                return
            self._started = False
            event_set, self._event_set = self._event_set, None
            self._handles, self._uuid_by_address, self._links = {}, {}, {}
            self._watched = set()
            if event_set is not None:
                with contextlib.suppress(NvmlCallError):
                    self._calls.call(("nvmlEventSetFree",), event_set)
            with contextlib.suppress(NvmlCallError):
                self._calls.call(("nvmlShutdown",))

    # Reads.

    def driver(self) -> DriverInfo:
        self._require_started()
        return DriverInfo(
            driver_version=decode_text(self._node(("nvmlSystemGetDriverVersion",))),
            nvml_version=decode_text(self._node_or(("nvmlSystemGetNVMLVersion",), "")),
            cuda_driver_version=int(self._node_or(("nvmlSystemGetCudaDriverVersion",), 0)),
        )

    def devices(self) -> tuple[DeviceInfo, ...]:
        self._require_started()
        found = []
        listed = self._enumerate()
        with self._lock:
            event_set = self._event_set
        if event_set is not None:  # a GPU that answers only now is watched from now on
            self._register_gpus(event_set, listed)
        for index, uuid, handle in listed:
            try:
                found.append(self._device_info(index, uuid, handle))
            except (GpuGone, _Unidentified) as error:
                logger.warning("GPU %d (%s) left out of the device list: %s", index, uuid,
                               error)
        return tuple(found)

    def sample(self, uuid: str) -> DeviceSample:
        handle = self._handle(uuid)
        return read_sample(self._calls, uuid, handle, self._links_of(uuid, handle))

    def processes(self, uuid: str) -> tuple[GpuProcess, ...]:
        """Compute and graphics processes (host pids), by pid; raises ReadFailed when the
        compute list cannot be read."""
        handle = self._handle(uuid)
        used_by_pid: dict[int, int | None] = {}
        for functions, required in ((GRAPHICS_PROCESSES, False), (COMPUTE_PROCESSES, True)):
            for process in self._process_list(uuid, functions, handle, required=required):
                used = process.usedGpuMemory
                used_by_pid[int(process.pid)] = None if used is None else int(used)
        return tuple(GpuProcess(pid, used) for pid, used in sorted(used_by_pid.items()))

    def topology(self) -> Topology:
        """PCIe distance of every pair of answering GPUs, NVLinks counted per pair from each
        up link's far end; NVSwitch peers make `nvswitch` true (their pairs count 0 links)."""
        self._require_started()
        notes: list[str] = []
        members, nvswitch = self._topology_members(notes)
        bus_to_uuid = {member.bus_id: uuid for uuid, member in members.items()}
        ordered = sorted(members)
        pairs = []
        for position, uuid_a in enumerate(ordered):
            member_a = members[uuid_a]
            peers = [bus_to_uuid.get(bus_id) for bus_id in member_a.remotes]
            for uuid_b in ordered[position + 1:]:
                level = self._level(uuid_a, member_a.handle, uuid_b, members[uuid_b].handle,
                                    notes)
                pairs.append(GpuPair(uuid_a, uuid_b, level, peers.count(uuid_b)))
        return Topology(tuple(pairs), nvswitch, tuple(notes))

    def wait_event(self, timeout_ms: int) -> GpuEvent | None:
        """The next health event, or None once `timeout_ms` has passed with none. Raises
        EventWaitFailed when NVML's wait fails (events may be lost: treat every GPU as
        suspect), NvmlUnavailable when NVML itself is gone or the backend is stopped."""
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must be >= 0, not {timeout_ms}")
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            remaining_ms = math.ceil((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                return None
            data = self._wait_once(remaining_ms)
            if data is not None:
                return self._event(data)

    # Node-level calls.

    def _node(self, names: tuple[str, ...], *args: Any) -> Any:
        try:
            return self._calls.call(names, *args)
        except NvmlCallError as error:
            raise NvmlUnavailable(error.code, error.message) from error

    def _node_or(self, names: tuple[str, ...], default: object) -> Any:
        """A node-level value that may be missing: `default` unless NVML itself is gone."""
        try:
            return self._calls.call(names)
        except NvmlCallError as error:
            _raise_if_node_fault(error)
            return default

    def _require_started(self) -> None:
        with self._lock:
            if not self._started:
                raise NvmlUnavailable(NvmlCode.UNINITIALIZED, "NvmlBackend is not started")

    # GPUs and their handles.

    def _enumerate(self) -> list[tuple[int, str, Any]]:
        """(index, UUID, handle) of every GPU that answers its identity, in index order."""
        found = []
        for index in range(int(self._node(("nvmlDeviceGetCount",)))):
            try:
                handle = self._calls.call(("nvmlDeviceGetHandleByIndex",), index)
                uuid = decode_text(self._calls.call(("nvmlDeviceGetUUID",), handle))
            except NvmlCallError as error:
                _raise_if_node_fault(error)
                continue
            found.append((index, uuid, handle))
            self._remember(uuid, handle)
        return found

    def _remember(self, uuid: str, handle: Any) -> None:
        """Keep a GPU's handle, also after it vanishes: calls on it then raise GpuGone, and
        its last events (XID 79, read after the loss) still resolve to its UUID. Every
        `devices()` refreshes the handles of the GPUs that answer."""
        address = handle_address(handle)
        with self._lock:
            self._handles[uuid] = handle
            if address is not None:
                self._uuid_by_address[address] = uuid

    def _handle(self, uuid: str) -> Any:
        self._require_started()
        with self._lock:
            handle = self._handles.get(uuid)
        if handle is not None:
            return handle
        try:
            handle = self._calls.call(("nvmlDeviceGetHandleByUUID",), uuid)
        except NvmlCallError as error:
            _raise_if_node_fault(error)
            raise GpuGone(uuid, error.code, f"no GPU with this UUID: {error.message}") from error
        self._remember(uuid, handle)
        return handle

    def _device_info(self, index: int, uuid: str, handle: Any) -> DeviceInfo:
        bus_id = _bus_id(uuid, self._identity(uuid, "nvmlDeviceGetPciInfo", handle).busId)
        memory = self._identity(uuid, "nvmlDeviceGetMemoryInfo", handle)
        mig = self._calls.attempt(uuid, ("nvmlDeviceGetMigMode",), handle)
        current, pending = (False, False) if isinstance(mig, Unsupported | Failed) else (
            int(mig[0]) == abi.MIG_ENABLED, int(mig[1]) == abi.MIG_ENABLED)
        capability = self._calls.attempt(uuid, ("nvmlDeviceGetCudaComputeCapability",), handle)
        minor = self._calls.reading(uuid, ("nvmlDeviceGetMinorNumber",), handle)
        serial = self._calls.attempt(uuid, ("nvmlDeviceGetSerial",), handle)
        return DeviceInfo(
            uuid=uuid, index=index, minor=minor if isinstance(minor, int) else -1,
            pci_bus_id=bus_id,
            model=decode_text(self._identity(uuid, "nvmlDeviceGetName", handle)),
            serial="" if isinstance(serial, Unsupported | Failed) else decode_text(serial),
            memory_bytes=int(memory.total),
            compute_capability=(0, 0) if isinstance(capability, Unsupported | Failed) else (
                int(capability[0]), int(capability[1])),
            numa_node=self._numa_node(uuid, handle, bus_id),
            mig_enabled=current, mig_pending=pending != current,
        )

    def _identity(self, uuid: str, function: str, handle: Any) -> Any:
        result = self._calls.attempt(uuid, (function,), handle)
        if isinstance(result, Unsupported | Failed):
            raise _Unidentified(f"{uuid}: {function}: {result}")
        return result

    def _numa_node(self, uuid: str, handle: Any, bus_id: str) -> int:
        """NVML's NUMA node, else sysfs' (as NVIDIA's Go tools read it), else -1."""
        node = self._calls.reading(uuid, ("nvmlDeviceGetNumaNodeId",), handle)
        if isinstance(node, int) and node >= 0:
            return node
        path = self._sysfs_root / "bus" / "pci" / "devices" / bus_id / "numa_node"
        try:
            return max(-1, int(path.read_text(encoding="ascii").strip()))
        except (OSError, ValueError):
            return -1

    def _links_of(self, uuid: str, handle: Any) -> tuple[int, ...]:
        """The NVLink indices a GPU has, probed once per start (up or down, they exist)."""
        with self._lock:
            known = self._links.get(uuid)
        if known is not None:
            return known
        links, final = probe_links(self._calls, uuid, handle)
        if final:
            with self._lock:
                self._links[uuid] = links
        return links

    def _process_list(self, uuid: str, functions: tuple[str, ...], handle: Any, *,
                      required: bool) -> list[Any]:
        result = self._calls.attempt(uuid, functions, handle)
        if isinstance(result, Unsupported) and not required:
            return []
        if isinstance(result, Unsupported):
            raise ReadFailed(uuid, NvmlCode.NOT_SUPPORTED, f"{functions[0]}: not supported")
        if isinstance(result, Failed):
            raise ReadFailed(uuid, result.code, f"{functions[0]}: {result.message}")
        return list(result)

    # Topology.

    def _topology_members(self, notes: list[str]) -> tuple[dict[str, _Member], bool]:
        """The answering GPUs with their bus ids and NVLink far ends, and whether any of them
        reaches an NVSwitch."""
        members: dict[str, _Member] = {}
        nvswitch = False
        for _, uuid, handle in self._enumerate():
            try:
                bus_id = _bus_id(uuid, self._identity(uuid, "nvmlDeviceGetPciInfo", handle).busId)
                remotes, reaches_switch = self._link_remotes(uuid, handle)
            except (GpuGone, _Unidentified) as error:
                notes.append(f"{uuid} left out: {error}")
                continue
            members[uuid] = _Member(handle, bus_id, tuple(remotes))
            nvswitch = nvswitch or reaches_switch
        return members, nvswitch

    def _link_remotes(self, uuid: str, handle: Any) -> tuple[list[str], bool]:
        remotes: list[str] = []
        reaches_switch = False
        for link in self._links_of(uuid, handle):
            state = self._calls.reading(uuid, ("nvmlDeviceGetNvLinkState",), handle, link,
                                        link_probe=True)
            if state != abi.FEATURE_ENABLED:
                continue
            kind = self._calls.reading(uuid, ("nvmlDeviceGetNvLinkRemoteDeviceType",), handle,
                                       link, link_probe=True)
            if kind == abi.NVLINK_DEVICE_SWITCH:
                reaches_switch = True
                continue
            if kind == abi.NVLINK_DEVICE_IBMNPU:
                continue
            remote = self._calls.attempt(uuid, ("nvmlDeviceGetNvLinkRemotePciInfo",), handle,
                                         link, link_probe=True)
            if not isinstance(remote, Unsupported | Failed):
                remotes.append(_bus_id(uuid, remote.busId))
        return remotes, reaches_switch

    def _level(self, uuid_a: str, handle_a: Any, uuid_b: str, handle_b: Any,
               notes: list[str]) -> int:
        """NVML's topology level of a pair; the farthest (SYSTEM) when it cannot be read."""
        try:
            level = self._calls.reading(uuid_a, ("nvmlDeviceGetTopologyCommonAncestor",),
                                        handle_a, handle_b)
        except GpuGone as error:
            level = Failed(error.code, error.message)
        if isinstance(level, int):
            return level
        notes.append(f"{uuid_a} / {uuid_b}: topology level unknown ({level}), taken as SYSTEM")
        return abi.TOPOLOGY_SYSTEM

    # Events.

    def _register_events(self, found: list[tuple[int, str, Any]]) -> Any:
        """One event set, each GPU registered for the health events it supports; None where
        the platform has no events (then `wait_event` only waits)."""
        try:
            event_set = self._calls.call(("nvmlEventSetCreate",))
        except NvmlCallError as error:
            _raise_if_nvml_is_gone(error)
            return None
        self._register_gpus(event_set, found)
        return event_set

    def _register_gpus(self, event_set: Any, found: list[tuple[int, str, Any]]) -> None:
        """Register the GPUs of `found` not registered yet; one whose registration failed
        for another reason than lacking events (or the privileges for them) is tried again at
        the next `devices()`."""
        for _, uuid, handle in found:
            with self._lock:
                if uuid in self._watched:
                    continue
            try:
                supported = int(self._calls.call(("nvmlDeviceGetSupportedEventTypes",), handle))
                if supported & abi.HEALTH_EVENTS:
                    self._calls.call(("nvmlDeviceRegisterEvents",), handle,
                                     supported & abi.HEALTH_EVENTS, event_set)
            except NvmlCallError as error:
                _raise_if_nvml_is_gone(error)
                if (classify(error.code) is not ErrorClass.CAPABILITY_ABSENT
                        and error.code != NvmlCode.NO_PERMISSION):
                    continue  # transient, or the GPU is gone: again once it answers
            with self._lock:
                if self._event_set is None or self._event_set is event_set:  # not replaced
                    self._watched.add(uuid)  # by a rebuild (None: start() is making it)

    def _wait_once(self, timeout_ms: int) -> Any:
        """One NVML wait: the event data, or None when it ended with Timeout."""
        with self._event_lock:
            with self._lock:
                if not self._started:
                    raise NvmlUnavailable(NvmlCode.UNINITIALIZED, "NvmlBackend is not started")
                event_set = self._event_set
            if event_set is not None:
                try:
                    data = self._calls.call(("nvmlEventSetWait",), event_set, timeout_ms)
                except NvmlCallError as error:
                    if error.code == NvmlCode.TIMEOUT:
                        self._wait_ok()
                        return None
                    self._wait_failed(error)
                    _raise_if_node_fault(error)
                    raise EventWaitFailed(error.code, error.message) from error
                self._wait_ok()
                return data
        self._stopping.wait(timeout_ms / 1000)
        return None

    def _wait_ok(self) -> None:
        """A wait ended with an event or Timeout: the set serves, failures start over."""
        self._wait_failures, self._rebuild_after = 0, EVENT_SET_REBUILD_FAILURES

    def _wait_failed(self, error: NvmlCallError) -> None:
        """One more failed wait in a row (`_event_lock` held): at the end of the run, the
        event set is made again and the next run is twice as long (up to the max)."""
        self._wait_failures += 1
        if self._wait_failures < self._rebuild_after:
            return
        self.event_set_rebuilds += 1
        logger.warning("%d event waits failed in a row, the last with %s: making the event set "
                       "again (rebuild %d)", self._wait_failures, error, self.event_set_rebuilds)
        self._wait_failures = 0
        self._rebuild_after = min(self._rebuild_after * 2, EVENT_SET_REBUILD_FAILURES_MAX)
        self._rebuild_event_set()

    def _rebuild_event_set(self) -> None:
        """A new event set in place of the current one (`_event_lock` held), every answering
        GPU registered in it, the old one freed; the old one stays when no new one can be made.
        Raises NvmlUnavailable when NVML itself is gone (the poll loop starts it again)."""
        found = self._enumerate()
        try:
            event_set = self._calls.call(("nvmlEventSetCreate",))
        except NvmlCallError as error:
            _raise_if_nvml_is_gone(error)
            logger.warning("cannot make a new event set (%s): waiting on the old one", error)
            return
        with self._lock:
            old, self._event_set = self._event_set, event_set
            self._watched = set()
        with contextlib.suppress(NvmlCallError):
            self._calls.call(("nvmlEventSetFree",), old)
        self._register_gpus(event_set, found)

    def _event(self, data: Any) -> GpuEvent:
        payload = int(data.eventData)
        kind = abi.event_kind(int(data.eventType))
        return GpuEvent(
            uuid=self._uuid_of(data.device), kind=kind,
            xid=payload if kind is EventKind.XID else None, data=payload,
            gpu_instance=int(data.gpuInstanceId), compute_instance=int(data.computeInstanceId))

    def _uuid_of(self, handle: Any) -> str:
        address = handle_address(handle)
        with self._lock:
            uuid = self._uuid_by_address.get(address) if address is not None else None
        if uuid is not None:
            return uuid
        try:
            return decode_text(self._calls.call(("nvmlDeviceGetUUID",), handle))
        except NvmlCallError as error:
            raise EventWaitFailed(error.code, "an event came from a GPU whose UUID cannot be "
                                  f"read: {error.message}") from error

