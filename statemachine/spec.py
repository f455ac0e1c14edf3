"""The cluster configuration: cell types, physical cells, virtual clusters and policy knobs.

Configuration is replicated state, changed only by `ApplyConfig` with an expected version. The
shape follows HiveD (reference/hived.md 1.2-1.3): a cell type is a GPU model (a leaf) or has
exactly one child type and a fan-out; the top type of each physical cell names its chain; one
type on every chain is the node level. A physical cell lists the node ids of its node-level
cells in order. A virtual cluster (tenant) is guaranteed a number of cells per chain and type.

These are plain frozen values; `config_check` validates them and `topology` builds the cell tree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class FailurePolicy(enum.StrEnum):
    """What happens to a gang when hardware under it fails (a GPU fails, its node goes Down)."""

    KEEP = "keep"  # the gang keeps its placement; the failure is surfaced on it and in the outbox
    RELEASE = "release"  # the gang is released: its pods are killed and its cells freed


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuModelSpec:
    """A leaf cell type: one GPU of this model."""

    name: str
    memory_mib: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CellTypeSpec:
    """A composite cell type: `child_count` cells of type `child` (a cell type or a GPU model)."""

    name: str
    child: str
    child_count: int
    node_level: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PhysicalCellSpec:
    """One top-level physical cell; its chain is named after its type. `nodes` lists the ids of
    the node-level cells inside it, in address order."""

    cell_type: str
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaSpec:
    """`count` guaranteed cells of type `cell_type` on chain `chain`."""

    chain: str
    cell_type: str
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class VirtualClusterSpec:
    """A tenant: its guaranteed cells and what to do with its gangs when hardware fails."""

    name: str
    quota: tuple[QuotaSpec, ...]
    on_failure: FailurePolicy = FailurePolicy.KEEP


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySpec:
    """Timing and budget knobs. All durations are logical milliseconds from command time."""

    lease_ms: int = 10_000  # a node with no heartbeat for this long becomes Suspect
    down_after_ms: int = 20_000  # ... and Down this long after that
    preemption_grace_ms: int = 30_000  # victims have this long to exit before kills are resent
    session_ttl_ms: int = 600_000  # an idle client session is forgotten after this long
    recover_reports: int = 3  # consecutive passing reports that clear a failed GPU
    schedule_attempts_max: int = 16  # pending gangs tried per scheduling pass


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    gpu_models: tuple[GpuModelSpec, ...]
    cell_types: tuple[CellTypeSpec, ...]
    physical_cells: tuple[PhysicalCellSpec, ...]
    virtual_clusters: tuple[VirtualClusterSpec, ...]
    policy: PolicySpec = field(default_factory=PolicySpec)
