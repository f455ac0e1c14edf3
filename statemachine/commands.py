"""The commands the state machine applies: typed, frozen, keyword-only values.

Each command is one decision a client asks the replicated state machine to take. The codec turns
msgpack bodies into these values (every field checked and capped) and back; `apply` dispatches on
the type. Who may issue which command is decided in `authorization`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from statemachine.spec import ClusterSpec, FailurePolicy


class HealthStatus(enum.StrEnum):
    """A GPU health verdict from the node agent (after DCGM's levels, plus unknown)."""

    PASS = "pass"  # noqa: S105 - a health verdict, not a password
    WARN = "warn"  # schedulable; surfaced
    FAIL = "fail"  # unschedulable until `recover_reports` passes in a row or an admin clears it
    UNKNOWN = "unknown"  # no data; schedulable, surfaced, and never counts as a pass


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInventory:
    """One GPU as the agent saw it through NVML."""

    uuid: str
    index: int
    pci_bus_id: str
    model: str
    memory_mib: int
    numa_node: int = -1  # -1: unknown
    mig_enabled: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuLink:
    """How two of a node's GPUs (by index, a < b) reach each other, as NVML sees it: the PCIe
    topology level (0 same board ... 50 across sockets) and the NVLink links between them."""

    a: int
    b: int
    level: int
    nvlinks: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthReport:
    uuid: str
    status: HealthStatus
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """`pods` pods of `gpus` GPUs each; every pod's GPUs lie on one node."""

    pods: int
    gpus: int


# Configuration (admin).


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyConfig:
    expected_version: int
    spec: ClusterSpec


# Nodes (the node's own agent).


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterNode:
    node: str
    boot_id: str
    gpus: tuple[GpuInventory, ...]
    links: tuple[GpuLink, ...] = ()  # the measured topology, for operators to see
    # The agent's reading of these GPUs now, applied as a health report before the
    # registration's scheduling pass (a GPU lost while the agent was away is never placed).
    health: tuple[HealthReport, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    node: str
    incarnation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportHealth:
    node: str
    incarnation: int
    reports: tuple[HealthReport, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class AckPodStarted:
    node: str
    incarnation: int
    group: str
    pod_uid: str
    gpu_uuids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportPodExit:
    node: str
    incarnation: int
    group: str
    pod_uid: str
    exit_code: int
    reason: str = ""  # why, when the code alone does not say (lost, could not start)


# Nodes (admin). `gpu` empty means the whole node.


@dataclass(frozen=True, slots=True, kw_only=True)
class MarkBad:
    node: str
    gpu: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ClearBad:
    node: str
    gpu: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Cordon:
    node: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Uncordon:
    node: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Drain:
    """Cordon, then evict every gang with a pod or a reservation on the node."""

    node: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Deregister:
    """Forget a node's registration (its agent must register again); with `force`, release
    the gangs on it first. Its cordon, drain, marks and GPU health stay."""

    node: str
    force: bool


# Gangs (scheduler or admin).


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitGroup:
    group: str
    vc: str
    priority: int  # 0..1000 guaranteed, -1 opportunistic
    members: tuple[Member, ...]
    gpu_model: str  # empty: any model, tried in configuration order
    lazy_preemption: bool
    # A pod that exits non-zero (or is lost) while the gang is allocated: RELEASE evicts the
    # gang (an all-or-nothing job is broken without it), KEEP leaves its other pods running.
    # None: a body without the field (an older client, an entry of a log written before it):
    # applied as it was then, KEEP with no POD_EXITED effects (statemachine/codec.py).
    on_pod_failure: FailurePolicy | None = FailurePolicy.RELEASE


@dataclass(frozen=True, slots=True, kw_only=True)
class BindPod:
    group: str
    member: int
    pod_uid: str
    command: tuple[str, ...] = ()  # the argv the node agent runs; empty: nothing to run


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseGroup:
    group: str
    reason: str


# Time (the runtime only).


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick:
    """Advance logical time (the one command that moves it freely: `logical_time`): leases,
    preemption deadlines, then one scheduling pass. `rules`: the newest rules the proposing
    build applies, in force from the next command on (`statemachine.rules`; 0 from a build
    before rule versions)."""

    rules: int = 0


Command = (
    ApplyConfig | RegisterNode | Heartbeat | ReportHealth | AckPodStarted | ReportPodExit
    | MarkBad | ClearBad | Cordon | Uncordon | Drain | Deregister
    | SubmitGroup | BindPod | ReleaseGroup | Tick
)
