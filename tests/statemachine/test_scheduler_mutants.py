"""Scheduler choices no other test pinned, each found by a mutant of the code that survived the
state-machine tests: the order a spread places pods in, which of equally cheap preemption plans
wins, and the free-list counts a plan's safety check works from.

Each test fails with the one-line change its docstring names and passes on the code as it is.
"""

from __future__ import annotations

from statemachine.buddy import CountsAfter
from statemachine.commands import ReleaseGroup
from statemachine.errors import Code
from statemachine.results import GroupPhase
from statemachine.rules import LEAST_VICTIMS, system_tick
from statemachine.spec import VirtualClusterSpec
from tests.statemachine.builders import SCHEDULER, SYSTEM, Driver, gang, rack_spec, vc
from tests.statemachine.test_scenarios import started


def _rack(quota: VirtualClusterSpec, *, rules_raised: bool = True) -> Driver:
    """One rack (two 8-GPU nodes n0, n1) and the one tenant `quota`, under the newest rules
    or the earliest."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(quota,)))
    if rules_raised:
        driver.ok(system_tick(), SYSTEM)
        assert driver.state.rules_version >= LEAST_VICTIMS
    driver.register("n0", "n1")
    return driver


def _run(driver: Driver, name: str, priority: int, *members: tuple[int, int]) -> None:
    status = driver.submit(gang(name, "a", priority, *members))
    assert status.phase is GroupPhase.ALLOCATED, status
    started(driver, name)


def _release(driver: Driver, name: str) -> None:
    driver.ok(ReleaseGroup(group=name, reason="done"), SCHEDULER)


def test_a_spread_places_its_largest_pods_first() -> None:
    """Pins `_spread`'s pod order (largest first, search.py): tenant a's two bound nodes have
    6 and 4 GPUs free, and a gang of pods 4, 4 and 2 fits them only if the 4s go first (4 into
    the node with 4, 4 and 2 into the one with 6). Placing the smallest pod first puts the 2
    into the node with 4, and the second 4 then fits nowhere: the gang pended."""
    driver = _rack(vc("a", ("A100-RACK", "A100-NODE", 2)))
    _run(driver, "six", 5, (1, 6))  # binds n0, 2 left
    _run(driver, "four", 5, (1, 4))  # binds n1, 4 left
    _run(driver, "two", 5, (1, 2))  # fills n0
    _release(driver, "six")  # n0: 6 free, still bound by `two`
    status = driver.submit(gang("p", "a", 5, (2, 4), (1, 2)))
    assert status.phase is GroupPhase.ALLOCATED, status


def test_of_equally_cheap_one_cell_plans_the_first_found_wins() -> None:
    """Pins `Cheapest.offer`'s strict comparison (search.py): two bound sockets each held by a
    priority-1 gang of 4 GPUs cost the same to take; the preemptor evicts the gang in the
    first one the search ranks (lowest id), not the last one offered."""
    driver = _rack(vc("a", ("A100-RACK", "A100-SOCK", 2)))
    _run(driver, "first", 1, (1, 4))
    _run(driver, "second", 1, (1, 4))
    status = driver.submit(gang("p", "a", 10, (1, 4)))
    assert status.phase is GroupPhase.PREEMPTING
    assert status.victims == ("first",), status.victims


def test_of_equally_cheap_cells_for_a_spread_pod_the_first_ranked_wins() -> None:
    """Pins `_into_ranked`'s strict comparison (search.py): three bound sockets each held by
    a priority-1 gang of 4 GPUs; a two-pod gang spread over them evicts the gangs in the first
    two ranked sockets, not the last ones weighed."""
    driver = _rack(vc("a", ("A100-RACK", "A100-SOCK", 3)))
    for name in ("g1", "g2", "g3"):
        _run(driver, name, 1, (1, 4))
    status = driver.submit(gang("p", "a", 10, (2, 4)))
    assert status.phase is GroupPhase.PREEMPTING
    assert status.victims == ("g1", "g2"), status.victims


def test_the_counts_a_plan_checks_safety_by_are_those_binding_leaves() -> None:
    """Pins `CountsAfter` (buddy.py), the free-list counts and demand a plan's bindings are
    checked for safety with, before any is made: for every cell buddy allocation may bind at
    every level, from a state with one binding made already, they equal the free lists that
    binding it really leaves. Splitting a free cell brings in all its children but the one on
    the way down; counting that one too over-counted free cells by one a level, and a binding
    that broke another tenant's guarantee passed the check."""
    quota = vc("a", ("A100-RACK", "A100-RACK", 1), ("A100-RACK", "A100-NODE", 1),
               ("A100-RACK", "A100-SOCK", 2), ("A100-RACK", "A100-SW", 2))
    driver = Driver()
    driver.configure(rack_spec(racks=3, quota=(quota,)))
    state = driver.state
    buddy = state.configured().buddy
    chain = state.configured().topology.chains[0]
    journal = state.journal
    checked = 0
    switch = next(buddy.candidates(chain.index, 2))
    for first in (switch, -1):  # from one switch bound, then from no binding
        outer = journal.mark()
        if first >= 0:
            buddy.bind(first, "a")
        for level in range(2, chain.top_level + 1):
            for cell in list(buddy.candidates(chain.index, level)):
                after = CountsAfter(buddy, chain.index)
                predicted = after.feasible_with(cell)
                after.add(cell)
                mark = journal.mark()
                buddy.bind(cell, "a")
                assert after.counts == [len(cells) for cells in buddy.free_lists[chain.index]]
                assert after.demand == buddy.demand[chain.index]
                assert predicted == after.feasible()
                journal.rollback(mark)
                checked += 1
        journal.rollback(outer)
    assert checked > 20


def test_under_the_earlier_rules_the_bound_cell_with_fewest_victims_is_tried_first() -> None:
    """Pins `_rank_bound`'s key (search.py): under preemption, bound cells rank by fewest
    evictions before fewest GPUs available. Node n0 has 4 free GPUs and `a4` (priority 1, 4
    GPUs), n1 has 1 free, `b5` (priority 1, 5 GPUs) and `h2` (priority 20); a priority-10 gang
    of 5 must preempt. Under the rules before `LEAST_VICTIMS`, where the first cell that fits
    wins, it evicts `a4`; ranking by GPUs available first evicted `b5`, and a log written then
    would replay to another state."""
    driver = _rack(vc("a", ("A100-RACK", "A100-NODE", 2)), rules_raised=False)
    assert driver.state.rules_version < LEAST_VICTIMS
    _run(driver, "a4", 1, (1, 4))  # binds n0
    _run(driver, "b5", 1, (1, 5))  # binds n1
    _run(driver, "h2", 20, (1, 2))  # n1, the bound cell with fewest free
    status = driver.submit(gang("p", "a", 10, (1, 5)))
    assert status.phase is GroupPhase.PREEMPTING
    assert status.victims == ("a4",), status.victims


def test_under_the_earlier_rules_a_pod_larger_than_every_quota_cell_is_refused() -> None:
    """Pins `never_fits`'s pod room (group_commands.py): the largest pod a tenant can run is
    the smaller of its largest guaranteed cell and a node. Tenant a holds two 4-GPU sockets; a
    pod of 6 is refused NEVER_SATISFIABLE even under the rules before the packing check (taking
    the larger of the two, 8, let it pend for ever)."""
    driver = _rack(vc("a", ("A100-RACK", "A100-SOCK", 2)), rules_raised=False)
    driver.rejected(gang("p", "a", 5, (1, 6)), SCHEDULER, Code.NEVER_SATISFIABLE)


def test_gangs_at_the_preemptors_priority_are_not_counted_as_victims() -> None:
    """Pins `PreemptView.evictions` (fit.py): a cell's victims are the gangs below the
    preemptor's priority; one at its priority stays and costs nothing. n0 holds `s3` (priority
    10, the preemptor's), `b1` (priority 1, 1 GPU) and 4 free GPUs; n1 holds `a4` (priority 1,
    4 GPUs) and 4 free. Under the rules before `LEAST_VICTIMS`, where bound cells are tried
    fewest victims first, a priority-10 gang of 5 evicts `b1`; counting `s3` as a victim made
    n0 look dearer, and `a4` was evicted."""
    driver = _rack(vc("a", ("A100-RACK", "A100-NODE", 2)), rules_raised=False)
    _run(driver, "s3", 10, (1, 3))  # binds n0
    _run(driver, "filler", 1, (1, 4))  # n0, 1 left
    _run(driver, "a4", 1, (1, 4))  # binds n1
    _run(driver, "b1", 1, (1, 1))  # n0, the bound cell with fewest free
    _release(driver, "filler")
    status = driver.submit(gang("p", "a", 10, (1, 5)))
    assert status.phase is GroupPhase.PREEMPTING
    assert status.victims == ("b1",), status.victims
