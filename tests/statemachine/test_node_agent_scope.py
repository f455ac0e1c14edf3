"""A node agent acts and reads only for its own node.

Commands: every node command another node's agent could aim at this node (a heartbeat in its
name, a registration or a health report naming its GPUs, a pod acknowledgement or exit of a pod
placed on it) is refused, with the state unchanged. Queries: a gang's whole status named the
gang's other nodes, their pods and, in its failure lines, their GPUs' UUIDs, and the gate let
any node agent ask it of any gang; an agent now sees only its own node's share of a gang, and a
gang with none of its pods is answered unknown, as one that does not exist. An agent that asks
for the whole gang (one of a build before the share, in a rolling upgrade) gets that share,
not a refusal its StoreLink would retry for ever; one naming another node is refused.
"""

from __future__ import annotations

from typing import Any

import pytest

from consensus.codec import unpack
from consensus.envelope import Principal, Role
from consensus.errors import QueryRefused
from statemachine.commands import (
    AckPodStarted,
    Command,
    HealthReport,
    HealthStatus,
    Heartbeat,
    RegisterNode,
    ReportHealth,
    ReportPodExit,
)
from statemachine.errors import Code
from statemachine.lifecycle import pod_uuids
from statemachine.machine import Machine
from statemachine.query_codec import encode_query
from statemachine.snapshot_codec import encode_snapshot
from tests.statemachine.builders import ADMIN, SCHEDULER, Driver, gang, inventory, rack_spec
from tests.statemachine.test_scenarios import started

N0 = Principal(Role.NODE, "n0")
N1 = Principal(Role.NODE, "n1")


def two_node_gang() -> Driver:
    """n0 and n1 registered; gang "wide" runs one 8-GPU pod on each (tenant b: one rack,
    failures kept), and n1's GPU 3 failed under it."""
    driver = Driver()
    driver.configure(rack_spec(racks=2))
    driver.register("n0", "n1")
    driver.submit(gang("wide", "b", 0, (2, 8)))
    started(driver, "wide")
    driver.ok(ReportHealth(node="n1", incarnation=driver.incarnations["n1"], reports=(
        HealthReport(uuid="GPU-n1-3", status=HealthStatus.FAIL, reason="xid 79"),)), N1)
    assert driver.state.groups["wide"].failures  # kept: tenant b's policy
    return driver


def machine_of(driver: Driver) -> Machine:
    machine = Machine()
    machine.state = driver.state
    return machine


def ask(machine: Machine, principal: Principal, **fields: Any) -> dict[str, Any]:
    """What `principal` gets for a group query, as the server would answer it: the gate's
    refusal, or the machine's answer to the query the gate admitted."""
    try:
        query = machine.admit_query(principal, encode_query("group", **fields))
    except QueryRefused as refused:
        return {"refused": refused.reason}
    answer: dict[str, Any] = unpack(machine.query(query), bytes_max=1 << 24, what="answer")
    return answer


def test_a_node_agent_asking_for_a_whole_gang_gets_its_nodes_share() -> None:
    machine = machine_of(two_node_gang())
    for principal, node in ((N0, "n0"), (N1, "n1")):
        whole = ask(machine, principal, group="wide")
        assert whole == ask(machine, principal, group="wide", node=node)
        assert whole["ok"] and [pod["node"] for pod in whole["pods"]] == [node]
    assert ask(machine, N0, group="wide", node="n1") == {
        "refused": "node:n0 may ask only about node 'n0': not GroupQuery for 'n1'"}
    for principal in (ADMIN, SCHEDULER):  # the whole gang, as before
        answer = ask(machine, principal, group="wide")
        assert answer["ok"] and {pod["node"] for pod in answer["pods"]} == {"n0", "n1"}
        assert answer["failures"] == ["GPU-n1-3: failed: xid 79"]


def test_a_node_agent_reads_its_own_nodes_share_of_a_gang() -> None:
    machine = machine_of(two_node_gang())
    mine = ask(machine, N0, group="wide", node="n0")
    assert mine["ok"] and mine["phase"] == "allocated" and mine["evicting"] == ""
    assert [(pod["node"], pod["pod_uid"], pod["phase"]) for pod in mine["pods"]] == [
        ("n0", mine["pods"][0]["pod_uid"], "running")]
    assert mine["failures"] == [] and mine["failures_omitted"] == 0  # n1's GPU: not n0's
    assert mine["victims"] == [] and mine["doomed"] == {}
    theirs = ask(machine, N1, group="wide", node="n1")
    assert [pod["node"] for pod in theirs["pods"]] == ["n1"]
    assert theirs["failures"] == ["GPU-n1-3: failed: xid 79"]
    # An administrator may ask any node's share too.
    assert ask(machine, ADMIN, group="wide", node="n1") == theirs


def test_a_gang_without_the_nodes_pods_is_answered_unknown() -> None:
    driver = two_node_gang()
    driver.submit(gang("queued", "b", 0, (1, 8)))  # the rack is full: pending
    machine = machine_of(driver)
    before = encode_snapshot(driver.state, machine.sessions, 0)
    for group in ("queued", "absent"):
        for fields in ({"node": "n0"}, {}):  # naming its node, or narrowed to it
            assert ask(machine, N0, group=group, **fields) == {
                "ok": False, "code": "unknown_group",
                "message": f"no gang {group!r} on node 'n0'"}
    assert ask(machine, N0, group="wide", node="n2") == {  # a configured node without pods
        "refused": "node:n0 may ask only about node 'n0': not GroupQuery for 'n2'"}
    assert ask(machine, ADMIN, group="wide", node="n2")["code"] == "unknown_group"
    assert ask(machine, ADMIN, group="wide", node="n9")["code"] == "unknown_node"
    assert encode_snapshot(driver.state, machine.sessions, 0) == before


def cross_node_commands(driver: Driver) -> list[tuple[Command, Code]]:
    """What n1's agent could send to act on n0, and the refusal each gets."""
    incarnation = driver.incarnations["n1"]
    group = driver.state.groups["wide"]
    position, on_n0 = next((position, pod) for position, pod in enumerate(group.pods)
                           if pod.node == 0)
    theirs = pod_uuids(driver.state, group, position)
    return [
        (Heartbeat(node="n0", incarnation=driver.incarnations["n0"]), Code.UNAUTHORIZED),
        (RegisterNode(node="n0", boot_id="b", gpus=inventory("n0")), Code.UNAUTHORIZED),
        (RegisterNode(node="n1", boot_id="b", gpus=inventory("n0")), Code.INVENTORY_MISMATCH),
        (RegisterNode(node="n1", boot_id="b", gpus=inventory("n1"), health=(
            HealthReport(uuid="GPU-n0-0", status=HealthStatus.FAIL, reason="x"),)),
         Code.UNKNOWN_GPU),
        (ReportHealth(node="n1", incarnation=incarnation, reports=(
            HealthReport(uuid="GPU-n0-0", status=HealthStatus.FAIL, reason="x"),)),
         Code.UNKNOWN_GPU),
        (AckPodStarted(node="n1", incarnation=incarnation, group="wide",
                       pod_uid=on_n0.pod_uid, gpu_uuids=theirs), Code.POD_MISMATCH),
        (ReportPodExit(node="n1", incarnation=incarnation, group="wide",
                       pod_uid=on_n0.pod_uid, exit_code=1), Code.POD_MISMATCH),
    ]


@pytest.mark.parametrize("case", range(7))
def test_a_node_agent_cannot_act_on_another_node(case: int) -> None:
    driver = two_node_gang()
    command, code = cross_node_commands(driver)[case]
    machine = machine_of(driver)
    before = encode_snapshot(driver.state, machine.sessions, 0)
    driver.rejected(command, N1, code)
    assert encode_snapshot(driver.state, machine.sessions, 0) == before
