"""More scheduler choices no other test pinned, each found by a mutant of the code that survived
the state-machine tests: the order of new binding candidates under preemption, whether a spread
pod prefers a bound cell to an equally cheap new binding, the reserver's priority in a cell's
evictions, a binding candidate's room on bad GPUs, which sockets a pod spans, and whether a gang
landing exactly on the pass's cell limit is tried.

Each test fails with the one-line change its docstring names and passes on the code as it is.
"""

from __future__ import annotations

import pytest

from statemachine import scheduler
from statemachine.commands import MarkBad, ReleaseGroup
from statemachine.results import GroupPhase
from statemachine.rules import LEAST_VICTIMS, system_tick
from statemachine.spec import VirtualClusterSpec
from tests.statemachine.builders import ADMIN, SCHEDULER, SYSTEM, Driver, gang, rack_spec, vc
from tests.statemachine.test_scenarios import started


def _cluster(quota: VirtualClusterSpec, *nodes: str, racks: int = 1,
             rules_raised: bool = True) -> Driver:
    """`racks` racks (two 8-GPU nodes each, n0, n1, ...) with the one tenant `quota`, under
    the newest rules or the earliest; only `nodes` registered (the others' GPUs unusable)."""
    driver = Driver()
    driver.configure(rack_spec(racks=racks, quota=(quota,)))
    if rules_raised:
        driver.ok(system_tick(), SYSTEM)
        assert driver.state.rules_version >= LEAST_VICTIMS
    else:
        assert driver.state.rules_version < LEAST_VICTIMS
    driver.register(*nodes)
    return driver


def _run(driver: Driver, name: str, priority: int, *members: tuple[int, int]) -> None:
    status = driver.submit(gang(name, "a", priority, *members))
    assert status.phase is GroupPhase.ALLOCATED, status
    started(driver, name)


def _release(driver: Driver, *names: str) -> None:
    for name in names:
        driver.ok(ReleaseGroup(group=name, reason="done"), SCHEDULER)


def _holders(driver: Driver, node: str) -> list[str]:
    """Per GPU index of `node`: its holder, "/" and its reserver when reserved, "." when
    free, "X" when unusable."""
    config = driver.state.configured()
    topology, cells = config.topology, config.cells
    index = topology.node_index[node]
    row = []
    for gpu in range(topology.node_gpu_count(index)):
        leaf = topology.leaf_of(index, gpu)
        held = cells.holder[leaf] or ("." if cells.usable[leaf] else "X")
        row.append(held + (f"/{cells.reserver[leaf]}" if cells.reserver[leaf] else ""))
    return row


def _gpus(driver: Driver, group: str) -> list[list[int]]:
    """The GPU indices (on their node) of each pod of `group`."""
    topology = driver.state.configured().topology
    return [[topology.gpu_index(leaf) for leaf in pod.leaves]
            for pod in driver.state.groups[group].pods]


@pytest.mark.parametrize("rules_raised", [False, True])
def test_under_preemption_new_bindings_rank_fewest_evictions_before_health(
        rules_raised: bool) -> None:
    """Pins `_binding_candidates`' key under preemption (search.py): a cell to bind ranks by
    fewest evictions first, health second. Only n0 is registered; its socket 0 holds the
    opportunistic `o3` and `o4` and 2 free GPUs, socket 1 `o0`, 2 free GPUs and GPU 7 marked
    bad. A priority-5 gang of 3 GPUs must preempt and evicts `o0` in socket 1, the cheaper;
    ranking health first evicted `o3` in socket 0, under the rules before `LEAST_VICTIMS`
    (the first cell that fits wins) and under them too (both plans evict one one-GPU gang, and
    the first of equals wins)."""
    driver = _cluster(vc("a", ("A100-RACK", "A100-SOCK", 1)), "n0", rules_raised=rules_raised)
    driver.ok(MarkBad(node="n0", gpu="GPU-n0-7", reason="xid 79"), ADMIN)
    for index in range(7):
        _run(driver, f"o{index}", -1, (1, 1))
    _release(driver, "o1", "o2", "o5", "o6")
    assert _holders(driver, "n0") == ["o3", "o4", ".", ".", ".", ".", "o0", "X"]
    status = driver.submit(gang("p", "a", 5, (1, 3)))
    assert status.phase is GroupPhase.PREEMPTING
    assert status.victims == ("o0",), status.victims


def test_a_spread_pod_keeps_a_bound_cell_over_an_equally_cheap_new_binding() -> None:
    """Pins `_spread`'s strict comparison under `least` (search.py): a pod goes to a new
    binding only when its GPUs evict strictly less than the bound cell's. Only n0 is
    registered; tenant a's bound socket 0 holds `g` (priority 5), the opportunistic `o0` and 2
    free GPUs, unbound socket 1 holds `o3`, `o4` and 2 free GPUs. A priority-5 gang of pods 3
    and 2 must spread: its 3 into socket 0 evicts `o0`, into socket 1 one of the others, the
    same cost; it stays in socket 0, and the 2 takes socket 1's free GPUs. Taking the new
    binding among equals (`<=`) evicted `o3` instead."""
    driver = _cluster(vc("a", ("A100-RACK", "A100-SOCK", 2)), "n0")
    _run(driver, "g", 5, (1, 1))  # binds socket 0
    for index in range(7):
        _run(driver, f"o{index}", -1, (1, 1))
    _release(driver, "o1", "o2", "o5", "o6")
    assert _holders(driver, "n0") == ["g", "o0", ".", ".", "o3", "o4", ".", "."]
    status = driver.submit(gang("p", "a", 5, (1, 3), (1, 2)))
    assert status.phase is GroupPhase.PREEMPTING
    assert status.victims == ("o0",), status.victims
    assert _holders(driver, "n0") == ["g", "o0/p", "./p", "./p", "o3", "o4", "./p", "./p"]


def test_a_reservers_priority_counts_among_a_cells_evictions() -> None:
    """Pins `PreemptView.evictions`' highest priority (fit.py): a GPU's reserver counts, not
    only its holder. Tenant a's node n0 holds `x` (priority 1) in socket 0, reserved by the
    preempting `r` (priority 8), and `z` (priority 5) in socket 1. A priority-10 gang of 4
    takes socket 1 and evicts `z`, the lowest priority it must beat; ignoring the reserver
    made socket 0 look like priority 1, and it cancelled `r`'s preemption instead."""
    driver = _cluster(vc("a", ("A100-RACK", "A100-NODE", 1)), "n0", "n1")
    _run(driver, "x", 1, (1, 4))
    _run(driver, "z", 5, (1, 4))
    status = driver.submit(gang("r", "a", 8, (1, 4)))
    assert status.phase is GroupPhase.PREEMPTING
    assert status.victims == ("x",)
    assert _holders(driver, "n0") == ["x/r"] * 4 + ["z"] * 4
    status = driver.submit(gang("p", "a", 10, (1, 4)))
    assert status.phase is GroupPhase.PREEMPTING
    assert status.victims == ("z",), status.victims
    assert driver.state.groups["r"].phase is GroupPhase.PREEMPTING


@pytest.mark.parametrize("rules_raised", [False, True])
def test_a_binding_candidates_room_under_preemption_leaves_out_unusable_gpus(
        rules_raised: bool) -> None:
    """Pins `PreemptView.unbound_count` (fit.py): a cell buddy allocation may bind has room
    for its usable GPUs only. Five racks, only n8 and n9 registered and both full of
    opportunistic gangs; tenant a may bind one PCIe switch (2 GPUs). The 32 switches of n0-n7
    come first in buddy order, with no usable GPU; a priority-5 gang of 2 skips them and
    preempts `o8`. Counting their unusable GPUs as room made them the BUDDY_CANDIDATES_MAX
    candidates tried, none fit, and the gang pended."""
    nodes = ("n8", "n9")
    driver = _cluster(vc("a", ("A100-RACK", "A100-SW", 1)), *nodes, racks=5,
                      rules_raised=rules_raised)
    for node in nodes:
        _run(driver, f"o{node[1:]}", -1, (1, 8))
    status = driver.submit(gang("p", "a", 5, (1, 2)))
    assert status.phase is GroupPhase.PREEMPTING, status
    assert status.victims == ("o8",), status.victims


def test_a_pod_no_socket_holds_spans_the_socket_with_most_available_first() -> None:
    """Pins `pick_leaves`' order where no child holds the pod (fit.py): it spans the children
    with the most GPUs available first. n0 holds `one` on GPU 0, so socket 0 has 3 available
    and socket 1 has 4; a pod of 5 takes all of socket 1 and one GPU of socket 0. Taking the
    child with the fewest available first gave it 3 of socket 0 and 2 of socket 1."""
    driver = _cluster(vc("a", ("A100-RACK", "A100-NODE", 1)), "n0", "n1")
    _run(driver, "one", 5, (1, 1))
    assert _gpus(driver, "one") == [[0]]
    status = driver.submit(gang("p", "a", 5, (1, 5)))
    assert status.phase is GroupPhase.ALLOCATED
    assert sorted(_gpus(driver, "p")[0]) == [1, 4, 5, 6, 7]


@pytest.mark.parametrize(("slack", "second_tried"), [(0, True), (-1, False)])
def test_a_gang_landing_exactly_on_the_pass_cell_limit_is_tried(
        slack: int, second_tried: bool) -> None:
    """Pins `schedule`'s strict comparison with SCHEDULE_LOOKS_MAX (scheduler.py): a pass
    stops before a gang only when trying it would look at more cells than the limit. Two
    opportunistic gangs of 4 wait behind `fill`; the limit is set to the cells the two
    attempts look at in all (`slack` 0), and the release's pass places both. Stopping when the
    limit is reached exactly (`>=`) left the second pending, not tried; one cell less
    (`slack` -1) stops it on the code as it is."""
    driver = _cluster(vc("a", ("A100-RACK", "A100-NODE", 1)), "n0", "n1")
    _run(driver, "fill", -1, (2, 8))
    for name in ("q1", "q2"):
        assert driver.submit(gang(name, "a", -1, (1, 4))).phase is GroupPhase.PENDING
    config = driver.state.configured()
    looks = sum(scheduler.attempt_looks(config, driver.state.groups[name], preempt=False)
                for name in ("q1", "q2"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scheduler, "SCHEDULE_LOOKS_MAX", looks + slack)
        _release(driver, "fill")
    assert driver.state.groups["q1"].phase is GroupPhase.ALLOCATED
    second = driver.state.groups["q2"]
    assert (second.phase is GroupPhase.ALLOCATED) == second_tried, second.why_pending
    assert ("not tried yet" in second.why_pending) != second_tried
