"""Any sequence of commands that decode, from any principal, through `Machine.apply`.

Goal: nothing a client can send makes `apply` raise (every replica applies the same log entry,
so one that raised would stop them all) or break an invariant. Method: Hypothesis draws
sequences of every kind of command, each from the principal allowed to send it (a node agent
for its own node, an administrator, the scheduler, the system's tick), with field values from
small pools so that names collide: nodes and GPUs that exist and some that do not, odd
inventories (duplicate or missing uuids, MIG, no GPUs), configurations whose cell types,
cells and quotas refer to each other or to nothing, and gangs of every size. Each command goes
through its codec first (the bytes a client could send), and the invariants are checked after
every step. test_stateful.py checks the allocator's decisions against a reference; this one
checks only that the machine stays whole on input that makes little sense."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consensus.codec import encode_envelope
from consensus.envelope import Envelope, Principal, Role
from statemachine import Machine
from statemachine.codec import decode_command, encode_command
from statemachine.commands import (
    AckPodStarted,
    ApplyConfig,
    BindPod,
    ClearBad,
    Command,
    Cordon,
    Deregister,
    Drain,
    GpuInventory,
    GpuLink,
    HealthReport,
    HealthStatus,
    Heartbeat,
    MarkBad,
    Member,
    RegisterNode,
    ReleaseGroup,
    ReportHealth,
    ReportPodExit,
    SubmitGroup,
    Tick,
    Uncordon,
)
from statemachine.invariants import check_invariants
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
from tests.statemachine.builders import ADMIN, SCHEDULER, SYSTEM, inventory, rack_spec

NODE_IDS = ["n0", "n1", "n2", "n3", "x"]
node_ids = st.sampled_from(NODE_IDS)
uuids = st.sampled_from([f"GPU-{node}-{index}" for node in NODE_IDS for index in range(3)]
                        + ["GPU-n0-7", "GPU-n1-7"])
groups = st.sampled_from(["g0", "g1", "g2"])
pod_uids = st.sampled_from(["p0", "p1", "p2"])
incarnations = st.integers(0, 3)
models = st.sampled_from(["A100", "T4", ""])
names = st.sampled_from(["A100", "T4", "NODE", "SW", "RACK", "a", "b"])
tenants = st.sampled_from(["a", "b", "c"])


def gpus_of(node: str) -> st.SearchStrategy[tuple[GpuInventory, ...]]:
    return st.one_of(
        st.integers(0, 9).map(lambda count: inventory(node, count)),
        st.lists(st.builds(GpuInventory, uuid=uuids, index=st.integers(0, 9),
                           pci_bus_id=st.just("0"), model=models.filter(bool),
                           memory_mib=st.integers(0, 2), numa_node=st.integers(-1, 2),
                           mig_enabled=st.booleans()), max_size=9).map(tuple))


specs = st.builds(
    ClusterSpec,
    gpu_models=st.lists(st.builds(GpuModelSpec, name=names, memory_mib=st.integers(0, 2)),
                        min_size=1, max_size=2).map(tuple),
    cell_types=st.lists(st.builds(CellTypeSpec, name=names, child=names,
                                  child_count=st.integers(1, 3), node_level=st.booleans()),
                        max_size=4).map(tuple),
    physical_cells=st.lists(st.builds(PhysicalCellSpec, cell_type=names,
                                      nodes=st.lists(node_ids, max_size=3).map(tuple)),
                            max_size=3).map(tuple),
    virtual_clusters=st.lists(st.builds(
        VirtualClusterSpec, name=tenants,
        quota=st.lists(st.builds(QuotaSpec, chain=names, cell_type=names,
                                 count=st.integers(0, 3)), max_size=2).map(tuple),
        on_failure=st.sampled_from(list(FailurePolicy))), max_size=2).map(tuple),
    policy=st.just(PolicySpec()))


def health_reports(gpu_uuids: st.SearchStrategy[str]
                   ) -> st.SearchStrategy[tuple[HealthReport, ...]]:
    return st.lists(st.builds(HealthReport, uuid=gpu_uuids,
                              status=st.sampled_from(list(HealthStatus)),
                              reason=st.just("r")), max_size=3).map(tuple)


def node_commands(node: str) -> st.SearchStrategy[Command]:
    return st.one_of(
        st.builds(RegisterNode, node=st.just(node), boot_id=st.sampled_from(["b", "c"]),
                  gpus=gpus_of(node),
                  links=st.lists(st.builds(GpuLink, a=st.integers(0, 8), b=st.integers(0, 8),
                                           level=st.integers(0, 3),
                                           nvlinks=st.integers(0, 2)), max_size=3).map(tuple),
                  health=health_reports(st.sampled_from(  # mostly its own, one not
                      [f"GPU-{node}-{index}" for index in (0, 1, 2, 7)] + ["GPU-x"]))),
        st.builds(Heartbeat, node=st.just(node), incarnation=incarnations),
        st.builds(ReportHealth, node=st.just(node), incarnation=incarnations,
                  reports=health_reports(uuids)),
        st.builds(AckPodStarted, node=st.just(node), incarnation=incarnations, group=groups,
                  pod_uid=pod_uids, gpu_uuids=st.lists(uuids, max_size=3).map(tuple)),
        st.builds(ReportPodExit, node=st.just(node), incarnation=incarnations, group=groups,
                  pod_uid=pod_uids, exit_code=st.integers(-2, 2)))


admin_commands = st.one_of(
    st.builds(ApplyConfig, expected_version=st.integers(0, 3), spec=specs),
    st.builds(ApplyConfig, expected_version=st.integers(0, 3),
              spec=st.integers(1, 3).map(rack_spec)),
    st.builds(MarkBad, node=node_ids, gpu=st.one_of(st.just(""), uuids), reason=st.just("r")),
    st.builds(ClearBad, node=node_ids, gpu=st.one_of(st.just(""), uuids)),
    st.builds(Cordon, node=node_ids), st.builds(Uncordon, node=node_ids),
    st.builds(Drain, node=node_ids), st.builds(Deregister, node=node_ids, force=st.booleans()))
scheduler_commands = st.one_of(
    st.builds(SubmitGroup, group=groups, vc=tenants, priority=st.integers(-1, 3),
              members=st.lists(st.builds(Member, pods=st.integers(1, 3),
                                         gpus=st.sampled_from([1, 2, 3, 4, 8, 16])),
                               min_size=1, max_size=2).map(tuple),
              gpu_model=models, lazy_preemption=st.booleans()),
    st.builds(BindPod, group=groups, member=st.integers(0, 2), pod_uid=pod_uids,
              command=st.just(("run",))),
    st.builds(ReleaseGroup, group=groups, reason=st.just("r")))

steps = st.one_of(
    node_ids.flatmap(lambda node: st.tuples(st.just(Principal(Role.NODE, node)),
                                            node_commands(node))),
    st.tuples(st.just(ADMIN), admin_commands),
    st.tuples(st.just(SCHEDULER), scheduler_commands),
    st.tuples(st.just(SYSTEM), st.just(Tick())),
)


def apply(machine: Machine, principal: Principal, command: Command, now_ms: int) -> None:
    body = encode_command(command)
    assert decode_command(body) == command  # what a client could send
    machine.apply(encode_envelope(Envelope(principal=principal, session="", sequence=0,
                                           now_ms=now_ms, body=body)))


def configured_machine() -> Machine:
    """Two racks, three of their nodes registered."""
    machine = Machine()
    apply(machine, ADMIN, ApplyConfig(expected_version=0, spec=rack_spec(2)), 1000)
    for node in ("n0", "n1", "n2"):
        apply(machine, Principal(Role.NODE, node),
              RegisterNode(node=node, boot_id="b", gpus=inventory(node)), 1000)
    return machine


@settings(suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(steps, st.integers(0, 40_000)), min_size=1, max_size=25))
def test_no_sequence_of_commands_that_decode_makes_apply_raise(
        sequence: list[tuple[tuple[Principal, Any], int]]) -> None:
    machine = configured_machine()
    now_ms = 2000
    for (principal, command), step_ms in sequence:
        now_ms += step_ms
        apply(machine, principal, command, now_ms)
        check_invariants(machine.state)
