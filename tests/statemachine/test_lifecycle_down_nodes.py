"""Lifecycle edge cases of eviction and preemption: a victim or drained gang whose only live
pod is on a Down node is released (nothing else would ever free its other GPUs), a forced
deregistration requeues a preemptor that only reserved GPUs there (as a drain does), and a
drained node given a new shape by a reconfiguration stays draining."""

from __future__ import annotations

from dataclasses import replace as dc_replace

from statemachine.commands import ApplyConfig, Cordon, Deregister, Drain, Heartbeat
from statemachine.effects import EffectKind
from statemachine.nodes import Liveness
from statemachine.results import GroupPhase
from statemachine.spec import CellTypeSpec, GpuModelSpec, PhysicalCellSpec, PolicySpec
from tests.statemachine.builders import ADMIN, Driver, gang, node_principal, rack_spec, vc
from tests.statemachine.test_scenarios import exit_all, started

POLICY = PolicySpec(lease_ms=3_000, down_after_ms=3_000, preemption_grace_ms=1_000)


def test_a_victim_whose_only_live_pod_is_on_a_down_node_is_released_at_the_deadline() -> None:
    """V (2 pods, one per node) is preempted by P, which reserves one node. The pod on P's node
    exits; the other node dies before its agent can report. Every live pod of V is on a Down
    node: at the preemption deadline V must be released and P allocated. The check looked at
    every node V was placed on, exited pods' nodes included, so P waited for ever."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-RACK", 1)),),
                               policy=POLICY))
    driver.register("n0", "n1")
    driver.submit(gang("V", "a", 0, (2, 8)))
    started(driver, "V")
    status = driver.submit(gang("P", "a", 5, (1, 8)))
    assert status.phase is GroupPhase.PREEMPTING
    topology = driver.state.configured().topology
    reserved = topology.node_ids[driver.state.groups["P"].pods[0].node]
    other = "n1" if reserved == "n0" else "n0"
    exit_all(driver, "V", on_node=reserved)  # P's node is vacated
    assert driver.state.groups["V"].evicting
    # `other` goes silent; `reserved` keeps heartbeating, through Suspect and Down of `other`.
    for _ in range(6):
        driver.ok(Heartbeat(node=reserved, incarnation=driver.incarnations[reserved]),
                  node_principal(reserved))
        driver.tick(step_ms=2_000)
    assert driver.state.nodes[other].liveness is Liveness.DOWN
    assert driver.state.nodes[reserved].liveness is Liveness.UP
    assert "V" not in driver.state.groups, "a victim whose live pods are all on Down nodes stays"
    assert driver.state.groups["P"].phase is GroupPhase.ALLOCATED


def test_a_drained_gang_whose_only_live_pod_is_on_a_down_node_frees_its_other_gpus() -> None:
    """G (KEEP policy, one pod per node) is drained off n1, whose node is dead. The pod on n0
    is killed and exits; the pod on the Down n1 can never report. G keeps all 8 healthy GPUs
    of n0 for ever (a preemption victim in the same spot is released at the deadline)."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-RACK", 1)),),
                               policy=POLICY))
    driver.register("n0", "n1")
    driver.submit(gang("G", "a", 0, (2, 8)))
    started(driver, "G")
    for _ in range(6):  # n1 goes silent and Down; n0 keeps its lease
        driver.ok(Heartbeat(node="n0", incarnation=driver.incarnations["n0"]),
                  node_principal("n0"))
        driver.tick(step_ms=2_000)
    assert driver.state.nodes["n1"].liveness is Liveness.DOWN
    assert "G" in driver.state.groups  # KEEP: the gang stays while n1 is down
    driver.ok(Drain(node="n1"), ADMIN)
    assert driver.state.groups["G"].evicting
    exit_all(driver, "G", on_node="n0")
    for _ in range(3):
        driver.ok(Heartbeat(node="n0", incarnation=driver.incarnations["n0"]),
                  node_principal("n0"))
        driver.tick(step_ms=2_000)
    assert "G" not in driver.state.groups, "n0's GPUs stay held by a gang that left them"


def test_a_drained_node_given_a_new_shape_by_a_reconfiguration_stays_draining() -> None:
    """node_commands' docstring: the admin's cordon, drain and marks stay across a new
    configuration. A node whose GPUs change in the new spec (A100 rack node -> T4 node) kept
    its cordon and mark but lost its drain."""
    driver = Driver()
    base = rack_spec(racks=2, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),), policy=POLICY)
    driver.configure(base)
    driver.register("n0", "n1", "n2", "n3")
    driver.ok(Drain(node="n3"), ADMIN)
    assert driver.state.nodes["n3"].draining
    t4 = CellTypeSpec(name="T4-NODE", child="T4", child_count=4, node_level=True)
    reshaped = dc_replace(
        base, gpu_models=(*base.gpu_models, GpuModelSpec(name="T4", memory_mib=16384)),
        cell_types=(*base.cell_types, t4),
        physical_cells=(base.physical_cells[0], PhysicalCellSpec(cell_type="T4-NODE",
                                                                  nodes=("n3",))))
    driver.ok(ApplyConfig(expected_version=1, spec=reshaped), ADMIN)
    record = driver.state.nodes["n3"]
    assert record.cordoned
    assert record.draining, "the drain was dropped by the reconfiguration"


def test_a_forced_deregistration_requeues_a_preemptor_that_only_reserved_gpus_there() -> None:
    """P preempts V on n0 (P never ran). Deregister(n0, force) released P as if it ran there:
    the submission is gone. Drain of the same node requeues P; so should this."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),),
                               policy=POLICY))
    driver.register("n0", "n1")
    driver.ok(Cordon(node="n1"), ADMIN)
    driver.submit(gang("V", "a", -1, (1, 8)))
    started(driver, "V")
    assert driver.submit(gang("P", "a", 5, (1, 8))).phase is GroupPhase.PREEMPTING
    driver.ok(Deregister(node="n0", force=True), ADMIN)
    assert "V" not in driver.state.groups
    assert "P" in driver.state.groups, "a gang that never ran on the node was deleted"
    assert driver.state.groups["P"].phase is GroupPhase.PENDING


def test_nodes_down_in_one_tick_are_told_to_each_gang_once() -> None:
    """Every node of a gang goes Down in the same Tick (the agents cut off together): the gang
    gets one failure announcement naming all their GPUs, not one per node, each of which had
    recomputed the gang's failures over all its GPUs (a Tick downing 1,920 nodes under
    1,024-pod gangs made 1.98 million such lookups, a second of one apply)."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-RACK", 1)),),
                               policy=POLICY))
    driver.register("n0", "n1")
    driver.submit(gang("G", "a", 0, (2, 8)))
    started(driver, "G")
    for _ in range(4):  # both go silent: Suspect, then Down in one Tick
        driver.tick(step_ms=2_000)
    assert {driver.state.nodes[node].liveness for node in ("n0", "n1")} == {Liveness.DOWN}
    assert [effect.group for effect in driver.state.outbox.effects
            if effect.kind is EffectKind.GANG_FAILURE] == ["G"]
    assert len(driver.state.groups["G"].failures) == 16
