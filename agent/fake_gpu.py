"""One simulated GPU for `FakeGpuBackend`: what NVML would report for it now, and how faults,
resets and MIG change that, following the rules of reference/nvml.md §4.3:

- a signal the GPU lacks stays UNSUPPORTED whatever happens (`set` refuses it);
- aggregate ECC counts, retired pages and remapped rows only grow;
- a reset clears volatile ECC counts, the energy counter, NVLink error counters and the pending
  flags (retirement, remap, recovery action), brings NVLinks back up and applies a pending MIG
  mode; it needs the GPU idle;
- with MIG on, row remapping reads UNSUPPORTED and every NVLink reads down.

Not thread-safe on its own: `FakeGpuBackend` holds its lock around every call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

from agent import nvml_abi as abi
from agent.gpu import (
    UNSUPPORTED,
    DeviceSample,
    Fabric,
    Failed,
    GpuProcess,
    NvLinkSample,
    Reading,
    Unsupported,
)
from agent.gpu_snapshot import LINK_READING_FIELDS, READING_FIELDS, DeviceSnapshot

MONOTONIC_FIELDS: Final = frozenset({
    "ecc_aggregate_corrected", "ecc_aggregate_uncorrected", "retired_pages_sbe",
    "retired_pages_dbe", "remapped_rows_correctable", "remapped_rows_uncorrectable",
})
CLEARED_ON_RESET: Final = (
    "ecc_volatile_corrected", "ecc_volatile_uncorrected", "energy_mj", "retired_pages_pending",
    "remap_pending", "recovery_action",
)
REMAP_FIELDS: Final = (
    "remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending", "remap_failure",
)
THERMAL_BITS: Final = abi.CLOCK_EVENT_HW_THERMAL | abi.CLOCK_EVENT_SW_THERMAL
NS_PER_MS: Final = 1_000_000


@dataclass(slots=True)
class SimulatedLink:
    index: int
    up: bool
    counters: dict[str, Reading]
    peer: str | None  # the GPU at the far end; None for an NVSwitch


class SimulatedGpu:
    def __init__(self, device: DeviceSnapshot, peers: tuple[str | None, ...]) -> None:
        self.info = device.info
        self.fabric = device.sample.fabric
        self.supported_events = device.supported_events
        self.lost = False
        self._mig_mode_pending = device.info.mig_enabled != device.info.mig_pending
        self._values: dict[str, Reading] = {}
        self._failures: dict[str, Failed] = {}
        for name in READING_FIELDS:
            reading = getattr(device.sample, name)
            self._values[name] = 0 if isinstance(reading, Failed) else reading
            if isinstance(reading, Failed):
                self._failures[name] = reading
        self._nominal_temperature_c = self._values["temperature_c"]
        self.links = [
            SimulatedLink(link.link, link.up,
                          {name: getattr(link, name) for name in LINK_READING_FIELDS}, peer)
            for link, peer in zip(device.sample.nvlinks, peers, strict=True)]
        self._processes = {process.pid: process.used_bytes for process in device.processes}

    # What NVML reports.

    def sample(self) -> DeviceSample:
        readings = {name: self.reading(name) for name in READING_FIELDS}
        links = tuple(NvLinkSample(link.index, link.up and not self.info.mig_enabled,
                                   *(link.counters[name] for name in LINK_READING_FIELDS))
                      for link in self.links)
        return DeviceSample(uuid=self.info.uuid, fabric=self.fabric, nvlinks=links, **readings)

    def reading(self, field: str) -> Reading:
        if field in self._failures:
            return self._failures[field]
        if self.info.mig_enabled and field in REMAP_FIELDS:
            return UNSUPPORTED
        return self._values[field]

    def processes(self) -> tuple[GpuProcess, ...]:
        return tuple(GpuProcess(pid, used) for pid, used in sorted(self._processes.items()))

    def live_peers(self) -> list[str]:
        """The GPUs at the far end of this GPU's NVLinks that are up, one entry per link."""
        if self.info.mig_enabled:
            return []
        return [link.peer for link in self.links if link.up and link.peer is not None]

    def snapshot(self) -> DeviceSnapshot:
        return DeviceSnapshot(self.info, self.sample(), self.processes(), self.supported_events)

    # Changes.

    def supports(self, field: str) -> bool:
        return not isinstance(self._value(field), Unsupported)

    def set(self, field: str, value: int) -> None:
        current = self._value(field)
        if isinstance(current, Unsupported):
            raise ValueError(f"{self.info.uuid} does not support {field}: build another profile")
        if field in MONOTONIC_FIELDS and value < current:
            raise ValueError(f"{field} is an aggregate counter: it only grows ({current})")
        self._values[field] = value
        self._failures.pop(field, None)

    def grow(self, field: str, amount: int) -> None:
        """Add to a counter the GPU has; a signal it lacks stays UNSUPPORTED."""
        current = self._value(field)
        if not isinstance(current, Unsupported):
            self._values[field] = current + amount

    def unsupported(self, field: str) -> None:
        self._value(field)
        self._values[field] = UNSUPPORTED
        self._failures.pop(field, None)

    def fail(self, field: str, failure: Failed) -> None:
        self._value(field)
        self._failures[field] = failure

    def _value(self, field: str) -> int | Unsupported:
        if field not in self._values:
            raise ValueError(f"no reading {field!r}; readings: {', '.join(READING_FIELDS)}")
        value = self._values[field]
        assert not isinstance(value, Failed), "failures live in _failures"
        return value

    def link(self, index: int) -> SimulatedLink:
        for link in self.links:
            if link.index == index:
                return link
        raise ValueError(f"{self.info.uuid} has no NVLink {index}")

    def add_process(self, pid: int, used_bytes: int | None) -> None:
        self._processes[pid] = used_bytes

    def remove_process(self, pid: int) -> None:
        if pid not in self._processes:
            raise ValueError(f"no process {pid} on {self.info.uuid}")
        del self._processes[pid]

    def overheat(self, temperature_c: int | None) -> None:
        slowdown_c = self._value("slowdown_temperature_c")
        threshold_c = None if isinstance(slowdown_c, Unsupported) else slowdown_c
        if temperature_c is None:
            temperature_c = 95 if threshold_c is None else threshold_c + 2
        if threshold_c is not None and temperature_c < threshold_c:
            raise ValueError(f"{temperature_c} C is below the slowdown threshold {threshold_c} C")
        self.set("temperature_c", temperature_c)
        self._set_bits("clock_event_mask", abi.CLOCK_EVENT_HW_THERMAL, on=True)
        self.grow("thermal_violation_ns", 1000 * NS_PER_MS)

    def cool(self) -> None:
        if isinstance(self._nominal_temperature_c, int):
            self.set("temperature_c", self._nominal_temperature_c)
        self._set_bits("clock_event_mask", THERMAL_BITS, on=False)

    def advance(self, elapsed_ms: int) -> None:
        """Let time pass: energy accumulates, and violation time while clocks are held down."""
        power_mw = self._value("power_mw")
        if isinstance(power_mw, int):
            self.grow("energy_mj", power_mw * elapsed_ms // 1000)
        mask = self._value("clock_event_mask")
        if isinstance(mask, int) and mask & THERMAL_BITS:
            self.grow("thermal_violation_ns", elapsed_ms * NS_PER_MS)
        if isinstance(mask, int) and mask & abi.CLOCK_EVENT_SW_POWER_CAP:
            self.grow("power_violation_ns", elapsed_ms * NS_PER_MS)

    def _set_bits(self, field: str, bits: int, *, on: bool) -> None:
        mask = self._value(field)
        if isinstance(mask, int):
            self._values[field] = mask | bits if on else mask & ~bits

    def set_mig_mode(self, enabled: bool) -> None:
        """Ask for a MIG mode: it is pending until the next reset."""
        self._mig_mode_pending = enabled
        self.info = dataclasses.replace(
            self.info, mig_pending=self.info.mig_enabled != enabled)

    def reset(self) -> None:
        if self._processes:
            raise ValueError(f"{self.info.uuid} is in use by pids {sorted(self._processes)}: "
                             "a GPU resets only when idle")
        for field in CLEARED_ON_RESET:
            if self.supports(field):
                self._values[field] = 0
        for link in self.links:
            link.up = True
            for name, reading in link.counters.items():
                if not isinstance(reading, Unsupported):
                    link.counters[name] = 0
        self.info = dataclasses.replace(self.info, mig_enabled=self._mig_mode_pending,
                                        mig_pending=False)

    def set_fabric(self, state: Fabric) -> None:
        self.fabric = state
