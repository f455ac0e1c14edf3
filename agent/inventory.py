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
from agent.units import MIB
from statemachine.commands import GpuInventory, GpuLink

UNKNOWN_MINOR = -1  # the /dev/nvidia<minor> of a GPU known only from the store's record
UNKNOWN_CAPABILITY = (0, 0)
KERNEL_BOOT_ID = pathlib.Path("/proc/sys/kernel/random/boot_id")


def gpu_inventory(devices: tuple[DeviceInfo, ...],
                  models: tuple[tuple[str, str], ...]) -> tuple[GpuInventory, ...]:
    return tuple(GpuInventory(uuid=device.uuid, index=device.index,
                              pci_bus_id=device.pci_bus_id,
                              model=cluster_model(device.model, models),
                              memory_mib=device.memory_bytes // MIB,
                              numa_node=device.numa_node, mig_enabled=device.mig_enabled)
                 for device in sorted(devices, key=lambda device: device.index))


def registered_devices(gpus: tuple[GpuInventory, ...], listed: tuple[DeviceInfo, ...],
                       models: tuple[tuple[str, str], ...]) -> tuple[DeviceInfo, ...]:
    """The store's record of this node's GPUs as devices (`gpu_inventory` backwards): each is
    named as a GPU NVML lists of the same model is (for `gpu_inventory` to map back), and
    what the store does not keep is unknown."""
    names: dict[str, str] = {}
    for device in sorted(listed, key=lambda device: device.index):
        names.setdefault(cluster_model(device.model, models), device.model)
    return tuple(DeviceInfo(uuid=gpu.uuid, index=gpu.index, minor=UNKNOWN_MINOR,
                            pci_bus_id=gpu.pci_bus_id, model=names.get(gpu.model, gpu.model),
                            serial="", memory_bytes=gpu.memory_mib * MIB,
                            compute_capability=UNKNOWN_CAPABILITY, numa_node=gpu.numa_node,
                            mig_enabled=gpu.mig_enabled, mig_pending=False)
                 for gpu in gpus)


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
