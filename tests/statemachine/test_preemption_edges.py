"""Preemption at its edges: a victim's id reused, a reservation on a GPU that fails, a
preemptor sent back to the queue, a tenant removed while its gang preempts, a node agent that
registers again. Each case was once wrong (see the commit that added this file)."""

from __future__ import annotations

from dataclasses import replace

from statemachine.apply import apply
from statemachine.commands import (
    ApplyConfig,
    BindPod,
    Cordon,
    Drain,
    HealthReport,
    HealthStatus,
    MarkBad,
    RegisterNode,
    ReportHealth,
    Uncordon,
)
from statemachine.context import Context
from statemachine.effect_codec import EFFECT_BYTES_MAX
from statemachine.effects import EffectKind
from statemachine.nodes import Liveness
from statemachine.queries import EffectsQuery, answer
from statemachine.results import GroupPhase, GroupStatus
from statemachine.spec import CellTypeSpec, PhysicalCellSpec, PolicySpec
from tests.statemachine.builders import (
    ADMIN,
    SCHEDULER,
    Driver,
    gang,
    inventory,
    node_principal,
    rack_spec,
    vc,
)
from tests.statemachine.test_scenarios import exit_all, started

ONE_NODE_TENANT = (vc("a", ("A100-RACK", "A100-NODE", 1)),)


def preemptor_waiting_on_two_victims() -> Driver:
    """P (guaranteed, 8 GPUs of n0) waits on V and W (opportunistic, 4 GPUs each); then V
    leaves and a new gang takes the id V."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=ONE_NODE_TENANT,
                               policy=PolicySpec(preemption_grace_ms=1_000)))
    driver.register("n0", "n1")
    driver.ok(Cordon(node="n1"), ADMIN)
    for name in ("V", "W"):
        driver.submit(gang(name, "a", -1, (1, 4)))
        started(driver, name)
    driver.submit(gang("P", "a", 10, (1, 8)))
    assert list(driver.state.groups["P"].victims) == ["V", "W"]
    exit_all(driver, "V")
    assert "V" not in driver.state.groups
    assert list(driver.state.groups["P"].victims) == ["W"]
    driver.ok(Uncordon(node="n1"), ADMIN)
    return driver


def test_a_new_gang_under_a_released_victims_id_is_left_alone() -> None:
    driver = preemptor_waiting_on_two_victims()
    driver.submit(gang("V", "a", -1, (1, 2)))
    started(driver, "V")
    effects_before = len(driver.state.outbox.effects)
    driver.tick(step_ms=5_000)  # past P's deadline: the kills are sent again
    assert "V" in driver.state.groups
    resent = [effect for effect in driver.state.outbox.effects[effects_before:]
              if effect.kind is EffectKind.KILL_POD]
    assert [effect.group for effect in resent] == ["W"]


def test_a_pending_gang_under_a_released_victims_id_is_not_released() -> None:
    driver = preemptor_waiting_on_two_victims()
    driver.ok(Cordon(node="n1"), ADMIN)  # the new V stays pending, with no nodes
    assert driver.submit(gang("V", "a", -1, (1, 2))).phase is GroupPhase.PENDING
    driver.tick(step_ms=5_000)
    assert driver.state.groups["V"].phase is GroupPhase.PENDING


def preempting_on_two_nodes() -> Driver:
    """g (guaranteed, 8 GPUs) reserves one node from opp (opportunistic, both nodes)."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=ONE_NODE_TENANT))
    driver.register("n0", "n1")
    driver.submit(gang("opp", "a", -1, (2, 8)))
    started(driver, "opp")
    assert driver.submit(gang("g", "a", 10, (1, 8))).phase is GroupPhase.PREEMPTING
    return driver


def reserved_node(driver: Driver) -> str:
    topology = driver.state.configured().topology
    return topology.node_ids[driver.state.groups["g"].pods[0].node]


def test_a_preemptor_whose_reserved_gpu_fails_queues_again() -> None:
    driver = preempting_on_two_nodes()
    node = reserved_node(driver)
    driver.ok(ReportHealth(node=node, incarnation=driver.incarnations[node], reports=(
        HealthReport(uuid=f"GPU-{node}-0", status=HealthStatus.FAIL, reason="xid 79"),)),
        node_principal(node))
    assert driver.state.groups["g"].phase is GroupPhase.PENDING
    exit_all(driver, "opp")
    group = driver.state.groups["g"]
    assert group.phase is GroupPhase.ALLOCATED
    assert reserved_node(driver) != node  # placed on the healthy node, not the failed GPU


def test_a_preemptor_whose_reserved_node_is_suspect_at_the_end_queues_again() -> None:
    driver = preempting_on_two_nodes()
    node = reserved_node(driver)
    exit_all(driver, "opp", on_node="n1" if node == "n0" else "n0")
    driver.tick(step_ms=driver.state.policy.lease_ms + 1)  # no heartbeats: nodes suspect
    assert driver.state.nodes[node].liveness is Liveness.SUSPECT
    exit_all(driver, "opp", on_node=node)  # the last victim leaves a GPU that is not usable
    assert driver.state.groups["g"].phase is GroupPhase.PENDING


def test_a_preemptor_sent_back_to_the_queue_frees_its_reserved_gpus_for_others() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-RACK", 1)),)))
    driver.register("n0", "n1")
    driver.submit(gang("V", "a", -1, (1, 8)))
    driver.ok(BindPod(group="V", member=0, pod_uid="v0"), SCHEDULER)
    assert driver.submit(gang("P", "a", 10, (2, 8))).phase is GroupPhase.PREEMPTING
    assert driver.submit(gang("O", "a", -1, (1, 4))).phase is GroupPhase.PENDING
    victim_node = driver.state.configured().topology.node_ids[
        driver.state.groups["V"].pods[0].node]
    driver.ok(Drain(node=victim_node), ADMIN)
    assert driver.state.groups["P"].phase is GroupPhase.PENDING
    driver.heartbeat_all()
    driver.tick()
    assert driver.state.groups["O"].phase is GroupPhase.ALLOCATED


def test_removing_a_tenant_while_its_gang_preempts_releases_the_gang() -> None:
    driver = Driver()
    driver.configure(rack_spec())
    driver.register(*(f"n{index}" for index in range(6)))
    driver.submit(gang("opp", "b", -1, (6, 8)))
    for index in range(6):
        driver.ok(BindPod(group="opp", member=0, pod_uid=f"p{index}"), SCHEDULER)
    assert driver.submit(gang("g", "a", 10, (1, 8))).phase is GroupPhase.PREEMPTING
    without_a = rack_spec(quota=(vc("b", ("A100-RACK", "A100-RACK", 1)),))
    driver.ok(ApplyConfig(expected_version=1, spec=without_a), ADMIN)
    assert "g" not in driver.state.groups
    assert "opp" in driver.state.groups


def test_registering_again_keeps_each_remaining_gpus_health() -> None:
    driver = Driver()
    driver.configure(rack_spec())
    driver.register("n0")
    driver.ok(MarkBad(node="n0", gpu="GPU-n0-3", reason="bad HBM"), ADMIN)
    driver.ok(ReportHealth(node="n0", incarnation=driver.incarnations["n0"], reports=(
        HealthReport(uuid="GPU-n0-2", status=HealthStatus.FAIL, reason="xid 79"),
        HealthReport(uuid="GPU-n0-7", status=HealthStatus.FAIL, reason="xid 48"))),
        node_principal("n0"))
    gpus = list(inventory("n0"))
    gpus[7] = replace(gpus[7], uuid="GPU-n0-7-new")  # one board swapped
    driver.ok(RegisterNode(node="n0", boot_id="boot-2", gpus=tuple(gpus)), node_principal("n0"))
    health = driver.state.nodes["n0"].health
    assert health[2].failed and health[3].admin_bad == "bad HBM"
    assert not health[7].failed  # the new board starts healthy


def test_a_preemption_of_hundreds_of_gangs_leaves_every_effect_readable() -> None:
    """A gang preempts 576 gangs with long ids. Its GANG_PREEMPTING effect must still pack
    under EFFECT_BYTES_MAX, or no one could read the outbox past it."""
    nodes = tuple(f"b{index}" for index in range(9))
    spec = replace(rack_spec(), cell_types=(
        CellTypeSpec(name="BIG", child="A100", child_count=64, node_level=True),),
        physical_cells=tuple(PhysicalCellSpec(cell_type="BIG", nodes=(node,))
                             for node in nodes),
        virtual_clusters=(vc("a", ("BIG", "BIG", 9)),))
    driver = Driver()
    driver.configure(spec)
    driver.register(*nodes, count=64)
    for index in range(9 * 64):  # straight through `apply`: invariants once, below
        command = gang(f"{index:03d}-" + "x" * 121, "a", -1, (1, 1))
        context = Context(principal=SCHEDULER, now_ms=driver.now_ms)
        assert isinstance(apply(driver.state, command, context), GroupStatus)
    driver.submit(gang("P", "a", 0, (9, 64)))
    assert driver.state.groups["P"].phase is GroupPhase.ALLOCATED
    assert max(len(packed) for packed in driver.state.outbox.packed) <= EFFECT_BYTES_MAX
    effects = answer(driver.state, EffectsQuery(after=0, node="", limit=4096))
    assert isinstance(effects, dict)
    kinds = [effect["kind"] for effect in effects["effects"]]
    assert kinds.count(EffectKind.GANG_PREEMPTING.value) == 1
