"""The dev cluster's configuration: racks of 8-GPU nodes and three tenants."""

from __future__ import annotations

from statemachine.commands import GpuInventory
from statemachine.spec import (
    CellTypeSpec,
    ClusterSpec,
    GpuModelSpec,
    PhysicalCellSpec,
    PolicySpec,
    QuotaSpec,
    VirtualClusterSpec,
)

NODES_PER_RACK = 4
GPUS_PER_NODE = 8
TENANTS = ("research", "prod", "batch")


def node_names(nodes: int) -> list[str]:
    return [f"node-{index:02d}" for index in range(nodes)]


def dev_spec(nodes: int) -> ClusterSpec:
    """`nodes` nodes (a multiple of 4) in racks of 4; research and prod split half the racks'
    nodes between them as guarantees, batch runs opportunistically."""
    if nodes % NODES_PER_RACK or nodes < NODES_PER_RACK:
        raise ValueError(f"--nodes must be a positive multiple of {NODES_PER_RACK}")
    names = node_names(nodes)
    cell_types = (CellTypeSpec(name="A100-PAIR", child="A100", child_count=2),
                  CellTypeSpec(name="A100-NODE", child="A100-PAIR", child_count=4,
                               node_level=True),
                  CellTypeSpec(name="A100-RACK", child="A100-NODE",
                               child_count=NODES_PER_RACK))
    racks = tuple(PhysicalCellSpec(cell_type="A100-RACK",
                                   nodes=tuple(names[start:start + NODES_PER_RACK]))
                  for start in range(0, nodes, NODES_PER_RACK))
    guaranteed = max(1, nodes // 4)
    tenants = (
        VirtualClusterSpec(name="research", quota=(QuotaSpec(
            chain="A100-RACK", cell_type="A100-NODE", count=guaranteed),)),
        VirtualClusterSpec(name="prod", quota=(QuotaSpec(
            chain="A100-RACK", cell_type="A100-NODE", count=guaranteed),)),
        VirtualClusterSpec(name="batch", quota=()),
    )
    return ClusterSpec(gpu_models=(GpuModelSpec(name="A100", memory_mib=81920),),
                       cell_types=cell_types, physical_cells=racks, virtual_clusters=tenants,
                       policy=PolicySpec(lease_ms=10_000, down_after_ms=20_000))


def inventory(node: str) -> tuple[GpuInventory, ...]:
    return tuple(GpuInventory(uuid=f"GPU-{node}-{index}", index=index,
                              pci_bus_id=f"0000:{0x18 + index:02x}:00.0", model="A100",
                              memory_mib=81920) for index in range(GPUS_PER_NODE))
