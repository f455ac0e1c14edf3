"""What the agent registers: its GPUs as the store knows them, and a boot id per agent start.

The store keys GPUs on their UUIDs and checks the model against the cluster configuration, so
the NVML name is mapped to the configuration's model name (`agent.config.cluster_model`).
Each start of the agent registers with a fresh boot id (the kernel's boot id and a random
token), which the store answers with a fresh incarnation: messages from an earlier run of the
agent are fenced off, and the pods the store expects are listed for reconciliation.
"""

from __future__ import annotations

import pathlib
import secrets

from agent.config import cluster_model
from agent.gpu import DeviceInfo, Topology
from statemachine.commands import GpuInventory, GpuLink

MIB = 1 << 20
KERNEL_BOOT_ID = pathlib.Path("/proc/sys/kernel/random/boot_id")


def gpu_inventory(devices: tuple[DeviceInfo, ...],
                  models: tuple[tuple[str, str], ...]) -> tuple[GpuInventory, ...]:
    return tuple(GpuInventory(uuid=device.uuid, index=device.index,
                              pci_bus_id=device.pci_bus_id,
                              model=cluster_model(device.model, models),
                              memory_mib=device.memory_bytes // MIB,
                              numa_node=device.numa_node, mig_enabled=device.mig_enabled)
                 for device in sorted(devices, key=lambda device: device.index))


def gpu_links(devices: tuple[DeviceInfo, ...], topology: Topology) -> tuple[GpuLink, ...]:
    """The measured connections between pairs of this node's GPUs, by GPU index."""
    index = {device.uuid: device.index for device in devices}
    links = []
    for pair in topology.pairs:
        if pair.uuid_a in index and pair.uuid_b in index:
            a, b = sorted((index[pair.uuid_a], index[pair.uuid_b]))
            links.append(GpuLink(a=a, b=b, level=pair.level, nvlinks=pair.nvlinks))
    return tuple(sorted(links, key=lambda link: (link.a, link.b)))


def fresh_boot_id(kernel_boot_id: pathlib.Path = KERNEL_BOOT_ID) -> str:
    """`<kernel boot id>/<random token>`: new at every agent start."""
    try:
        kernel = kernel_boot_id.read_text(encoding="ascii").strip()
    except OSError:
        kernel = "unknown-boot"
    return f"{kernel}/{secrets.token_hex(6)}"
