"""The invariant checker can fail: each deliberate corruption of a healthy state is caught
with a message that says what is wrong."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from statemachine import State, violations
from statemachine.results import GroupPhase
from tests.statemachine.builders import Driver, gang, newest_rules, rack_spec, vc
from tests.statemachine.test_scenarios import started


def healthy() -> State:
    driver = Driver(state=newest_rules())
    driver.configure(rack_spec(quota=(vc("a", ("A100-RACK", "A100-NODE", 2)),
                                      vc("b", ("A100-RACK", "A100-RACK", 1)))))
    driver.register("n0", "n1", "n2", "n3", "n4", "n5")
    driver.submit(gang("a1", "a", 0, (1, 4)))
    driver.submit(gang("b1", "b", 0, (2, 8)))
    driver.submit(gang("opp", "a", -1, (1, 8)))
    started(driver, "a1")
    driver.submit(gang("a2", "a", 5, (1, 8)))
    driver.submit(gang("wait", "b", 0, (1, 8)))
    state = driver.state
    assert [state.groups[name].phase for name in ("a1", "a2", "b1", "opp", "wait")] == [
        GroupPhase.ALLOCATED, GroupPhase.ALLOCATED, GroupPhase.ALLOCATED,
        GroupPhase.ALLOCATED, GroupPhase.PENDING]
    assert violations(state) == []
    return state


def double_allocation(state: State) -> None:
    pod = state.groups["a2"].pods[0]
    pod.leaves = (state.groups["a1"].pods[0].leaves[0], *pod.leaves[1:])


def free_counter(state: State) -> None:
    state.configured().cells.free[3] += 1


def free_list(state: State) -> None:
    lists = state.configured().buddy.free_lists[0]
    level = next(level for level, cells in enumerate(lists) if cells)
    lists[level].pop()


def unmerged_buddies(state: State) -> None:
    buddy = state.configured().buddy
    cell = next(cells[0] for cells in buddy.free_lists[0][2:] if cells)
    buddy._remove_free(cell)
    for child in state.configured().topology.children(cell):
        buddy._add_free(child)
    buddy.split[cell] = True


def outside_vc(state: State) -> None:
    config = state.configured()
    root = config.buddy.bound_root[state.groups["b1"].pods[0].leaves[0]]
    config.buddy._unbind(root)


def priority(state: State) -> None:
    leaf = state.groups["opp"].pods[0].leaves[0]
    state.configured().cells.holder_priority[leaf] = 7


def usability(state: State) -> None:
    state.nodes["n5"].cordoned = True


def queue(state: State) -> None:
    state.queue.keys.clear()


def safety(state: State) -> None:
    state.configured().buddy.demand[0][5] += 2


def incomplete_gang(state: State) -> None:
    pod = state.groups["b1"].pods[1]
    pod.leaves = pod.leaves[:-1]


def pending_but_placed(state: State) -> None:
    state.groups["wait"].pods[0].node = 0


def best_fit_index(state: State) -> None:
    state.configured().cells.indexes[0].add(4, 3, 5)


CORRUPTIONS: list[tuple[Callable[[State], None], str]] = [
    (double_allocation, "is claimed by both a1 and a2"),
    (free_counter, "cells.free[3]"),
    (free_list, "buddy.free_lists differs from a recomputation"),
    (unmerged_buddies, "in_free=True, expected False"),
    (outside_vc, "guaranteed gang b1 uses GPUs outside VC b"),
    (priority, "cells.holder_priority"),
    (usability, "cells.usable"),
    (queue, "pending queue differs"),
    (safety, "chain A100-RACK: safety broken"),
    (incomplete_gang, "gang b1 pod 0/1: 7 GPUs placed, 8 asked"),
    (pending_but_placed, "gang wait pod 0/0: pending but placed or bound"),
    (best_fit_index, "best-fit index of chain 0 differs"),
]


@pytest.mark.parametrize(("corrupt", "message"), CORRUPTIONS,
                         ids=[corrupt.__name__ for corrupt, _ in CORRUPTIONS])
def test_a_corrupted_state_is_caught(corrupt: Callable[[State], None], message: str) -> None:
    state = healthy()
    corrupt(state)
    found = violations(state)
    assert any(message in line for line in found), found
