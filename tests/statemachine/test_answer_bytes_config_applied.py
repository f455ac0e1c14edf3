"""ApplyConfig's reply (ConfigApplied) names every gang the new configuration downgraded and
every preempting gang it sent back to the queue: up to GROUPS_MAX (16,384) gang ids of up to
NAME_LENGTH_MAX (128) characters, each up to 4 UTF-8 bytes: 16,384 x (512 + 3) = 8,437,760
bytes, over a client's default frame cap less the response's frame (8 MiB - 4 KiB =
8,384,512). The configuration is applied but the administrator gets TOO_LARGE (and again on
every retry of the session's cached reply), so never learns the new version nor which gangs
lost their guarantee. The reply now keeps the names up to a byte budget and counts the rest."""

from __future__ import annotations

import time

import pytest

from statemachine import limits
from statemachine.commands import ApplyConfig, GpuInventory, RegisterNode
from statemachine.result_codec import decode_result, encode_result
from statemachine.results import ConfigApplied, GroupPhase, GroupStatus, NodeRegistered
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
from tests.statemachine.builders import ADMIN, SCHEDULER, Driver, gang, node_principal
from tests.statemachine.one_machine import ANSWER_BYTES_MAX

GANGS = limits.GROUPS_MAX  # one GPU each
GPUS_PER_NODE = limits.GPUS_PER_NODE_MAX
NODES = GANGS // GPUS_PER_NODE


def name(number: int) -> str:
    """The longest gang id, in 4-byte characters, distinct."""
    return "\U0001d4d0" * (limits.NAME_LENGTH_MAX - 1) + chr(0x10000 + number)


def spec(quota: int) -> ClusterSpec:
    return ClusterSpec(
        gpu_models=(GpuModelSpec(name="G", memory_mib=81920),),
        cell_types=(CellTypeSpec(name="P", child="G", child_count=1),
                    CellTypeSpec(name="N", child="P", child_count=GPUS_PER_NODE,
                                 node_level=True),
                    CellTypeSpec(name="R", child="N", child_count=NODES)),
        physical_cells=(PhysicalCellSpec(cell_type="R", nodes=tuple(
            f"n{index}" for index in range(NODES))),),
        virtual_clusters=(VirtualClusterSpec(name="a", quota=(
            QuotaSpec(chain="R", cell_type="N", count=quota),) if quota else ()),),
        policy=PolicySpec())


@pytest.fixture(scope="module")
def applied() -> tuple[State, ConfigApplied]:
    state = State()
    run = Driver(state, checked=False).ok

    started = time.monotonic()
    run(ApplyConfig(expected_version=0, spec=spec(NODES)), ADMIN)  # node cells: few to scan
    for number in range(NODES):
        node = f"n{number}"
        registered = run(RegisterNode(node=node, boot_id="boot-1", gpus=tuple(
            GpuInventory(uuid=f"GPU-{node}-{index}", index=index,
                         pci_bus_id=f"0000:{index:02x}:00.0", model="G", memory_mib=81920)
            for index in range(GPUS_PER_NODE))), node_principal(node))
        assert isinstance(registered, NodeRegistered)
    for number in range(GANGS):
        status = run(gang(name(number), "a", 1, (1, 1)), SCHEDULER)
        assert isinstance(status, GroupStatus) and status.phase is GroupPhase.ALLOCATED
    result = run(ApplyConfig(expected_version=1, spec=spec(0)), ADMIN)  # the quota is gone
    assert isinstance(result, ConfigApplied)
    print(f"built in {time.monotonic() - started:.1f} s")
    return state, result


def test_the_config_reply_fits_a_client_frame(applied: tuple[State, ConfigApplied]) -> None:
    state, result = applied
    size = len(encode_result(result))
    assert size < ANSWER_BYTES_MAX, f"{len(result.downgraded)} gangs named: {size} bytes"
    assert all(group.downgraded for group in state.groups.values()), "every gang downgraded"
    decoded = decode_result(encode_result(result))
    assert isinstance(decoded, ConfigApplied) and decoded.version == 2
    assert list(result.downgraded) == sorted(state.groups)[:len(result.downgraded)]
    assert result.downgraded_omitted == GANGS - len(result.downgraded) > 0
    assert decoded.downgraded_omitted == result.downgraded_omitted and not result.requeued
