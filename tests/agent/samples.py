"""Test helpers for the health policy: a healthy H100-like GPU's properties and sample, with
overrides, and `Feed`, which drives a HealthTracker with a clock that advances one poll at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from agent.gpu import DeviceInfo, DeviceSample, EventKind, GpuEvent, NvLinkSample, Reading
from agent.health import HealthTracker
from agent.health_model import Incident, Verdict
from agent.health_policy import HealthPolicy

GPU = "GPU-11111111-2222-3333-4444-555555555555"
OTHER_GPU = "GPU-99999999-2222-3333-4444-555555555555"
POLL_MS = 5000


def device_info(uuid: str = GPU, **overrides: Any) -> DeviceInfo:
    info = DeviceInfo(uuid=uuid, index=0, minor=0, pci_bus_id="0000:3b:00.0",
                      model="NVIDIA H100 80GB HBM3", serial="1650000000001",
                      memory_bytes=80 << 30, compute_capability=(9, 0), numa_node=0,
                      mig_enabled=False, mig_pending=False)
    return replace(info, **overrides)


def nvlink(link: int, *, up: bool = True, replay: Reading = 0, recovery: Reading = 0,
           crc_flit: Reading = 0, crc_data: Reading = 0) -> NvLinkSample:
    return NvLinkSample(link=link, up=up, replay_errors=replay, recovery_errors=recovery,
                        crc_flit_errors=crc_flit, crc_data_errors=crc_data)


def clean_sample(uuid: str = GPU, **overrides: Any) -> DeviceSample:
    """A healthy GPU at rest: ECC on and clean, cool, no events; counters at `overrides`."""
    sample = DeviceSample(
        uuid=uuid, temperature_c=40, slowdown_temperature_c=90, shutdown_temperature_c=95,
        power_mw=100_000, power_limit_mw=700_000, energy_mj=1_000_000, sm_clock_mhz=1980,
        memory_clock_mhz=2619, utilization_pct=0, memory_used_bytes=0,
        memory_free_bytes=80 << 30, clock_event_mask=0x1, ecc_enabled=1,
        ecc_volatile_corrected=0, ecc_volatile_uncorrected=0, ecc_aggregate_corrected=0,
        ecc_aggregate_uncorrected=0, retired_pages_sbe=0, retired_pages_dbe=0,
        retired_pages_pending=0, remapped_rows_correctable=0, remapped_rows_uncorrectable=0,
        remap_pending=0, remap_failure=0, recovery_action=0, pcie_replays=0, pcie_generation=5,
        pcie_generation_max=5, pcie_width=16, pcie_width_max=16, thermal_violation_ns=0,
        power_violation_ns=0)
    return replace(sample, **overrides)


@dataclass
class Feed:
    """A tracker and a clock: each observation first advances the clock by `poll_ms`."""

    tracker: HealthTracker
    uuid: str = GPU
    now_ms: int = 0
    poll_ms: int = POLL_MS
    base: dict[str, Any] = field(default_factory=dict)  # overrides every sample starts from

    def tick(self) -> int:
        self.now_ms += self.poll_ms
        return self.now_ms

    def sample(self, **overrides: Any) -> Verdict:
        self.tracker.observe_sample(clean_sample(self.uuid, **{**self.base, **overrides}),
                                    self.tick())
        return self.verdict()

    def samples(self, count: int, **overrides: Any) -> Verdict:
        for _ in range(count):
            self.sample(**overrides)
        return self.verdict()

    def event(self, kind: EventKind, xid: int | None = None, **fields: Any) -> Verdict:
        self.tracker.observe_event(GpuEvent(uuid=self.uuid, kind=kind, xid=xid, **fields),
                                   self.tick())
        return self.verdict()

    def xid(self, xid: int, **fields: Any) -> Verdict:
        return self.event(EventKind.XID, xid, **fields)

    def verdict(self) -> Verdict:
        return next(v for v in self.tracker.verdicts() if v.uuid == self.uuid)

    def incident(self, code: str) -> Incident | None:
        return next((i for i in self.verdict().incidents if i.code == code), None)

    def codes(self) -> list[str]:
        return sorted(incident.code for incident in self.verdict().incidents)


def feed(policy: HealthPolicy | None = None, *, sampled: bool = True,
         devices: tuple[DeviceInfo, ...] | None = None, **base: Any) -> Feed:
    """A Feed on one GPU (or `devices`), sampled once clean unless `sampled` is False."""
    tracker = HealthTracker(policy or HealthPolicy(), devices or (device_info(),))
    result = Feed(tracker, base=dict(base))
    if sampled:
        result.sample()
    return result
