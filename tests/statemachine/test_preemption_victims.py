"""Whom a preemptor chooses to evict.

1. Between two equally costly sets of victims the preemption search had picked by cell id, not
   by the victims' priority: a priority-10 gang killed a priority-9 gang although killing a
   priority-1 gang of the same size would place it just as well. It now evicts the lowest
   priorities it can (HiveD takes a node's lowest-priority GPUs first).
2. Lazy preemption had been tried only for the victims of the one plan the search found: when
   that plan's victim was a gang that did not opt in, it was killed, although downgrading a
   willing (lazy) gang of the same tenant would have placed the preemptor with nobody killed.
"""

from __future__ import annotations

from statemachine.effects import EffectKind
from statemachine.results import GroupPhase
from tests.statemachine.builders import Driver, gang, rack_spec, vc
from tests.statemachine.test_scenarios import effects, started


def two_gangs(quota_type: str, count: int, first: tuple[str, int, bool],
              second: tuple[str, int, bool]) -> Driver:
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", quota_type, count)),)))
    driver.register("n0", "n1")
    for name, priority, lazy in (first, second):
        assert driver.submit(gang(name, "a", priority, (1, 4), lazy=lazy)).phase \
            is GroupPhase.ALLOCATED
        started(driver, name)
    return driver


def test_the_lower_priority_victim_is_preempted_across_bound_cells() -> None:
    """Tenant a has two 4-GPU socket cells, one held by a priority-9 gang (bound first), one
    by a priority-1 gang; a priority-10 gang of 4 GPUs must evict one of them."""
    driver = two_gangs("A100-SOCK", 2, ("high9", 9, False), ("low1", 1, False))
    status = driver.submit(gang("p", "a", 10, (1, 4)))
    assert status.phase is GroupPhase.PREEMPTING
    assert status.victims == ("low1",), status.victims
    assert not driver.state.groups["high9"].evicting


def test_the_lower_priority_victim_is_preempted_inside_one_node() -> None:
    """The same inside one bound node cell: each gang holds one socket of it."""
    driver = two_gangs("A100-NODE", 1, ("high9", 9, False), ("low1", 1, False))
    status = driver.submit(gang("p", "a", 10, (1, 4)))
    assert status.phase is GroupPhase.PREEMPTING
    assert status.victims == ("low1",), status.victims
    assert not driver.state.groups["high9"].evicting


def test_a_willing_lazy_victim_is_downgraded_rather_than_an_unwilling_one_killed() -> None:
    """Tenant a's two socket cells hold `keep` (not lazy, bound first) and `lazy` (lazy), both
    priority 1; the rack has two more free sockets. Downgrading `lazy` frees a socket of quota
    that a free socket can take: `p` runs at once and nobody is killed."""
    driver = two_gangs("A100-SOCK", 2, ("keep", 1, False), ("lazy", 1, True))
    status = driver.submit(gang("p", "a", 10, (1, 4)))
    assert effects(driver, EffectKind.KILL_POD) == []
    assert status.phase is GroupPhase.ALLOCATED, (status.phase, status.victims)
    assert not driver.state.groups["keep"].evicting
    assert driver.state.groups["lazy"].downgraded == "lazily preempted by p"
