"""The agent's /metrics page: per-GPU telemetry under dcgm-exporter's names, units and labels,
so existing GPU dashboards and alert rules work unchanged, plus the agent's own series.

Telemetry (gauges unless marked): DCGM_FI_DEV_GPU_TEMP (C), DCGM_FI_DEV_POWER_USAGE (W),
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ, counter), DCGM_FI_DEV_SM_CLOCK and _MEM_CLOCK (MHz),
DCGM_FI_DEV_GPU_UTIL (%), DCGM_FI_DEV_FB_USED and _FB_FREE (MiB), the ECC, retired-page,
remapped-row, PCIe-replay and NVLink error counters, the violation times (ns) and
DCGM_FI_DEV_XID_ERRORS (the last XID seen: a value, not a count). A signal the GPU does not
offer is left out, never shown as 0; so are the readings of a GPU that fell off the bus or of a
node whose NVML is away (not their last values, frozen), and an NVLink total while one link's
counter failed to read (a smaller sum would be a counter going backwards). Labels: gpu, UUID,
pci_bus_id, device, modelName, Hostname; device is nvidia<gpu> as dcgm-exporter writes it (its
GPU id, not the /dev minor number).

The agent's own: gpu_agent_health_status{UUID,health_watch} (0 pass, 10 warn, 20 fail, -1
unknown, as DCGM_EXP_GPU_HEALTH_STATUS), gpu_agent_xid_errors_total{UUID,xid} and
gpu_agent_xid_last_timestamp_seconds, gpu_agent_gpu_allocated{UUID}, gpu_agent_nvml_up,
gpu_agent_last_collect_success_timestamp_seconds, gpu_agent_tls_cert_seconds_left (until the
certificate the agent presents ends, negative once it has; absent on plain TCP) and counters of
the agent's work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from agent.gpu import DeviceInfo, DeviceSample, Failed, Reading, value_of
from agent.units import MIB
from statemachine.commands import HealthStatus

HEALTH_VALUE = {HealthStatus.PASS: 0, HealthStatus.WARN: 10, HealthStatus.FAIL: 20,
                HealthStatus.UNKNOWN: -1}

# (name, kind, help, reading -> exported value or None)
Telemetry = tuple[str, str, str, Callable[[DeviceSample], float | None]]


def _plain(read: Callable[[DeviceSample], Reading]) -> Callable[[DeviceSample], float | None]:
    return lambda sample: _number(value_of(read(sample)))


def _scaled(read: Callable[[DeviceSample], Reading], divisor: float
            ) -> Callable[[DeviceSample], float | None]:
    def scale(sample: DeviceSample) -> float | None:
        value = value_of(read(sample))
        return None if value is None else value / divisor
    return scale


def _nvlink_total(name: str) -> Callable[[DeviceSample], float | None]:
    """The sum over the links that offer the counter; none while one of them failed to read
    (a smaller sum is a counter going backwards, which rate() takes for a reset and reads as
    every error the links ever had)."""
    def total(sample: DeviceSample) -> float | None:
        readings = [getattr(link, name) for link in sample.nvlinks]
        if any(isinstance(reading, Failed) for reading in readings):
            return None
        known = [value for value in map(value_of, readings) if value is not None]
        return float(sum(known)) if known else None
    return total


def _number(value: int | None) -> float | None:
    return None if value is None else float(value)


TELEMETRY: tuple[Telemetry, ...] = (
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).",
     _plain(lambda s: s.temperature_c)),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", _scaled(lambda s: s.power_mw,
                                                                        1000)),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ).", _plain(lambda s: s.energy_mj)),
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
     _plain(lambda s: s.sm_clock_mhz)),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
     _plain(lambda s: s.memory_clock_mhz)),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).",
     _plain(lambda s: s.utilization_pct)),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
     _scaled(lambda s: s.memory_used_bytes, MIB)),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
     _scaled(lambda s: s.memory_free_bytes, MIB)),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
     _plain(lambda s: s.pcie_replays)),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total single-bit volatile ECC errors.",
     _plain(lambda s: s.ecc_volatile_corrected)),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total double-bit volatile ECC errors.",
     _plain(lambda s: s.ecc_volatile_uncorrected)),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total single-bit persistent ECC errors.",
     _plain(lambda s: s.ecc_aggregate_corrected)),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total double-bit persistent ECC errors.",
     _plain(lambda s: s.ecc_aggregate_uncorrected)),
    ("DCGM_FI_DEV_RETIRED_SBE", "counter", "Total pages retired for single-bit errors.",
     _plain(lambda s: s.retired_pages_sbe)),
    ("DCGM_FI_DEV_RETIRED_DBE", "counter", "Total pages retired for double-bit errors.",
     _plain(lambda s: s.retired_pages_dbe)),
    ("DCGM_FI_DEV_RETIRED_PENDING", "gauge", "Pages pending retirement (1 if any).",
     _plain(lambda s: s.retired_pages_pending)),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Rows remapped for correctable errors.", _plain(lambda s: s.remapped_rows_correctable)),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Rows remapped for uncorrectable errors.",
     _plain(lambda s: s.remapped_rows_uncorrectable)),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed.",
     _plain(lambda s: s.remap_failure)),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether a row remap waits for a reset.",
     _plain(lambda s: s.remap_pending)),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal "
     "constraints (in ns).", _plain(lambda s: s.thermal_violation_ns)),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints "
     "(in ns).", _plain(lambda s: s.power_violation_ns)),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter",
     "Total NVLink flow-control CRC errors.", _nvlink_total("crc_flit_errors")),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter",
     "Total NVLink data CRC errors.", _nvlink_total("crc_data_errors")),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total NVLink retries.",
     _nvlink_total("replay_errors")),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter",
     "Total NVLink recovery errors.", _nvlink_total("recovery_errors")),
)


@dataclass(frozen=True, slots=True)
class GpuHealthView:
    """One GPU's verdict as the page shows it: overall and per health watch."""

    uuid: str
    status: HealthStatus
    watches: tuple[tuple[str, HealthStatus], ...] = ()


@dataclass
class AgentView:
    """Everything the page shows; the daemon keeps it current."""

    node: str
    devices: tuple[DeviceInfo, ...] = ()
    samples: dict[str, DeviceSample] = field(default_factory=dict)
    health: dict[str, GpuHealthView] = field(default_factory=dict)
    last_xid: dict[str, int] = field(default_factory=dict)
    xid_counts: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)
    allocated: set[str] = field(default_factory=set)
    nvml_up: bool = False
    last_collect_s: float = 0.0
    cert_seconds_left: float | None = None  # under TLS
    counters: dict[str, float] = field(default_factory=dict)


def render(view: AgentView) -> str:
    return "".join(line + "\n" for line in _lines(view))


def _lines(view: AgentView) -> Iterator[str]:
    devices = sorted(view.devices, key=lambda device: device.index)
    for name, kind, help_text, read in TELEMETRY:
        rows = [(device, read(view.samples[device.uuid])) for device in devices
                if device.uuid in view.samples]
        yield from _family(name, kind, help_text, [
            (_gpu_labels(device, view.node), value) for device, value in rows
            if value is not None])
    yield from _family("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error seen.", [
        (_gpu_labels(device, view.node), float(view.last_xid[device.uuid]))
        for device in devices if device.uuid in view.last_xid])
    yield from _agent_lines(view, devices)


def _agent_lines(view: AgentView, devices: list[DeviceInfo]) -> Iterator[str]:
    yield from _family("gpu_agent_health_status", "gauge",
                       "Health per watch: 0 pass, 10 warn, 20 fail, -1 unknown.", [
                           ({"UUID": uuid, "health_watch": watch}, float(HEALTH_VALUE[status]))
                           for uuid in sorted(view.health)
                           for watch, status in (("overall", view.health[uuid].status),
                                                 *view.health[uuid].watches)])
    yield from _family("gpu_agent_xid_errors_total", "counter", "XID errors seen, by XID.", [
        ({"UUID": uuid, "xid": str(xid)}, float(count))
        for (uuid, xid), (count, _) in sorted(view.xid_counts.items())])
    yield from _family("gpu_agent_xid_last_timestamp_seconds", "gauge",
                       "When each XID was last seen (Unix time).", [
                           ({"UUID": uuid, "xid": str(xid)}, seen)
                           for (uuid, xid), (_, seen) in sorted(view.xid_counts.items())])
    yield from _family("gpu_agent_gpu_allocated", "gauge", "1 while a job holds the GPU.", [
        ({"UUID": device.uuid}, float(device.uuid in view.allocated)) for device in devices])
    yield from _family("gpu_agent_nvml_up", "gauge", "1 while NVML answers.",
                       [({}, float(view.nvml_up))])
    yield from _family("gpu_agent_last_collect_success_timestamp_seconds", "gauge",
                       "When the GPUs were last read in full (Unix time).",
                       [({}, view.last_collect_s)])
    if view.cert_seconds_left is not None:
        yield from _family("gpu_agent_tls_cert_seconds_left", "gauge",
                           "Seconds until the certificate the agent presents ends (negative "
                           "once it has).", [({}, view.cert_seconds_left)])
    for name in sorted(view.counters):
        yield from _family(f"gpu_agent_{name}", "counter", f"The agent's {name} count.",
                           [({}, view.counters[name])])


def _gpu_labels(device: DeviceInfo, node: str) -> dict[str, str]:
    return {"gpu": str(device.index), "UUID": device.uuid, "pci_bus_id": device.pci_bus_id,
            "device": f"nvidia{device.index}", "modelName": device.model, "Hostname": node}


def _family(name: str, kind: str, help_text: str,
            rows: list[tuple[dict[str, str], float]]) -> Iterator[str]:
    if not rows:
        return
    yield f"# HELP {name} {help_text}"
    yield f"# TYPE {name} {kind}"
    for labels, value in rows:
        yield f"{name}{_labels(labels)} {_value(value)}"


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    body = ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items())
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(value: float) -> str:
    return str(int(value)) if value == int(value) and abs(value) < 1 << 53 else repr(value)
