"""Test helpers: small cluster specs, inventories, and a driver that applies commands with the
right principal and a clock, checking every invariant after each one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from consensus.envelope import Principal, Role
from statemachine.apply import apply
from statemachine.commands import (
    ApplyConfig,
    Command,
    GpuInventory,
    Heartbeat,
    Member,
    RegisterNode,
    SubmitGroup,
    Tick,
)
from statemachine.context import Context
from statemachine.errors import Code, Rejection
from statemachine.invariants import check_invariants
from statemachine.results import GroupStatus, NodeRegistered, Result
from statemachine.rules import RULES_VERSION
from statemachine.spec import (
    CellTypeSpec,
    ClusterSpec,
    FailurePolicy,
    GpuModelSpec,
    PhysicalCellSpec,
    PolicySpec,
    QuotaSpec,
    VirtualClusterSpec,
)
from statemachine.state import State

ADMIN = Principal(Role.ADMIN, "ops")
SCHEDULER = Principal(Role.SCHEDULER, "sched")
SYSTEM = Principal(Role.SYSTEM, "cellar")

A100_TYPES = (
    CellTypeSpec(name="A100-SW", child="A100", child_count=2),
    CellTypeSpec(name="A100-SOCK", child="A100-SW", child_count=2),
    CellTypeSpec(name="A100-NODE", child="A100-SOCK", child_count=2, node_level=True),
    CellTypeSpec(name="A100-RACK", child="A100-NODE", child_count=2),
)


def rack_spec(racks: int = 3, quota: Sequence[VirtualClusterSpec] | None = None,
              policy: PolicySpec | None = None) -> ClusterSpec:
    """`racks` racks of 2 nodes, each node 2 sockets x 2 PCIe switches x 2 A100 (8 GPUs);
    nodes are named n0, n1, ... in rack order. Default tenants: a (one node) and b (one rack).
    """
    if quota is None:
        quota = (
            VirtualClusterSpec(name="a", quota=(QuotaSpec(chain="A100-RACK",
                                                          cell_type="A100-NODE", count=1),)),
            VirtualClusterSpec(name="b", quota=(QuotaSpec(chain="A100-RACK",
                                                          cell_type="A100-RACK", count=1),)),
        )
    cells = tuple(PhysicalCellSpec(cell_type="A100-RACK", nodes=(f"n{2 * rack}",
                                                                 f"n{2 * rack + 1}"))
                  for rack in range(racks))
    return ClusterSpec(gpu_models=(GpuModelSpec(name="A100", memory_mib=81920),),
                       cell_types=A100_TYPES, physical_cells=cells,
                       virtual_clusters=tuple(quota), policy=policy or PolicySpec())


def vc(name: str, *entries: tuple[str, str, int],
       on_failure: FailurePolicy = FailurePolicy.KEEP) -> VirtualClusterSpec:
    return VirtualClusterSpec(name=name, on_failure=on_failure, quota=tuple(
        QuotaSpec(chain=chain, cell_type=cell_type, count=count)
        for chain, cell_type, count in entries))


def inventory(node: str, count: int = 8, model: str = "A100") -> tuple[GpuInventory, ...]:
    return tuple(GpuInventory(uuid=f"GPU-{node}-{index}", index=index,
                              pci_bus_id=f"0000:{index:02x}:00.0", model=model,
                              memory_mib=81920) for index in range(count))


def node_principal(node: str) -> Principal:
    return Principal(Role.NODE, node)


def gang(group: str, vc_name: str, priority: int, *members: tuple[int, int],
         model: str = "", lazy: bool = False,
         on_pod_failure: FailurePolicy | None = FailurePolicy.RELEASE) -> SubmitGroup:
    return SubmitGroup(group=group, vc=vc_name, priority=priority,
                       members=tuple(Member(pods=pods, gpus=gpus) for pods, gpus in members),
                       gpu_model=model, lazy_preemption=lazy, on_pod_failure=on_pod_failure)


def newest_rules() -> State:
    """A fresh state under this build's newest rules, as a cluster's first Tick leaves it (a
    bare `State()` applies the rules of version 0, those of a log written before versions)."""
    state = State()
    state.rules_version = RULES_VERSION  # outside a command: no undo record to leave
    return state


@dataclass
class Driver:
    """Applies commands to one state, advancing a clock and checking invariants each time
    (`checked=False`: not, for states built large, where a check costs seconds)."""

    state: State = field(default_factory=State)
    now_ms: int = 1_000
    incarnations: dict[str, int] = field(default_factory=dict)
    checked: bool = True

    def run(self, command: Command, principal: Principal, *, step_ms: int = 1) -> Result:
        self.now_ms += step_ms
        result = apply(self.state, command, Context(principal=principal, now_ms=self.now_ms))
        if self.checked:
            check_invariants(self.state)
        return result

    def ok(self, command: Command, principal: Principal, *, step_ms: int = 1) -> Result:
        result = self.run(command, principal, step_ms=step_ms)
        assert not isinstance(result, Rejection), result
        return result

    def rejected(self, command: Command, principal: Principal, code: Code) -> Rejection:
        result = self.run(command, principal)
        assert isinstance(result, Rejection), result
        assert result.code is code, result
        return result

    def configure(self, spec: ClusterSpec) -> None:
        version = self.state.config.version if self.state.config is not None else 0
        self.ok(ApplyConfig(expected_version=version, spec=spec), ADMIN)

    def register(self, *nodes: str, count: int = 8, boot: str = "boot-1") -> None:
        for node in nodes:
            result = self.ok(RegisterNode(node=node, boot_id=boot,
                                          gpus=inventory(node, count)), node_principal(node))
            assert isinstance(result, NodeRegistered)
            self.incarnations[node] = result.incarnation

    def heartbeat_all(self) -> None:
        for node in sorted(self.incarnations):
            self.ok(Heartbeat(node=node, incarnation=self.incarnations[node]),
                    node_principal(node))

    def submit(self, command: SubmitGroup) -> GroupStatus:
        result = self.ok(command, SCHEDULER)
        assert isinstance(result, GroupStatus)
        return result

    def tick(self, step_ms: int = 1) -> Result:
        return self.ok(Tick(), SYSTEM, step_ms=step_ms)
