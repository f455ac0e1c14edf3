"""A preemptor evicts the lowest priorities it can, across cell levels and over a spread.

1. The one-cell search tried levels smallest first and took the first cell that fit: tenant
   a's priority-10 gang of 4 GPUs preempted a priority-9 gang in a bound socket cell, where
   the priority-1 gang filling a bound node cell would do. It now weighs every cell it tries
   and takes the plan whose victims' highest priority is lowest (then the fewest GPUs and
   gangs, then the first found).
2. A gang too big for any one cell is spread pod by pod: each pod went to the first bound
   cell that fit it, whoever that evicted, and to a new binding only when none did. Tenant a's
   two-pod gang killed both of its running gangs (priorities 9 and 1) where killing the
   priority-1 one and binding a free socket would do.

Both are rules of the machine's version 4 (`statemachine.rules.LEAST_VICTIMS`): under the rules
a log was written by before, the choice is the old one, so that replaying that log gives the
same state.
"""

from __future__ import annotations

import pytest

from statemachine.results import GroupPhase
from statemachine.rules import LEAST_VICTIMS, system_tick
from statemachine.spec import VirtualClusterSpec
from tests.statemachine.builders import SYSTEM, Driver, gang, rack_spec, vc
from tests.statemachine.test_scenarios import started


def _running(quota: VirtualClusterSpec, gangs: tuple[tuple[str, int, int], ...], *,
             rules_raised: bool) -> Driver:
    """One rack (two 8-GPU nodes) and tenant a's `gangs` (name, priority, GPUs) running."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(quota,)))
    if rules_raised:
        driver.ok(system_tick(), SYSTEM)
        assert driver.state.rules_version >= LEAST_VICTIMS
    else:
        assert driver.state.rules_version < LEAST_VICTIMS
    driver.register("n0", "n1")
    for name, priority, gpus in gangs:
        assert driver.submit(gang(name, "a", priority, (1, gpus))).phase is GroupPhase.ALLOCATED
        started(driver, name)
    return driver


def _across_levels(*, rules_raised: bool) -> Driver:
    """Tenant a: a socket cell held by `high9` (4 GPUs) and a node cell by `low1` (8 GPUs)."""
    return _running(vc("a", ("A100-RACK", "A100-SOCK", 1), ("A100-RACK", "A100-NODE", 1)),
                    (("high9", 9, 4), ("low1", 1, 8)), rules_raised=rules_raised)


def _spread(*, rules_raised: bool) -> Driver:
    """Tenant a: three socket cells, `high9` and `low1` (4 GPUs each) in two of them."""
    return _running(vc("a", ("A100-RACK", "A100-SOCK", 3)),
                    (("high9", 9, 4), ("low1", 1, 4)), rules_raised=rules_raised)


@pytest.mark.parametrize("members", [(1, 4), (2, 2)])
def test_the_lowest_priority_victim_is_chosen_across_cell_levels(
        members: tuple[int, int]) -> None:
    driver = _across_levels(rules_raised=True)
    status = driver.submit(gang("p", "a", 10, members))
    assert status.phase is GroupPhase.PREEMPTING
    assert status.victims == ("low1",), status.victims
    assert not driver.state.groups["high9"].evicting


def test_a_spread_evicts_the_lowest_priority_and_binds_a_free_cell() -> None:
    driver = _spread(rules_raised=True)
    status = driver.submit(gang("p", "a", 10, (2, 4)))
    assert status.phase is GroupPhase.PREEMPTING
    assert status.victims == ("low1",), status.victims
    assert not driver.state.groups["high9"].evicting


def test_under_the_earlier_rules_the_first_cell_that_fits_is_preempted() -> None:
    driver = _across_levels(rules_raised=False)
    status = driver.submit(gang("p", "a", 10, (1, 4)))
    assert status.victims == ("high9",), status.victims


def test_under_the_earlier_rules_a_spread_takes_the_first_bound_cells() -> None:
    driver = _spread(rules_raised=False)
    status = driver.submit(gang("p", "a", 10, (2, 4)))
    assert status.victims == ("high9", "low1"), status.victims


def _equal_priorities(*, rules_raised: bool) -> Driver:
    """Tenant a: a socket cell held by `four` (priority 1, 4 GPUs), a node cell by `two`
    (priority 1, 2 GPUs) and `six` (priority 20, 6 GPUs)."""
    return _running(vc("a", ("A100-RACK", "A100-SOCK", 1), ("A100-RACK", "A100-NODE", 1)),
                    (("four", 1, 4), ("two", 1, 2), ("six", 20, 6)), rules_raised=rules_raised)


def test_of_equal_priorities_the_victim_holding_fewer_gpus_is_chosen() -> None:
    """Taking 2 GPUs of either priority-1 gang places the preemptor; a victim leaves whole,
    so evicting `two` costs 2 GPUs and `four` 4, whichever level each is at."""
    driver = _equal_priorities(rules_raised=True)
    status = driver.submit(gang("p", "a", 10, (1, 2)))
    assert status.victims == ("two",), status.victims


def test_under_the_earlier_rules_the_smaller_cell_is_preempted() -> None:
    driver = _equal_priorities(rules_raised=False)
    status = driver.submit(gang("p", "a", 10, (1, 2)))
    assert status.victims == ("four",), status.victims
