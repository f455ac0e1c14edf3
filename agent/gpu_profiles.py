"""Built-in node profiles for the fakes: what NVML reports on a few common machines, as
snapshots (`agent.gpu_snapshot.NodeSnapshot`) that `FakeGpuBackend` and the tests' `FakePynvml`
both replay.

Model names are NVML's (`nvmlDeviceGetName`), which is what cluster configurations are matched
against. Which signals a model lacks follows reference/nvml.md §4.1 (retired pages are
NotSupported from Ampere on, consumer boards have no ECC, row remapping or recovery action);
other figures (clocks, temperatures, PCIe layouts) are plausible, not measured. UUIDs and serials
come from `random.Random` seeded with the profile name and the seed, so a profile is the same
on every run.

- `h100-8`: 8 x H100 SXM behind NVSwitches (18 NVLinks each, fabric COMPLETED), two sockets;
- `a100-8`: 8 x A100 SXM4 behind NVSwitches (12 NVLinks each, no fabric state), PCIe switch pairs;
- `pcie-2`: 2 x L40S on PCIe, one per socket, no NVLink;
- `nvbridge-2`: 2 x A100 PCIe joined by NVLink bridges (12 links between them);
- `consumer-no-ecc`: 1 x GeForce RTX 4090: no ECC, no row remapping, no serial, no NUMA node;
- `no-gpu`: NVML works and sees no GPU.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

from agent import nvml_abi as abi
from agent.gpu import (
    UNSUPPORTED,
    DeviceInfo,
    DeviceSample,
    DriverInfo,
    Fabric,
    GpuPair,
    NvLinkSample,
    Reading,
    Topology,
)
from agent.gpu_snapshot import DeviceSnapshot, NodeSnapshot
from agent.units import MIB

DRIVER: Final = DriverInfo("550.90.07", "12.550.90.07", 12040)
DATACENTER_EVENTS: Final = (
    abi.EVENT_SINGLE_BIT_ECC | abi.EVENT_DOUBLE_BIT_ECC | abi.EVENT_PSTATE | abi.EVENT_XID
    | abi.EVENT_CLOCK | abi.EVENT_GPU_UNAVAILABLE | abi.EVENT_RECOVERY_ACTION
)
CONSUMER_EVENTS: Final = abi.EVENT_PSTATE | abi.EVENT_XID | abi.EVENT_CLOCK


@dataclass(frozen=True, slots=True)
class GpuModel:
    """One GPU model as NVML shows it; False or None means NVML answers NotSupported."""

    name: str
    memory_bytes: int
    compute_capability: tuple[int, int]
    power_limit_mw: int
    idle_power_mw: int
    sm_clock_mhz: int
    memory_clock_mhz: int
    pcie_generation: int
    slowdown_temperature_c: int | None
    shutdown_temperature_c: int | None
    nvlinks: int
    ecc: bool
    row_remapping: bool
    datacenter: bool  # recovery action, violation counters, serial number
    fabric: Fabric
    supported_events: int


H100_SXM: Final = GpuModel(
    "NVIDIA H100 80GB HBM3", 81559 * MIB, (9, 0), 700_000, 72_000, 345, 2619, 5, 87, 92, 18,
    ecc=True, row_remapping=True, datacenter=True, fabric=Fabric.COMPLETED,
    supported_events=DATACENTER_EVENTS)
A100_SXM: Final = GpuModel(
    "NVIDIA A100-SXM4-80GB", 81920 * MIB, (8, 0), 400_000, 61_000, 210, 1593, 4, 92, 95, 12,
    ecc=True, row_remapping=True, datacenter=True, fabric=Fabric.NOT_SUPPORTED,
    supported_events=DATACENTER_EVENTS)
A100_PCIE: Final = GpuModel(
    "NVIDIA A100 80GB PCIe", 81920 * MIB, (8, 0), 300_000, 45_000, 210, 1512, 4, 92, 95, 12,
    ecc=True, row_remapping=True, datacenter=True, fabric=Fabric.NOT_SUPPORTED,
    supported_events=DATACENTER_EVENTS)
L40S: Final = GpuModel(
    "NVIDIA L40S", 46068 * MIB, (8, 9), 350_000, 33_000, 210, 9001, 4, 88, 93, 0,
    ecc=True, row_remapping=True, datacenter=True, fabric=Fabric.NOT_SUPPORTED,
    supported_events=DATACENTER_EVENTS)
RTX_4090: Final = GpuModel(
    "NVIDIA GeForce RTX 4090", 24564 * MIB, (8, 9), 450_000, 21_000, 210, 405, 4, 87, 90, 0,
    ecc=False, row_remapping=False, datacenter=False, fabric=Fabric.NOT_SUPPORTED,
    supported_events=CONSUMER_EVENTS)


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """Where a node's GPUs sit: PCI bus number, NUMA node (-1 unknown) and PCIe switch each."""

    model: GpuModel
    buses: tuple[int, ...]
    numa_nodes: tuple[int, ...]
    switches: tuple[int, ...]
    switch_level: int = abi.TOPOLOGY_MULTIPLE  # two GPUs under the same PCIe switch
    nvswitch: bool = False  # every NVLink goes to an NVSwitch; otherwise to the paired GPU


LAYOUTS: Final = {
    "h100-8": NodeLayout(H100_SXM, (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB),
                         (0, 0, 0, 0, 1, 1, 1, 1), tuple(range(8)), nvswitch=True),
    "a100-8": NodeLayout(A100_SXM, (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD),
                         (0, 0, 0, 0, 1, 1, 1, 1), (0, 0, 1, 1, 2, 2, 3, 3), nvswitch=True),
    "pcie-2": NodeLayout(L40S, (0x3B, 0x86), (0, 1), (0, 1)),
    "nvbridge-2": NodeLayout(A100_PCIE, (0x3B, 0x3C), (0, 0), (0, 0),
                             switch_level=abi.TOPOLOGY_SINGLE),
    "consumer-no-ecc": NodeLayout(RTX_4090, (0x01,), (-1,), (0,)),
    "no-gpu": NodeLayout(RTX_4090, (), (), ()),
}
PROFILE_NAMES: Final = tuple(LAYOUTS)


def build_profile(name: str, seed: int = 0) -> NodeSnapshot:
    """The snapshot of a built-in profile; the same name and seed give the same snapshot."""
    if name not in LAYOUTS:
        raise ValueError(f"unknown GPU profile {name!r}; known: {', '.join(PROFILE_NAMES)}")
    layout = LAYOUTS[name]
    generator = random.Random(f"{name}/{seed}")
    devices = tuple(_device(layout, index, generator) for index in range(len(layout.buses)))
    return NodeSnapshot(DRIVER, devices, _topology(layout, devices))


def _uuid(generator: random.Random) -> str:
    digits = f"{generator.getrandbits(128):032x}"
    return (f"GPU-{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-"
            f"{digits[20:]}")


def _device(layout: NodeLayout, index: int, generator: random.Random) -> DeviceSnapshot:
    model = layout.model
    uuid = _uuid(generator)
    serial = str(generator.randrange(10**12, 10**13)) if model.datacenter else ""
    info = DeviceInfo(
        uuid=uuid, index=index, minor=index, pci_bus_id=f"0000:{layout.buses[index]:02x}:00.0",
        model=model.name, serial=serial, memory_bytes=model.memory_bytes,
        compute_capability=model.compute_capability, numa_node=layout.numa_nodes[index],
        mig_enabled=False, mig_pending=False)
    links = tuple(NvLinkSample(link, True, 0, 0, 0, 0) for link in range(model.nvlinks))
    sample = DeviceSample(uuid=uuid, fabric=model.fabric, nvlinks=links,
                          **_readings(model, generator))
    return DeviceSnapshot(info, sample, (), model.supported_events)


def _readings(model: GpuModel, generator: random.Random) -> dict[str, Reading]:
    used_bytes = generator.randrange(1, 8) * MIB

    def when(supported: bool, value: int = 0) -> Reading:
        return value if supported else UNSUPPORTED

    def maybe(value: int | None) -> Reading:
        return UNSUPPORTED if value is None else value

    return {
        "temperature_c": 28 + generator.randrange(10),
        "slowdown_temperature_c": maybe(model.slowdown_temperature_c),
        "shutdown_temperature_c": maybe(model.shutdown_temperature_c),
        "power_mw": model.idle_power_mw + generator.randrange(5000),
        "power_limit_mw": model.power_limit_mw,
        "energy_mj": generator.randrange(10**9, 10**11),
        "sm_clock_mhz": model.sm_clock_mhz, "memory_clock_mhz": model.memory_clock_mhz,
        "utilization_pct": 0, "memory_used_bytes": used_bytes,
        "memory_free_bytes": model.memory_bytes - used_bytes,
        "clock_event_mask": abi.CLOCK_EVENT_GPU_IDLE,
        "ecc_enabled": when(model.ecc, 1),
        **{name: when(model.ecc) for name in (
            "ecc_volatile_corrected", "ecc_volatile_uncorrected", "ecc_aggregate_corrected",
            "ecc_aggregate_uncorrected")},
        # Ampere and later replace page retirement with row remapping.
        "retired_pages_sbe": UNSUPPORTED, "retired_pages_dbe": UNSUPPORTED,
        "retired_pages_pending": UNSUPPORTED,
        **{name: when(model.row_remapping) for name in (
            "remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending",
            "remap_failure")},
        "recovery_action": when(model.datacenter),
        "pcie_replays": 0, "pcie_generation": model.pcie_generation,
        "pcie_generation_max": model.pcie_generation, "pcie_width": 16, "pcie_width_max": 16,
        "thermal_violation_ns": when(model.datacenter),
        "power_violation_ns": when(model.datacenter),
    }


def _topology(layout: NodeLayout, devices: tuple[DeviceSnapshot, ...]) -> Topology:
    pairs = []
    for a in range(len(devices)):
        for b in range(a + 1, len(devices)):
            first, second = sorted((devices[a].info.uuid, devices[b].info.uuid))
            bridged = not layout.nvswitch and a // 2 == b // 2
            pairs.append(GpuPair(first, second, _level(layout, a, b),
                                 layout.model.nvlinks if bridged else 0))
    return Topology(tuple(sorted(pairs, key=lambda pair: (pair.uuid_a, pair.uuid_b))),
                    nvswitch=layout.nvswitch and bool(devices))


def _level(layout: NodeLayout, a: int, b: int) -> int:
    if layout.switches[a] == layout.switches[b]:
        return layout.switch_level
    if layout.numa_nodes[a] == layout.numa_nodes[b] >= 0:
        return abi.TOPOLOGY_NODE
    return abi.TOPOLOGY_SYSTEM
