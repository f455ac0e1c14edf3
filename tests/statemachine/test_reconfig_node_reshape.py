"""A configuration that changes a node's shape (its GPU model renamed, its GPU count changed)
keeps what is known of its boards: it had wiped their health, so an admin's sticky per-GPU mark
(and a failed GPU's recovery hysteresis) was forgotten once the agent registered the same
boards again. Deregistration keeps them too (node_commands module docstring: "the
admin's cordon, drain and marks and the boards' health stay, as they do across a reboot or a
new configuration (config_commands._carry_nodes)")."""

from __future__ import annotations

from dataclasses import replace

from statemachine.commands import ApplyConfig, Deregister, GpuInventory, MarkBad, RegisterNode
from statemachine.spec import CellTypeSpec, GpuModelSpec
from tests.statemachine.builders import (
    A100_TYPES,
    ADMIN,
    Driver,
    inventory,
    node_principal,
    rack_spec,
)


def _renamed_model_spec():
    """The same cluster with its GPU model renamed (A100 -> A100-80GB): every node's GPUs
    change model, so every node record is rebuilt."""
    spec = rack_spec(racks=2)
    types = tuple(replace(cell_type, child="A100-80GB") if cell_type.child == "A100"
                  else cell_type for cell_type in A100_TYPES)
    assert all(isinstance(cell_type, CellTypeSpec) for cell_type in types)
    return replace(spec, gpu_models=(GpuModelSpec(name="A100-80GB", memory_mib=81920),),
                   cell_types=types)


def _renamed(node: str) -> tuple[GpuInventory, ...]:
    return tuple(replace(gpu, model="A100-80GB") for gpu in inventory(node))


def test_an_admin_gpu_mark_survives_a_reconfiguration_that_renames_the_model() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=2))
    driver.register("n0", "n1", "n2", "n3")
    driver.ok(MarkBad(node="n0", gpu="GPU-n0-3", reason="flaky ECC"), ADMIN)
    record = driver.state.nodes["n0"]
    assert record.health[3].admin_bad == "flaky ECC"
    driver.ok(ApplyConfig(expected_version=1, spec=_renamed_model_spec()), ADMIN)
    # The agent (its [models] table updated) registers the same boards again.
    driver.ok(RegisterNode(node="n0", boot_id="boot-1", gpus=_renamed("n0")),
              node_principal("n0"))
    record = driver.state.nodes["n0"]
    assert record.health[3].admin_bad == "flaky ECC", "the admin's mark was forgotten"
    config = driver.state.configured()
    leaf = config.topology.leaf_of(record.index, 3)
    assert not config.cells.usable[leaf], "a GPU the admin marked bad is placeable again"


def test_a_gpu_mark_survives_a_reconfiguration_while_deregistered_too() -> None:
    """The same through a deregistration first (the record keeps its boards then)."""
    driver = Driver()
    driver.configure(rack_spec(racks=2))
    driver.register("n0", "n1", "n2", "n3")
    driver.ok(MarkBad(node="n0", gpu="GPU-n0-5", reason="xid 79"), ADMIN)
    driver.ok(Deregister(node="n0", force=False), ADMIN)
    driver.ok(ApplyConfig(expected_version=1, spec=_renamed_model_spec()), ADMIN)
    driver.ok(RegisterNode(node="n0", boot_id="boot-2", gpus=_renamed("n0")),
              node_principal("n0"))
    assert driver.state.nodes["n0"].health[5].admin_bad == "xid 79"
