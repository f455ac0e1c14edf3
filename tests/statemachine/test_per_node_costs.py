"""Commands about one node read that node's share of the state, not the whole cluster's.

A registration finds the pods on its node from the node's GPUs (their holders and reservers),
not from a sort of every gang: the same pods, in the same order. A failed opportunistic attempt
reads the chain's free GPUs and its roomiest node from counters kept as GPUs move
(`Cells.chain_free`, `FreeIndex.largest`), not from a walk of every rack and node; the invariant
checker recomputes them. Behaviour only: no timing here (the costs are measured by a script,
not asserted).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from statemachine import State, violations
from statemachine.commands import RegisterNode, ReportHealth, Tick
from statemachine.groups import Group, Pod
from statemachine.node_commands import _pods_on
from statemachine.results import GroupPhase, NodeRegistered
from statemachine.rules import RULES_VERSION
from statemachine.scheduler import explain
from tests.statemachine.builders import (
    SCHEDULER,
    SYSTEM,
    Driver,
    gang,
    inventory,
    newest_rules,
    node_principal,
    rack_spec,
    vc,
)
from tests.statemachine.test_scenarios import started


class NoWalk(dict[str, Group]):
    """The gangs, refusing to be walked whole while `armed` (lookups by id are fine)."""

    armed = True

    def _walk(self) -> None:
        if self.armed:
            raise AssertionError("walked every gang")

    def __iter__(self) -> Iterator[str]:
        self._walk()
        return super().__iter__()

    def keys(self) -> Any:
        self._walk()
        return super().keys()

    def values(self) -> Any:
        self._walk()
        return super().values()

    def items(self) -> Any:
        self._walk()
        return super().items()


def busy() -> Driver:
    """Six nodes; gangs allocated (one started), one preempting, one pending."""
    driver = Driver(state=newest_rules())
    driver.configure(rack_spec(quota=(vc("a", ("A100-RACK", "A100-NODE", 2)),
                                      vc("b", ("A100-RACK", "A100-RACK", 1)))))
    driver.register("n0", "n1", "n2", "n3", "n4", "n5")
    driver.submit(gang("a1", "a", 0, (1, 4)))
    driver.submit(gang("b1", "b", 0, (2, 8)))
    driver.submit(gang("opp", "a", -1, (1, 8)))
    driver.submit(gang("opp2", "b", -1, (2, 2)))
    started(driver, "a1")
    driver.submit(gang("a2", "a", 5, (1, 8)))
    driver.submit(gang("wait", "b", 0, (1, 8)))
    return driver


def pods_by_walk(state: State, node: int) -> list[tuple[Group, int, Pod]]:
    """The definition: every placed gang's pods on the node, by gang id then position."""
    return [(state.groups[name], position, pod) for name in sorted(state.groups)
            for position, pod in enumerate(state.groups[name].pods)
            if pod.node == node and state.groups[name].phase is not GroupPhase.PENDING]


def test_the_pods_on_a_node_are_those_a_walk_of_every_gang_finds() -> None:
    driver = busy()
    state = driver.state
    phases = {group.phase for group in state.groups.values()}
    assert GroupPhase.PREEMPTING in phases or GroupPhase.ALLOCATED in phases
    for name in sorted(state.nodes):
        record = state.nodes[name]
        assert _pods_on(state, record) == pods_by_walk(state, record.index), name
    assert any(_pods_on(state, record) for record in state.nodes.values())


def test_a_registration_does_not_walk_every_gang() -> None:
    driver = busy()
    state = driver.state
    node = state.configured().topology.node_ids[state.groups["a1"].pods[0].node]
    expected = pods_by_walk(state, state.nodes[node].index)
    assert expected
    gangs = state.groups = NoWalk(state.groups)
    driver.checked = False  # the checker walks every gang: it runs after, on a plain dict
    for boot in ("boot-1", "boot-2"):  # the same boot, then a reboot
        result = driver.run(RegisterNode(node=node, boot_id=boot, gpus=inventory(node)),
                            node_principal(node))
        assert isinstance(result, NodeRegistered), result
        assert "a1" in {pod.group for pod in result.pods}
    gangs.armed = False
    state.groups = dict(gangs)
    assert violations(state) == []


def test_the_chain_counters_follow_every_move_and_are_checked() -> None:
    driver = busy()
    state = driver.state
    cells = state.configured().cells
    chain = state.configured().topology.chains[0]
    driver.ok(ReportHealth(node="n5", incarnation=driver.incarnations["n5"], reports=()),
              node_principal("n5"))
    driver.ok(Tick(rules=RULES_VERSION), SYSTEM, step_ms=60_000)  # every lease runs out
    driver.ok(Tick(rules=RULES_VERSION), SYSTEM, step_ms=60_000)  # ... and nodes go down
    driver.heartbeat_all()
    for _ in range(2):  # the driver checks the invariants after each command
        assert cells.chain_free[0] == sum(cells.free[cell]
                                          for cell in chain.cells_at(chain.top_level))
        assert cells.indexes[0].largest(chain.node_level) == max(
            (cells.free[cell] for cell in chain.cells_at(chain.node_level)), default=0)
        driver.run(gang("late", "b", -1, (2, 8)), SCHEDULER)
    cells.chain_free[0] += 1
    assert any("cells.chain_free[0]" in line for line in violations(state))


def test_an_opportunistic_gang_is_told_the_same_why_pending() -> None:
    driver = busy()
    state = driver.state
    driver.run(gang("huge", "b", -1, (6, 8)), SCHEDULER)
    group = state.groups["huge"]
    assert group.phase is GroupPhase.PENDING
    config = state.configured()
    chain = config.topology.chains[0]
    free = sum(config.cells.free[cell] for cell in chain.cells_at(chain.top_level))
    largest = max(config.cells.free[cell] for cell in chain.cells_at(chain.node_level))
    assert group.why_pending == explain(config, group)
    assert f"{free} free GPUs, at most {largest} on one node" in group.why_pending
