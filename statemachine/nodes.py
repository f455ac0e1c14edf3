"""Node records: registration and inventory, fenced incarnations, leases, cordon, drain, health.

A node is known from the configuration; its agent registers it with the GPU inventory it read
through NVML. Each new boot id starts a new incarnation, and commands from an older incarnation
are refused (STALE_INCARNATION), which fences a rebooted agent's stale messages. Liveness is a
lease renewed by heartbeats and judged only on `Tick`, from logical time: Up, then Suspect after
`lease_ms` without a heartbeat, then Down `down_after_ms` later.

Per GPU: the agent's last verdict (pass, warn, fail, unknown, with reason and since when), a
count of consecutive passes (a failed GPU needs `recover_reports` of them to come back), and a
sticky admin mark. `placeable` says whether new work may land on a GPU; `cells.usable` mirrors
it for every leaf and the invariant checker holds the two equal.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from statemachine.commands import GpuInventory, GpuLink, HealthStatus


class Liveness(enum.StrEnum):
    UNREGISTERED = "unregistered"
    UP = "up"
    SUSPECT = "suspect"  # the lease ran out: no new placements; allocations kept
    DOWN = "down"  # the grace ran out too: the node's GPUs count as failed


@dataclass(slots=True, kw_only=True)
class GpuHealth:
    """The health of one GPU. Mutated only through the journal."""

    status: HealthStatus = HealthStatus.UNKNOWN
    reason: str = ""
    since_ms: int = 0
    failed: bool = False  # set by a fail report; cleared by enough passes or an admin
    passes: int = 0  # consecutive pass reports since the last non-pass
    admin_bad: str = ""  # an admin's reason; sticky until ClearBad


@dataclass(slots=True, kw_only=True)
class NodeRecord:
    """One configured node. Mutated only through the journal."""

    node: str
    index: int  # the topology's node index
    liveness: Liveness = Liveness.UNREGISTERED
    boot_id: str = ""
    incarnation: int = 0
    # The last registration's boards, by index, and their health (kept when deregistered)
    gpus: tuple[GpuInventory, ...] = ()
    links: tuple[GpuLink, ...] = ()  # by (a, b), as the agent measured them
    health: tuple[GpuHealth, ...] = ()
    lease_expires_ms: int = 0
    cordoned: bool = False
    draining: bool = False
    admin_bad: str = ""  # an admin's reason for the whole node

    @property
    def registered(self) -> bool:
        return self.liveness is not Liveness.UNREGISTERED

    def placeable(self, gpu_index: int) -> bool:
        """Whether a new placement may use this GPU."""
        if self.liveness is not Liveness.UP or self.cordoned or self.draining or self.admin_bad:
            return False
        health = self.health[gpu_index]
        return not health.failed and not health.admin_bad

    def failing(self, gpu_index: int) -> str:
        """Why work already on this GPU is in trouble ("" when it is not): a failed GPU, an
        admin mark, or a Down node."""
        if self.liveness is Liveness.DOWN:
            return "node down"
        if self.admin_bad:
            return f"node marked bad: {self.admin_bad}"
        health = self.health[gpu_index] if self.health else None
        if health is not None and health.admin_bad:
            return f"marked bad: {health.admin_bad}"
        if health is not None and health.failed:
            return f"failed: {health.reason}"
        return ""

    def gpu_by_uuid(self, uuid: str) -> int:
        """The index of the GPU with this UUID, or -1."""
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu.index
        return -1
