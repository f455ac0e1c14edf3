"""Node commands, accept and reject paths: registration and inventory, incarnation fencing,
heartbeats, health reports, pod acknowledgements and exits, admin marks, cordon, drain and
deregistration. A refused command must leave the state exactly as it was."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from statemachine.commands import (
    AckPodStarted,
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
    RegisterNode,
    ReportHealth,
    ReportPodExit,
    Uncordon,
)
from statemachine.effects import EffectKind
from statemachine.errors import Code
from statemachine.queries import NodeQuery, answer
from statemachine.results import Done, GroupPhase, NodeRegistered, PodBound
from statemachine.sessions import Sessions
from statemachine.snapshot_codec import decode_snapshot, encode_snapshot
from statemachine.state import State
from tests.statemachine.builders import (
    ADMIN,
    SCHEDULER,
    Driver,
    gang,
    inventory,
    node_principal,
    rack_spec,
)
from tests.statemachine.test_scenarios import started


@pytest.fixture
def driver() -> Driver:
    """Two racks; only the first rack's nodes n0 and n1 registered. Tenants: a one node, b
    one rack."""
    driver = Driver()
    driver.configure(rack_spec(racks=2))
    driver.register("n0", "n1")
    return driver


def node_view(state: State, node: str) -> dict[str, Any]:
    view = answer(state, NodeQuery(node=node))
    assert isinstance(view, dict), view
    return view


def snapshot(driver: Driver) -> bytes:
    return encode_snapshot(driver.state, Sessions(), 0)


def refused_unchanged(driver: Driver, command: Command, principal_node: str | None,
                      code: Code) -> str:
    principal = node_principal(principal_node) if principal_node else ADMIN
    before = snapshot(driver)
    message = driver.rejected(command, principal, code).message
    assert snapshot(driver) == before
    return message


def test_registration_fences_incarnations(driver: Driver) -> None:
    again = driver.ok(RegisterNode(node="n0", boot_id="boot-1", gpus=inventory("n0")),
                      node_principal("n0"))
    assert isinstance(again, NodeRegistered) and again.incarnation == 1
    reboot = driver.ok(RegisterNode(node="n0", boot_id="boot-2", gpus=inventory("n0")),
                       node_principal("n0"))
    assert isinstance(reboot, NodeRegistered) and reboot.incarnation == 2
    message = refused_unchanged(driver, Heartbeat(node="n0", incarnation=1), "n0",
                                Code.STALE_INCARNATION)
    assert message == "node n0: incarnation 1, current 2"
    assert isinstance(driver.ok(Heartbeat(node="n0", incarnation=2), node_principal("n0")),
                      Done)


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        (inventory("n1", count=4), "node n1: expected GPU indices 0..7, got [0, 1, 2, 3]"),
        (inventory("n1", model="H100"), "node n1: GPU 0 is a H100, the configuration says A100"),
        (inventory("n0"), "node n1: GPU GPU-n0-0 is already registered on node n0"),
        (tuple(replace(gpu, uuid="GPU-same") for gpu in inventory("n1")),
         "node n1: duplicate GPU UUIDs"),
    ],
)
def test_inventory_must_match_the_configuration(driver: Driver, gpus: tuple[GpuInventory, ...],
                                                message: str
                                                ) -> None:
    command = RegisterNode(node="n1", boot_id="boot-9", gpus=gpus)
    assert refused_unchanged(driver, command, "n1", Code.INVENTORY_MISMATCH) == message


def test_unknown_and_unregistered_nodes_are_refused(driver: Driver) -> None:
    command = RegisterNode(node="n9", boot_id="b", gpus=inventory("n9"))
    refused_unchanged(driver, command, "n9", Code.UNKNOWN_NODE)
    driver.ok(Deregister(node="n1", force=False), ADMIN)
    refused_unchanged(driver, Heartbeat(node="n1", incarnation=1), "n1", Code.NOT_REGISTERED)


def test_a_reboot_hands_running_pods_back_to_the_agent(driver: Driver) -> None:
    driver.submit(gang("job", "a", 0, (1, 8)))
    started(driver, "job")
    node = driver.state.configured().topology.node_ids[driver.state.groups["job"].pods[0].node]
    result = driver.ok(RegisterNode(node=node, boot_id="boot-2", gpus=inventory(node)),
                       node_principal(node))
    assert isinstance(result, NodeRegistered)
    assert [pod.pod_uid for pod in result.pods] == ["job-0-0"]
    assert result.pods[0].gpu_uuids == tuple(f"GPU-{node}-{index}" for index in range(8))
    assert not result.pods[0].evicting
    assert driver.state.groups["job"].pods[0].phase.value == "bound"


def test_health_reports_name_only_the_nodes_gpus(driver: Driver) -> None:
    report = ReportHealth(node="n0", incarnation=1, reports=(
        HealthReport(uuid="GPU-n1-0", status=HealthStatus.FAIL, reason="x"),))
    message = refused_unchanged(driver, report, "n0", Code.UNKNOWN_GPU)
    assert message == "node n0 has no GPU GPU-n1-0"
    ok = driver.ok(replace(report, reports=(
        HealthReport(uuid="GPU-n0-1", status=HealthStatus.WARN, reason="hot"),)),
        node_principal("n0"))
    assert ok == Done(note="0 failed, 0 recovered")
    health = driver.state.nodes["n0"].health[1]
    assert (health.status, health.reason, health.failed) == (HealthStatus.WARN, "hot", False)


def test_marks_and_clears(driver: Driver) -> None:
    cells = driver.state.configured().cells
    refused_unchanged(driver, MarkBad(node="n0", gpu="GPU-x", reason="r"), None,
                      Code.UNKNOWN_GPU)
    driver.ok(MarkBad(node="n0", gpu="", reason="bad fan"), ADMIN)
    assert cells.free[driver.state.configured().topology.node_cell[0]] == 0
    driver.ok(ClearBad(node="n0", gpu=""), ADMIN)
    assert cells.free[driver.state.configured().topology.node_cell[0]] == 8
    driver.ok(ReportHealth(node="n0", incarnation=1, reports=(
        HealthReport(uuid="GPU-n0-2", status=HealthStatus.FAIL, reason="xid 79"),)),
        node_principal("n0"))
    driver.ok(ClearBad(node="n0", gpu="GPU-n0-2"), ADMIN)
    assert cells.free[driver.state.configured().topology.node_cell[0]] == 8


def test_cordon_drain_and_uncordon(driver: Driver) -> None:
    driver.submit(gang("job", "b", 0, (2, 8)))
    started(driver, "job")
    driver.ok(Cordon(node="n1"), ADMIN)
    assert driver.state.groups["job"].phase is GroupPhase.ALLOCATED
    result = driver.ok(Drain(node="n1"), ADMIN)
    assert result == Done(note="node n1 draining; evicting job")
    assert driver.state.groups["job"].evicting == "node n1 drained"
    kills = [(effect.node, effect.pod_uid) for effect in driver.state.outbox.effects
             if effect.kind is EffectKind.KILL_POD]
    assert kills == [("n0", "job-0-0"), ("n1", "job-0-1")]
    driver.ok(Uncordon(node="n1"), ADMIN)
    assert not driver.state.nodes["n1"].draining


def test_deregistering_a_busy_node_needs_force(driver: Driver) -> None:
    driver.submit(gang("job", "b", 0, (2, 8)))
    message = refused_unchanged(driver, Deregister(node="n0", force=False), None,
                                Code.NODE_BUSY)
    assert message == "node n0 holds gangs job"
    driver.ok(Deregister(node="n0", force=True), ADMIN)
    assert "job" not in driver.state.groups
    assert not driver.state.nodes["n0"].registered
    assert "GPU-n0-0" not in driver.state.uuid_owner


def test_deregistering_keeps_the_admins_marks_and_the_gpus_health(driver: Driver) -> None:
    """Deregister built a blank record, and the agent registers again at once: a cordoned,
    drained or marked node, or one with a failed GPU, came back in the pool."""
    cells = driver.state.configured().cells
    topology = driver.state.configured().topology
    driver.ok(ReportHealth(node="n0", incarnation=1, reports=(
        HealthReport(uuid="GPU-n0-2", status=HealthStatus.FAIL, reason="xid 79"),)),
        node_principal("n0"))
    driver.ok(MarkBad(node="n0", gpu="GPU-n0-5", reason="bad memory"), ADMIN)
    driver.ok(Drain(node="n1"), ADMIN)
    driver.ok(MarkBad(node="n1", gpu="", reason="bad fan"), ADMIN)
    for node in ("n0", "n1"):
        driver.ok(Deregister(node=node, force=False), ADMIN)
        assert not driver.state.nodes[node].registered
        assert node_view(driver.state, node)["gpus_registered"] == 0
    assert not any(uuid.startswith(("GPU-n0-", "GPU-n1-")) for uuid in driver.state.uuid_owner)
    driver.register("n0", "n1", boot="boot-2")
    assert driver.incarnations == {"n0": 2, "n1": 2}
    n0 = driver.state.nodes["n0"]
    assert n0.health[2].failed and n0.health[2].reason == "xid 79"
    assert n0.health[5].admin_bad == "bad memory"
    assert [cells.usable[topology.leaf_of(0, index)] for index in range(8)] == [
        index not in (2, 5) for index in range(8)]
    n1 = driver.state.nodes["n1"]
    assert n1.cordoned and n1.draining and n1.admin_bad == "bad fan"
    assert cells.free[topology.node_cell[1]] == 0
    assert driver.submit(gang("job", "b", 0, (2, 8))).phase is GroupPhase.PENDING
    restored, _, _ = decode_snapshot(snapshot(driver))
    assert restored.uuid_owner == driver.state.uuid_owner


def test_a_board_moved_off_a_deregistered_node_registers_elsewhere(driver: Driver) -> None:
    """A deregistered node keeps its boards' health but owns none of their UUIDs: one moved
    to another node registers there, and the first node cannot register it again."""
    driver.ok(Deregister(node="n1", force=False), ADMIN)
    moved = tuple(replace(gpu, uuid="GPU-n1-0") if gpu.index == 0 else gpu
                  for gpu in inventory("n2"))
    driver.ok(RegisterNode(node="n2", boot_id="boot-1", gpus=moved), node_principal("n2"))
    assert driver.state.uuid_owner["GPU-n1-0"] == "n2"
    refused_unchanged(driver, RegisterNode(node="n1", boot_id="boot-2", gpus=inventory("n1")),
                      "n1", Code.INVENTORY_MISMATCH)
    driver.ok(Deregister(node="n1", force=False), ADMIN)  # again: n2 keeps its board
    assert driver.state.uuid_owner["GPU-n1-0"] == "n2"
    restored, _, _ = decode_snapshot(snapshot(driver))
    assert restored.uuid_owner == driver.state.uuid_owner


def test_pod_acknowledgements_are_checked(driver: Driver) -> None:
    driver.submit(gang("job", "a", 0, (1, 2)))
    bound = driver.ok(bind_first("job"), SCHEDULER)
    assert isinstance(bound, PodBound)
    other = "n1" if bound.node == "n0" else "n0"
    ack = AckPodStarted(node=bound.node, incarnation=1, group="job", pod_uid="p",
                        gpu_uuids=bound.gpu_uuids)
    assert refused_unchanged(driver, replace(ack, node=other), other,
                             Code.POD_MISMATCH) == f"pod p is not placed on {other}"
    assert refused_unchanged(driver, replace(ack, pod_uid="q"), bound.node,
                             Code.UNKNOWN_POD) == "gang job has no pod 'q'"
    assert refused_unchanged(driver, replace(ack, group="nope"), bound.node,
                             Code.UNKNOWN_GROUP) == "no gang 'nope'"
    wrong = replace(ack, gpu_uuids=bound.gpu_uuids[::-1])
    assert refused_unchanged(driver, wrong, bound.node, Code.POD_MISMATCH).startswith(
        "pod p was given")
    driver.ok(ack, node_principal(bound.node))
    exit_ = ReportPodExit(node=bound.node, incarnation=1, group="job", pod_uid="p",
                          exit_code=0)
    driver.ok(exit_, node_principal(bound.node))
    assert "job" not in driver.state.groups, "a gang whose pods all exited is released"


def bind_first(group: str) -> BindPod:
    return BindPod(group=group, member=0, pod_uid="p")


def test_the_measured_topology_is_kept_and_checked(driver: Driver) -> None:
    """NUMA nodes, MIG modes and the GPU links an agent measured are kept with the node (shown
    to operators, kept in snapshots); links naming GPUs the node lacks are refused."""
    gpus = tuple(replace(gpu, numa_node=gpu.index // 4, mig_enabled=gpu.index == 7)
                 for gpu in inventory("n2"))
    links = (GpuLink(a=1, b=2, level=10, nvlinks=0), GpuLink(a=0, b=1, level=0, nvlinks=12))
    refused_unchanged(driver, RegisterNode(node="n2", boot_id="b", gpus=gpus, links=(
        GpuLink(a=3, b=8, level=10, nvlinks=0),)), "n2", Code.INVENTORY_MISMATCH)
    refused_unchanged(driver, RegisterNode(node="n2", boot_id="b", gpus=gpus, links=(
        links[0], links[0])), "n2", Code.INVENTORY_MISMATCH)
    driver.ok(RegisterNode(node="n2", boot_id="b", gpus=gpus, links=links),
              node_principal("n2"))
    view = node_view(driver.state, "n2")
    assert view["links"] == [{"a": 0, "b": 1, "level": 0, "nvlinks": 12},
                             {"a": 1, "b": 2, "level": 10, "nvlinks": 0}]
    assert [(gpu["numa_node"], gpu["mig_enabled"]) for gpu in view["gpus"]][6:] == [
        (1, False), (1, True)]
    restored, _, _ = decode_snapshot(snapshot(driver))
    assert restored.nodes["n2"].links == driver.state.nodes["n2"].links
    assert restored.nodes["n2"].gpus == gpus


def test_registering_again_repeats_the_kills_of_a_gang_being_evicted(driver: Driver) -> None:
    """An agent cut off while its node's outbox was trimmed never saw the kill: each
    registration tells it again, for its own node's pods only."""
    driver.submit(gang("job", "b", 0, (2, 8)))
    started(driver, "job")
    driver.ok(Drain(node="n1"), ADMIN)
    before = driver.state.outbox.next_index
    driver.register("n0")  # the same boot: the pod still runs there
    again = [(effect.node, effect.pod_uid, effect.reason) for effect in driver.state.outbox.effects
             if effect.kind is EffectKind.KILL_POD and effect.index >= before]
    assert again == [("n0", "job-0-0", "node n1 drained")]
    driver.ok(ReportPodExit(node="n0", incarnation=driver.incarnations["n0"], group="job",
                            pod_uid="job-0-0", exit_code=137, reason="killed"),
              node_principal("n0"))
    driver.ok(ReportPodExit(node="n1", incarnation=driver.incarnations["n1"], group="job",
                            pod_uid="job-0-1", exit_code=137, reason="killed"),
              node_principal("n1"))
    assert "job" not in driver.state.groups


def test_a_registration_marks_the_pods_of_a_gang_being_evicted(driver: Driver) -> None:
    """The agent must not start a pod the store already asked to stop: it reports it exited."""
    driver.submit(gang("job", "b", 0, (2, 8)))
    for pod in driver.state.groups["job"].pods:
        driver.ok(BindPod(group="job", member=pod.member,
                          pod_uid=f"job-{pod.member}-{pod.index}"), SCHEDULER)
    driver.ok(Drain(node="n1"), ADMIN)
    result = driver.ok(RegisterNode(node="n0", boot_id="boot-2", gpus=inventory("n0")),
                       node_principal("n0"))
    assert isinstance(result, NodeRegistered)
    assert [(pod.pod_uid, pod.evicting) for pod in result.pods] == [("job-0-0", True)]


LOST = HealthReport(uuid="GPU-n0-3", status=HealthStatus.FAIL,
                    reason="missing from NVML's device list")


def test_a_registration_applies_its_health_before_placing(driver: Driver) -> None:
    """GPU 3 falls off the bus while n0's agent is away; the store keeps it passing across
    registrations. The registration's own scheduling pass placed a waiting gang on it, and
    only the agent's health report that followed failed the gang: the registration carries
    the agent's reading, applied before that pass."""
    for node in ("n0", "n1"):
        driver.ok(Deregister(node=node, force=False), ADMIN)
    assert driver.submit(gang("whole", "a", 5, (1, 8))).phase is GroupPhase.PENDING
    result = driver.ok(RegisterNode(node="n0", boot_id="boot-2", gpus=inventory("n0"),
                                    health=(LOST,)), node_principal("n0"))
    assert isinstance(result, NodeRegistered) and result.pods == ()
    group = driver.state.groups["whole"]
    assert (group.phase, group.failures) == (GroupPhase.PENDING, ())
    health = driver.state.nodes["n0"].health[3]
    assert (health.status, health.reason, health.failed) == (HealthStatus.FAIL, LOST.reason,
                                                             True)
    assert node_view(driver.state, "n0")["gpus"][3]["placeable"] is False


def test_a_registration_reports_failures_under_gangs_as_a_health_report_does(
        driver: Driver) -> None:
    """A reboot whose GPU did not come back: the gang on it is told at the registration."""
    driver.submit(gang("job", "a", 0, (1, 8)))
    started(driver, "job")
    node = driver.state.configured().topology.node_ids[driver.state.groups["job"].pods[0].node]
    lost = replace(LOST, uuid=f"GPU-{node}-3")
    driver.ok(RegisterNode(node=node, boot_id="boot-2", gpus=inventory(node), health=(lost,)),
              node_principal(node))
    assert driver.state.groups["job"].failures == ((lost.uuid, f"failed: {lost.reason}"),)
    assert [effect.group for effect in driver.state.outbox.effects
            if effect.kind is EffectKind.GANG_FAILURE] == ["job"]


def test_a_registrations_health_names_only_the_gpus_it_registers(driver: Driver) -> None:
    command = RegisterNode(node="n0", boot_id="boot-2", gpus=inventory("n0"), health=(
        replace(LOST, uuid="GPU-n1-3"),))
    message = refused_unchanged(driver, command, "n0", Code.UNKNOWN_GPU)
    assert message == "node n0 registers no GPU GPU-n1-3"
