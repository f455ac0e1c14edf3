"""A reconfiguration that shrinks a tenant's quota downgrades its gangs by priority, not (as
it did) in submission order.

`config_commands.apply_config` re-attaches gangs oldest first, so the oldest keep the tenant's
remaining cells and the newer are downgraded to opportunistic, whatever their priorities: a
tenant's priority-9 gang loses its guarantee (any other tenant may now preempt it) while its
priority-1 gang keeps one, even a gang already told to leave."""

from __future__ import annotations

from statemachine.limits import OPPORTUNISTIC_PRIORITY
from tests.statemachine.builders import Driver, gang, rack_spec, vc
from tests.statemachine.test_scenarios import started


def test_a_shrunk_quota_keeps_the_higher_priority_gang_guaranteed() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=2, quota=(vc("a", ("A100-RACK", "A100-NODE", 2)),)))
    driver.register("n0", "n1", "n2", "n3")
    driver.submit(gang("low", "a", 1, (1, 8)))
    driver.submit(gang("high", "a", 9, (1, 8)))
    started(driver, "low")
    started(driver, "high")
    driver.configure(rack_spec(racks=2, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),)))
    groups = driver.state.groups
    assert groups["high"].effective_priority == 9, groups["high"].downgraded
    assert groups["low"].effective_priority == OPPORTUNISTIC_PRIORITY
