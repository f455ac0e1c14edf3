"""A `group` answer (GpuStore.gang) is bounded by bytes. A gang keeps one failure line per GPU
under it (statemachine/lifecycle.py: latest_failures), up to GPUS_PER_GANG_MAX (8192), each
"uuid: why" with a UUID of up to UUID_LENGTH_MAX characters and a reason of up to
REASON_LENGTH_MAX; the limits count characters, and a character is up to 4 UTF-8 bytes. So one
gang's lines alone could be 8192 x (96 + 2 + 8 + 1024 + 3) = some 9.3 MB, over a client
connection's default frame cap (8 MiB, consensus/runtime/node_config.py): the replica answered
TOO_LARGE and the gang could never be looked at (its pods, its phase) by the scheduler, the
node agents (agent/store_link.py: standing) or an operator. The answer now keeps whole lines
up to a byte budget and says how many it left out."""

from __future__ import annotations

import anyio
import pytest

from statemachine import limits
from statemachine.apply import apply
from statemachine.commands import (
    ApplyConfig,
    GpuInventory,
    HealthReport,
    HealthStatus,
    RegisterNode,
    ReportHealth,
    SubmitGroup,
)
from statemachine.context import Context
from statemachine.errors import Rejection
from statemachine.machine import Machine
from statemachine.queries import GroupQuery, answer
from statemachine.query_codec import encode_answer
from statemachine.result_codec import encode_result
from statemachine.results import GroupPhase, GroupStatus, NodeRegistered
from statemachine.spec import (
    CellTypeSpec,
    ClusterSpec,
    GpuModelSpec,
    PhysicalCellSpec,
    PolicySpec,
    QuotaSpec,
    VirtualClusterSpec,
)
from statemachine.state import State
from statemachine.store import GpuStore
from statemachine.views import failure_lines
from tests.statemachine.builders import ADMIN, SCHEDULER, Driver, gang, node_principal
from tests.statemachine.one_machine import ANSWER_BYTES_MAX, OneMachine

GPUS_PER_NODE = 8
NODES_PER_RACK = 64
NODES = limits.PODS_PER_GANG_MAX  # one 8-GPU pod on each: a gang of GPUS_PER_GANG_MAX GPUs
WIDE = "\U0001d4d0"  # MATHEMATICAL BOLD SCRIPT CAPITAL A: one character, four UTF-8 bytes
REASON = WIDE * limits.REASON_LENGTH_MAX


def large_spec() -> ClusterSpec:
    racks = NODES // NODES_PER_RACK
    return ClusterSpec(
        gpu_models=(GpuModelSpec(name="H100", memory_mib=81920),),
        cell_types=(CellTypeSpec(name="H100-NODE", child="H100", child_count=GPUS_PER_NODE,
                                 node_level=True),
                    CellTypeSpec(name="H100-RACK", child="H100-NODE",
                                 child_count=NODES_PER_RACK)),
        physical_cells=tuple(PhysicalCellSpec(cell_type="H100-RACK", nodes=tuple(
            f"node-{rack * NODES_PER_RACK + index:04d}" for index in range(NODES_PER_RACK)))
            for rack in range(racks)),
        virtual_clusters=(VirtualClusterSpec(name="research", quota=(QuotaSpec(
            chain="H100-RACK", cell_type="H100-NODE", count=1),)),),
        policy=PolicySpec())


def uuid(node: str, index: int) -> str:
    """A UUID as long as the limits allow (MIG instance ids make them long)."""
    return f"GPU-{node}-{index}-".ljust(limits.UUID_LENGTH_MAX, "0")


def failed_gang(state: State) -> None:
    """A gang of 1024 pods x 8 GPUs, every GPU under it failed with the longest reason."""
    run = Driver(state, checked=False).ok

    run(ApplyConfig(expected_version=0, spec=large_spec()), ADMIN)
    incarnations = {}
    for number in range(NODES):
        node = f"node-{number:04d}"
        registered = run(RegisterNode(node=node, boot_id="boot-1", gpus=tuple(
            GpuInventory(uuid=uuid(node, index), index=index,
                         pci_bus_id=f"0000:{index:02x}:00.0", model="H100", memory_mib=81920)
            for index in range(GPUS_PER_NODE))), node_principal(node))
        assert isinstance(registered, NodeRegistered)
        incarnations[node] = registered.incarnation
    status = run(gang("training", "research", -1, (NODES, GPUS_PER_NODE)), SCHEDULER)
    assert isinstance(status, GroupStatus) and status.phase is GroupPhase.ALLOCATED
    for node, incarnation in incarnations.items():
        run(ReportHealth(node=node, incarnation=incarnation, reports=tuple(
            HealthReport(uuid=uuid(node, index), status=HealthStatus.FAIL, reason=REASON)
            for index in range(GPUS_PER_NODE))), node_principal(node))
    assert len(state.groups["training"].failures) == limits.GPUS_PER_GANG_MAX


@pytest.fixture(scope="module")
def machine() -> Machine:
    machine = Machine()
    failed_gang(machine.state)
    return machine


def test_a_gang_with_every_gpu_failed_fits_a_client_frame(machine: Machine) -> None:
    status = answer(machine.state, GroupQuery(group="training"))
    assert not isinstance(status, Rejection)
    size = len(encode_answer(status))
    assert size < ANSWER_BYTES_MAX, f"{len(status['failures'])} failure lines: {size} bytes"
    assert len(status["pods"]) == NODES, "every pod is listed, whatever is cut"
    lines = failure_lines(machine.state.groups["training"])
    assert status["failures"] == list(lines[:len(status["failures"])]), "the first, in order"
    assert status["failures_omitted"] == len(lines) - len(status["failures"]) > 0


def test_resubmitting_the_gang_answers_within_a_reply(machine: Machine) -> None:
    """SubmitGroup of an existing gang answers its status: bounded the same way."""
    group = machine.state.groups["training"]
    result = apply(machine.state, SubmitGroup(
        group="training", vc=group.vc, priority=group.priority, gpu_model=group.gpu_model,
        members=group.members, lazy_preemption=group.lazy_preemption),
        Context(principal=SCHEDULER, now_ms=machine.state.now_ms + 1))
    assert isinstance(result, GroupStatus)
    assert len(encode_result(result)) < ANSWER_BYTES_MAX


@pytest.mark.anyio
async def test_the_store_client_gets_the_gang(machine: Machine) -> None:
    with anyio.fail_after(30):
        status = await GpuStore(OneMachine(machine)).gang("training")  # type: ignore[arg-type]
    assert not isinstance(status, Rejection)
    assert status["phase"] == "allocated" and len(status["pods"]) == NODES
