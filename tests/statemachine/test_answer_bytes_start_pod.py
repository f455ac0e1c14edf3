"""A START_POD effect carries its pod's GPUs' UUIDs three times (the list and the two
*_VISIBLE_DEVICES variables) and its argv. A pod may have GPUS_PER_NODE_MAX (64) GPUs, a UUID
UUID_LENGTH_MAX (96) characters of up to 4 UTF-8 bytes (the decoder counts characters), and the
argv POD_COMMAND_BYTES_MAX (16 KiB): 64 x 387 + 2 x (64 x 384 + 63) + 16,384 + headers, some
91 KB packed, over EFFECT_BYTES_MAX (64 KiB), which `unpack_effect` refuses. The effect is
emitted and kept, but every effects page that reaches it raises instead of answering: the
node's agent and every scheduler watching all effects (node=None) are stuck at that index for
as long as it is retained. (Even without an argv the UUIDs alone make 74 KB.)"""

from __future__ import annotations

from statemachine import limits
from statemachine.commands import ApplyConfig, BindPod, GpuInventory, RegisterNode
from statemachine.errors import Rejection
from statemachine.machine import Machine
from statemachine.queries import EffectsQuery, answer
from statemachine.query_codec import encode_answer
from statemachine.results import GroupPhase, GroupStatus, PodBound
from statemachine.spec import (
    CellTypeSpec,
    ClusterSpec,
    GpuModelSpec,
    PhysicalCellSpec,
    PolicySpec,
    QuotaSpec,
    VirtualClusterSpec,
)
from tests.statemachine.builders import ADMIN, SCHEDULER, Driver, gang, node_principal
from tests.statemachine.one_machine import ANSWER_BYTES_MAX

GPUS = limits.GPUS_PER_NODE_MAX
WIDE = "\U0001d4d0"  # one character, four UTF-8 bytes


def uuid(index: int) -> str:
    return WIDE * (limits.UUID_LENGTH_MAX - 1) + chr(0x10000 + index)


def spec() -> ClusterSpec:
    return ClusterSpec(
        gpu_models=(GpuModelSpec(name="G", memory_mib=81920),),
        cell_types=(CellTypeSpec(name="N", child="G", child_count=GPUS, node_level=True),
                    CellTypeSpec(name="R", child="N", child_count=1)),
        physical_cells=(PhysicalCellSpec(cell_type="R", nodes=("n0",)),),
        virtual_clusters=(VirtualClusterSpec(name="a", quota=(
            QuotaSpec(chain="R", cell_type="N", count=1),)),),
        policy=PolicySpec())


def test_a_wide_pods_start_effect_can_be_read() -> None:
    machine = Machine()
    state = machine.state
    run = Driver(state, checked=False).ok

    run(ApplyConfig(expected_version=0, spec=spec()), ADMIN)
    run(RegisterNode(node="n0", boot_id="boot-1", gpus=tuple(
        GpuInventory(uuid=uuid(index), index=index, pci_bus_id=f"0000:{index:02x}:00.0",
                     model="G", memory_mib=81920) for index in range(GPUS))),
        node_principal("n0"))
    status = run(gang("wide", "a", 1, (1, GPUS)), SCHEDULER)
    assert isinstance(status, GroupStatus) and status.phase is GroupPhase.ALLOCATED
    argv = ("x" * (limits.POD_COMMAND_BYTES_MAX - 1), "y")  # the longest argv a binding takes
    bound = run(BindPod(group="wide", member=0, pod_uid="pod-0", command=argv), SCHEDULER)
    assert isinstance(bound, PodBound)
    for node in ("n0", None):
        page = answer(state, EffectsQuery(after=0, node=node, limit=limits.QUERY_LIMIT_MAX))
        assert not isinstance(page, Rejection)
        assert len(encode_answer(page)) < ANSWER_BYTES_MAX
        starts = [effect for effect in page["effects"] if effect["kind"] == "start_pod"]
        assert len(starts) == 1 and starts[0]["gpu_uuids"] == [uuid(i) for i in range(GPUS)]
        assert starts[0]["command"] == list(argv)
