"""The pod failure policy beside the other ways a gang leaves: a failed pod whose sibling is on a
Down node, a preemption victim whose pod fails, a gang leaving after a failure that is chosen
as a victim, a lazily downgraded gang whose pod fails. Each ends with the gang released once and
the preemptor allocated (the Driver checks the invariants after every command)."""

from __future__ import annotations

from statemachine.commands import Heartbeat, ReportPodExit
from statemachine.nodes import Liveness
from statemachine.results import GroupPhase
from tests.statemachine.builders import Driver, gang, node_principal, rack_spec, vc
from tests.statemachine.test_scenarios import started


def make() -> Driver:
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("b", ("A100-RACK", "A100-RACK", 1)),)))
    driver.register("n0", "n1")
    return driver


def exit_pod(driver: Driver, group: str, uid: str, code: int) -> None:
    g = driver.state.groups[group]
    pod = next(p for p in g.pods if p.pod_uid == uid)
    node = driver.state.configured().topology.node_ids[pod.node]
    driver.ok(ReportPodExit(node=node, incarnation=driver.incarnations[node], group=group,
                            pod_uid=uid, exit_code=code), node_principal(node))


def node_of(driver: Driver, group: str, uid: str) -> str:
    g = driver.state.groups[group]
    pod = next(p for p in g.pods if p.pod_uid == uid)
    return driver.state.configured().topology.node_ids[pod.node]


def test_a_gang_whose_failed_pod_leaves_a_sibling_on_a_down_node_is_released_by_the_tick() -> None:
    driver = make()
    driver.submit(gang("job", "b", -1, (2, 8)))
    started(driver, "job")
    down = node_of(driver, "job", "job-0-1")
    up = node_of(driver, "job", "job-0-0")
    for _ in range(40):
        driver.ok(Heartbeat(node=up, incarnation=driver.incarnations[up]), node_principal(up),
                  step_ms=1000)
        driver.tick()
    assert driver.state.nodes[down].liveness is Liveness.DOWN
    assert driver.state.groups["job"].phase is GroupPhase.ALLOCATED  # KEEP VC policy
    exit_pod(driver, "job", "job-0-0", 1)
    assert driver.state.groups["job"].evicting
    driver.tick()
    assert "job" not in driver.state.groups


def test_a_victims_failed_pod_keeps_the_preemption_and_the_preemptor_settles() -> None:
    driver = make()
    driver.submit(gang("low", "b", 1, (2, 8)))
    started(driver, "low")
    status = driver.submit(gang("high", "b", 5, (2, 8)))
    assert status.phase is GroupPhase.PREEMPTING
    assert driver.state.groups["low"].preempted_by == ("high",)
    exit_pod(driver, "low", "low-0-0", 1)
    assert driver.state.groups["low"].evicting.startswith("preempted")
    exit_pod(driver, "low", "low-0-1", 137)
    assert "low" not in driver.state.groups
    assert driver.state.groups["high"].phase is GroupPhase.ALLOCATED


def test_a_gang_leaving_after_a_failure_can_still_be_a_victim() -> None:
    driver = make()
    driver.submit(gang("low", "b", 1, (2, 8)))
    started(driver, "low")
    exit_pod(driver, "low", "low-0-0", 1)
    status = driver.submit(gang("high", "b", 5, (2, 8)))
    exit_pod(driver, "low", "low-0-1", 143)
    assert "low" not in driver.state.groups
    assert driver.state.groups["high"].phase is GroupPhase.ALLOCATED, status


def test_a_lazily_downgraded_gang_whose_pod_fails_is_released() -> None:
    driver = make()
    driver.submit(gang("low", "b", 1, (1, 8), lazy=True))
    started(driver, "low")
    driver.submit(gang("high", "b", 5, (2, 8)))
    exit_pod(driver, "low", "low-0-0", 1)
    driver.tick()
    assert "low" not in driver.state.groups
    assert driver.state.groups["high"].phase is GroupPhase.ALLOCATED
