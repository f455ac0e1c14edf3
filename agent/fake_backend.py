"""`FakeGpuBackend`: a node's GPUs in memory, for tests and simulations without a GPU.

It answers the `GpuBackend` calls the way `NvmlBackend` does over real NVML, and scenario
controls (`inject_xid`, `raise_ecc`, `lose`, `overheat`, ...) change what it answers, following
the rules of reference/nvml.md §4.3 (see `agent.fake_gpu` for one GPU's rules):

- `wait_event` really blocks until an event or the timeout, and wakes as soon as another thread
  injects one; it never returns early with nothing;
- events reach it only for the bits the GPU supports and the agent registers (HEALTH_EVENTS),
  and only while started: like NVML, nothing from before `start()` is replayed;
- after `lose(uuid)` (which first queues XID 79, as drivers do) every call on that GPU raises
  `GpuGone`, `devices()` and `topology()` leave it out, and the other GPUs keep answering;
- `fail_start(code)` and `driver_missing()` make `start()` raise `NvmlUnavailable`; a driver
  that goes missing while started makes every later call raise it too.

Build one with `from_profile` (agent.gpu_profiles) or `from_snapshot` (a recorded machine). All
methods are thread-safe: one lock guards the state, and its condition wakes event waiters.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping
from typing import Final

from agent import nvml_abi as abi
from agent.fake_gpu import SimulatedGpu
from agent.gpu import (
    WHOLE_DEVICE,
    DeviceInfo,
    DeviceSample,
    DriverInfo,
    EventKind,
    Fabric,
    Failed,
    GpuEvent,
    GpuGone,
    GpuPair,
    GpuProcess,
    NvmlCode,
    NvmlUnavailable,
    Topology,
)
from agent.gpu_profiles import build_profile
from agent.gpu_snapshot import Json, NodeSnapshot, decode, encode, link_peers
from agent.nvml_policy import ErrorClass, classify, describe

OVERHEAT_VIOLATION_MS: Final = 1000


class FakeGpuBackend:
    def __init__(self, snapshot: NodeSnapshot) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._driver = snapshot.driver
        peers = link_peers(snapshot)
        self._gpus = {device.info.uuid: SimulatedGpu(device, peers[device.info.uuid])
                      for device in snapshot.devices}
        self._levels = {(pair.uuid_a, pair.uuid_b): pair.level
                        for pair in snapshot.topology.pairs}
        self._nvswitch = snapshot.topology.nvswitch
        self._notes = snapshot.topology.notes
        self._events: collections.deque[GpuEvent] = collections.deque()
        self._registered: dict[str, int] = {}
        self._started = False
        self._start_failure: int | None = None
        self._driver_missing = False

    @classmethod
    def from_profile(cls, name: str, *, seed: int = 0) -> FakeGpuBackend:
        """A node built to one of agent.gpu_profiles.PROFILE_NAMES."""
        return cls(build_profile(name, seed))

    @classmethod
    def from_snapshot(cls, document: Mapping[str, object]) -> FakeGpuBackend:
        """A node replaying a snapshot document (agent.gpu_snapshot's JSON)."""
        return cls(decode(document))

    def snapshot(self) -> Json:
        """Everything this node would report now, as a snapshot document (lost GPUs, which
        report nothing, are left out)."""
        with self._changed:
            devices = tuple(gpu.snapshot() for gpu in self._ordered() if not gpu.lost)
            topology = self._topology_locked()
        return encode(NodeSnapshot(self._driver, devices, topology))

    def uuids(self) -> tuple[str, ...]:
        """Every GPU's UUID in index order, lost ones included."""
        with self._changed:
            return tuple(gpu.info.uuid for gpu in self._ordered())

    # GpuBackend.

    def start(self) -> None:
        with self._changed:
            if self._driver_missing:
                code = NvmlCode.LIBRARY_NOT_FOUND
                raise NvmlUnavailable(code, describe(code))
            if self._start_failure is not None:
                raise NvmlUnavailable(self._start_failure, describe(self._start_failure))
            if not self._started:
                self._started = True
                self._events.clear()
                self._registered = {uuid: gpu.supported_events & abi.HEALTH_EVENTS
                                    for uuid, gpu in self._gpus.items() if not gpu.lost}

    def stop(self) -> None:
        with self._changed:
            self._started = False
            self._events.clear()
            self._changed.notify_all()

    def driver(self) -> DriverInfo:
        with self._changed:
            self._check_running()
            return self._driver

    def devices(self) -> tuple[DeviceInfo, ...]:
        with self._changed:
            self._check_running()
            return tuple(gpu.info for gpu in self._ordered() if not gpu.lost)

    def sample(self, uuid: str) -> DeviceSample:
        with self._changed:
            return self._answering(uuid).sample()

    def processes(self, uuid: str) -> tuple[GpuProcess, ...]:
        with self._changed:
            return self._answering(uuid).processes()

    def topology(self) -> Topology:
        with self._changed:
            self._check_running()
            return self._topology_locked()

    def wait_event(self, timeout_ms: int) -> GpuEvent | None:
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must be >= 0, not {timeout_ms}")
        deadline = time.monotonic() + timeout_ms / 1000
        with self._changed:
            while True:
                self._check_running()
                if self._events:
                    return self._events.popleft()
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    return None
                self._changed.wait(remaining_s)

    # Scenario controls: events.

    def inject_xid(self, uuid: str, xid: int, *, gpu_instance: int = WHOLE_DEVICE,
                   compute_instance: int = WHOLE_DEVICE) -> None:
        """The driver reports XID `xid` on this GPU (delivered if XID events are registered)."""
        with self._changed:
            self._emit(self._gpu(uuid), abi.EVENT_XID, GpuEvent(
                uuid, EventKind.XID, xid, xid, gpu_instance, compute_instance))

    def xid_storm(self, uuid: str, xid: int, count: int) -> None:
        """`count` XID events in a row, each delivered separately as on Linux."""
        for _ in range(count):
            self.inject_xid(uuid, xid)

    # Scenario controls: memory.

    def raise_ecc(self, uuid: str, *, corrected: int = 0, uncorrected: int = 0) -> None:
        """ECC errors: volatile and aggregate counts rise; a single-bit event for corrected
        ones, a double-bit event and XID 48 for uncorrected ones (where ECC exists)."""
        with self._changed:
            gpu = self._gpu(uuid)
            if not gpu.supports("ecc_volatile_corrected"):
                return
            for field in ("ecc_volatile_corrected", "ecc_aggregate_corrected"):
                gpu.grow(field, corrected)
            for field in ("ecc_volatile_uncorrected", "ecc_aggregate_uncorrected"):
                gpu.grow(field, uncorrected)
            if corrected:
                self._emit(gpu, abi.EVENT_SINGLE_BIT_ECC,
                           GpuEvent(uuid, EventKind.SINGLE_BIT_ECC, None, corrected))
            if uncorrected:
                self._emit(gpu, abi.EVENT_DOUBLE_BIT_ECC,
                           GpuEvent(uuid, EventKind.DOUBLE_BIT_ECC, None, uncorrected))
                self._emit_xid(gpu, abi.XID_DOUBLE_BIT_ECC)

    def row_remap_pending(self, uuid: str) -> None:
        """An uncorrectable row was remapped; it takes effect at the next reset (XID 63)."""
        with self._changed:
            gpu = self._gpu(uuid)
            if gpu.supports("remap_pending"):
                gpu.grow("remapped_rows_uncorrectable", 1)
                gpu.set("remap_pending", 1)
                self._emit_xid(gpu, abi.XID_ROW_REMAP_PENDING)

    def row_remap_failure(self, uuid: str) -> None:
        """Row remapping failed: the RMA criterion (XID 64)."""
        with self._changed:
            gpu = self._gpu(uuid)
            if gpu.supports("remap_failure"):
                gpu.set("remap_failure", 1)
                self._emit_xid(gpu, abi.XID_ROW_REMAP_FAILURE)

    # Scenario controls: the GPU as a whole.

    def lose(self, uuid: str) -> None:
        """The GPU falls off the bus: XID 79 first, then every call on it raises GpuGone."""
        with self._changed:
            gpu = self._gpu(uuid)
            if not gpu.lost:
                self._emit_xid(gpu, abi.XID_FALLEN_OFF_BUS)
                gpu.lost = True

    def recover(self, uuid: str) -> None:
        """A lost GPU comes back after a reset (its processes died with it)."""
        with self._changed:
            gpu = self._gpu(uuid)
            for process in gpu.processes():
                gpu.remove_process(process.pid)
            gpu.lost = False
            gpu.reset()
            if self._started:
                self._registered[uuid] = gpu.supported_events & abi.HEALTH_EVENTS

    def reset(self, uuid: str) -> None:
        """A GPU reset (needs the GPU idle): volatile counters, pending flags and NVLinks clear,
        a pending MIG mode applies. A lost GPU stays lost: see `recover`."""
        with self._changed:
            self._answering(uuid, node_checks=False).reset()

    def set_mig_mode(self, uuid: str, enabled: bool) -> None:
        """Ask for MIG on or off; it applies at the next `reset`."""
        with self._changed:
            self._gpu(uuid).set_mig_mode(enabled)

    def set_fabric(self, uuid: str, state: Fabric) -> None:
        with self._changed:
            self._gpu(uuid).set_fabric(state)

    # Scenario controls: thermal and time.

    def overheat(self, uuid: str, temperature_c: int | None = None) -> None:
        """Temperature at or above slowdown (2 C above it by default), the HW thermal
        slowdown clock-event bit set, and thermal violation time growing."""
        with self._changed:
            self._gpu(uuid).overheat(temperature_c)

    def cool(self, uuid: str) -> None:
        """Back to the profile's temperature, thermal clock-event bits clear."""
        with self._changed:
            self._gpu(uuid).cool()

    def advance(self, elapsed_ms: int) -> None:
        """Time passes on every GPU: energy and violation counters grow."""
        with self._changed:
            for gpu in self._gpus.values():
                gpu.advance(elapsed_ms)

    # Scenario controls: NVLink.

    def nvlink_errors(self, uuid: str, link: int, *, replay: int = 0, recovery: int = 0,
                      crc: int = 0) -> None:
        """Error counters of one link grow (CRC as flit errors)."""
        with self._changed:
            counters = self._gpu(uuid).link(link).counters
            for name, amount in (("replay_errors", replay), ("recovery_errors", recovery),
                                 ("crc_flit_errors", crc)):
                reading = counters[name]
                if isinstance(reading, int):
                    counters[name] = reading + amount

    def nvlink_down(self, uuid: str, link: int) -> None:
        """One link goes down until the next reset."""
        with self._changed:
            self._gpu(uuid).link(link).up = False

    # Scenario controls: the driver.

    def driver_missing(self) -> None:
        """The NVIDIA driver is gone: `start()` raises NvmlUnavailable (LibraryNotFound); if
        started, every later call raises NvmlUnavailable (DriverNotLoaded)."""
        with self._changed:
            self._driver_missing = True
            self._changed.notify_all()

    def fail_start(self, code: int) -> None:
        """`start()` raises NvmlUnavailable(code): 12 no driver, 9 module not loaded, 18 version
        mismatch after an upgrade, 4 no permission."""
        if classify(code) is not ErrorClass.NODE_FAULT:
            raise ValueError(f"NVML code {code} does not stop NVML from starting")
        with self._changed:
            self._start_failure = code

    def restore_driver(self) -> None:
        """Undo `driver_missing` and `fail_start`."""
        with self._changed:
            self._driver_missing = False
            self._start_failure = None

    # Scenario controls: single readings and processes.

    def set(self, uuid: str, field: str, value: int) -> None:
        """Set one DeviceSample reading (refused for one the GPU lacks, or for an aggregate
        counter going down); clears a failure set by `fail`."""
        with self._changed:
            self._gpu(uuid).set(field, value)

    def unsupported(self, uuid: str, field: str) -> None:
        """From now on the GPU lacks this signal."""
        with self._changed:
            self._gpu(uuid).unsupported(field)

    def fail(self, uuid: str, field: str, code: int) -> None:
        """Reading this signal fails with a transient NVML code until `set` gives it a value."""
        if classify(code) is not ErrorClass.TRANSIENT:
            raise ValueError(f"NVML code {code} is not transient: use lose, unsupported or "
                             "driver_missing")
        with self._changed:
            self._gpu(uuid).fail(field, Failed(code, describe(code)))

    def add_process(self, uuid: str, pid: int, used_bytes: int | None) -> None:
        with self._changed:
            self._gpu(uuid).add_process(pid, used_bytes)

    def remove_process(self, uuid: str, pid: int) -> None:
        with self._changed:
            self._gpu(uuid).remove_process(pid)

    # Internals; the lock is held.

    def _ordered(self) -> list[SimulatedGpu]:
        return sorted(self._gpus.values(), key=lambda gpu: gpu.info.index)

    def _check_running(self) -> None:
        if self._driver_missing:
            code = NvmlCode.DRIVER_NOT_LOADED
            raise NvmlUnavailable(code, describe(code))
        if not self._started:
            raise NvmlUnavailable(NvmlCode.UNINITIALIZED, "NVML is not started")

    def _gpu(self, uuid: str) -> SimulatedGpu:
        """The GPU a scenario control names; naming none is a mistake in the test."""
        if uuid not in self._gpus:
            raise ValueError(f"no GPU {uuid!r} in this fake node")
        return self._gpus[uuid]

    def _answering(self, uuid: str, *, node_checks: bool = True) -> SimulatedGpu:
        """The GPU a backend call names, as NVML would answer for it."""
        if node_checks:
            self._check_running()
        gpu = self._gpus.get(uuid)
        if gpu is None:
            raise GpuGone(uuid, NvmlCode.NOT_FOUND, "no GPU with this UUID on this node")
        if gpu.lost:
            raise GpuGone(uuid, NvmlCode.GPU_IS_LOST, describe(NvmlCode.GPU_IS_LOST))
        return gpu

    def _emit(self, gpu: SimulatedGpu, event_type: int, event: GpuEvent) -> None:
        if self._started and not gpu.lost and self._registered.get(gpu.info.uuid, 0) & event_type:
            self._events.append(event)
            self._changed.notify_all()

    def _emit_xid(self, gpu: SimulatedGpu, xid: int) -> None:
        self._emit(gpu, abi.EVENT_XID, GpuEvent(gpu.info.uuid, EventKind.XID, xid, xid))

    def _topology_locked(self) -> Topology:
        answering = sorted(uuid for uuid, gpu in self._gpus.items() if not gpu.lost)
        pairs = []
        for position, uuid_a in enumerate(answering):
            peers = self._gpus[uuid_a].live_peers()
            for uuid_b in answering[position + 1:]:
                level = self._levels.get((uuid_a, uuid_b), abi.TOPOLOGY_SYSTEM)
                pairs.append(GpuPair(uuid_a, uuid_b, level, peers.count(uuid_b)))
        return Topology(tuple(pairs), self._nvswitch and bool(answering), self._notes)
