"""Lazy preemption "instead" never downgrades a gang above the one in the way (it did).

`scheduler._try_lazy_instead`: before killing a guaranteed victim V (priority 1), it downgrades
any lazily preemptible gang W of the tenant (priority 9) that is not in the preemptor's way.
W then runs opportunistically and another tenant's priority-0 gang preempts it, while V, of
lower priority, keeps its guarantee. HiveD downgrades only the gangs in the preemptor's way
(reference/hived.md 1.8); downgrading another one may save a gang, never at the expense of a
higher-priority one."""

from __future__ import annotations

from tests.statemachine.builders import Driver, gang, rack_spec, vc
from tests.statemachine.test_scenarios import started


def test_a_lower_priority_victim_is_not_kept_by_downgrading_a_higher_one() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=2, quota=(vc("a", ("A100-RACK", "A100-NODE", 2)),
                                               vc("b", ("A100-RACK", "A100-NODE", 2)))))
    driver.register("n0", "n1", "n2", "n3")
    driver.submit(gang("V", "a", 1, (1, 8)))
    started(driver, "V")
    driver.submit(gang("W", "a", 9, (1, 8), lazy=True))
    started(driver, "W")
    driver.submit(gang("G", "a", 10, (1, 8)))
    groups = driver.state.groups
    assert groups["W"].effective_priority == 9, groups["W"].downgraded
    assert groups["V"].evicting  # the lowest priority in the way goes
