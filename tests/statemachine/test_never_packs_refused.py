"""A gang whose pods can never be packed into the places it may use is refused at submission.

Submission checked only the gang's total against the room of its tenant's cells (the chain's,
for an opportunistic gang) and its largest pod against the largest place: three pods of 5 GPUs
passed on two nodes of 8 (15 <= 16), though a node holds one such pod, and pended for ever on an
idle cluster. A reconfiguration that shrank a tenant's cells under a pending gang left it so too.
A rule of the machine's version 4 (`statemachine.rules`): under the rules a log was written by
before, both apply as they did then. Capacity that is down or held makes a gang wait, as before.
"""

from __future__ import annotations

from statemachine.commands import MarkBad, SubmitGroup
from statemachine.errors import Code
from statemachine.results import GroupPhase
from statemachine.rules import PODS_PACKED_AT_SUBMIT, system_tick
from statemachine.spec import VirtualClusterSpec
from tests.statemachine.builders import ADMIN, SCHEDULER, SYSTEM, Driver, gang, rack_spec, vc

# One rack of two 8-GPU nodes (n0, n1), each 2 sockets x 2 switches x 2 GPUs.
NODE = vc("a", ("A100-RACK", "A100-NODE", 1))
RACK = vc("b", ("A100-RACK", "A100-RACK", 1))
SMALL = vc("c", ("A100-RACK", "A100-SOCK", 1), ("A100-RACK", "A100-SW", 1))  # 4 + 2 GPUs


def _driver(*tenants: VirtualClusterSpec, rules_raised: bool = True) -> Driver:
    driver = Driver()
    if rules_raised:
        driver.ok(system_tick(), SYSTEM)
        assert driver.state.rules_version >= PODS_PACKED_AT_SUBMIT
    driver.configure(rack_spec(racks=1, quota=tenants))
    driver.register("n0", "n1")
    return driver


def _refused(driver: Driver, command: SubmitGroup) -> str:
    return driver.rejected(command, SCHEDULER, Code.NEVER_SATISFIABLE).message


def test_pods_no_node_pair_can_hold_are_refused() -> None:
    driver = _driver(NODE)
    assert _refused(driver, gang("g", "a", -1, (3, 5))) == (
        "15 GPUs in pods of up to 5 can never fit: A100-RACK: its nodes have room for 2 of "
        "its 3 pods of 5 GPUs or more")
    assert "g" not in driver.state.groups


def test_pods_the_tenants_cells_can_never_hold_are_refused() -> None:
    assert _refused(_driver(RACK), gang("g", "b", 0, (3, 5))) == (
        "15 GPUs in pods of up to 5 can never fit: A100-RACK: VC b's cells have room for 2 "
        "of its 3 pods of 5 GPUs or more")
    # A 4-GPU socket and a 2-GPU switch: 6 GPUs, but one pod of 3.
    assert _refused(_driver(SMALL), gang("g", "c", 0, (2, 3))) == (
        "6 GPUs in pods of up to 3 can never fit: A100-RACK: VC c's cells have room for 1 "
        "of its 2 pods of 3 GPUs or more")
    # Mixed sizes: the larger pods count against the smaller's places too.
    assert _refused(_driver(RACK), gang("g", "b", 0, (1, 6), (2, 5))) == (
        "16 GPUs in pods of up to 6 can never fit: A100-RACK: VC b's cells have room for 2 "
        "of its 3 pods of 5 GPUs or more")


def test_gangs_that_can_pack_are_accepted_and_wait_for_what_is_down_or_held() -> None:
    driver = _driver(RACK)
    assert driver.submit(gang("two", "b", 0, (2, 5))).phase is GroupPhase.ALLOCATED
    assert driver.submit(gang("mixed", "b", 0, (1, 3), (1, 3))).phase is GroupPhase.ALLOCATED
    # The rack is now held; a gang that packs into it waits rather than being refused.
    assert driver.submit(gang("later", "b", 0, (2, 8))).phase is GroupPhase.PENDING
    small = _driver(SMALL)
    assert small.submit(gang("g", "c", 0, (1, 3), (1, 2))).phase is GroupPhase.ALLOCATED
    down = _driver(NODE)
    down.ok(MarkBad(node="n0", gpu="", reason="repair"), ADMIN)
    down.ok(MarkBad(node="n1", gpu="", reason="repair"), ADMIN)
    assert down.submit(gang("g", "a", -1, (2, 8))).phase is GroupPhase.PENDING


def test_a_reconfiguration_that_shrinks_the_cells_under_a_pending_gang_releases_it() -> None:
    driver = _driver(RACK)
    driver.submit(gang("x", "b", 0, (2, 8)))
    assert driver.submit(gang("g", "b", 0, (2, 5))).phase is GroupPhase.PENDING
    driver.configure(rack_spec(racks=1, quota=(vc("b", ("A100-RACK", "A100-NODE", 1)),
                                               vc("d", ("A100-RACK", "A100-NODE", 1)))))
    assert "g" not in driver.state.groups, driver.state.groups["g"].why_pending
    assert "x" in driver.state.groups  # allocated: reattached (downgraded), not released


def test_under_the_rules_before_the_gangs_are_accepted_as_they_were() -> None:
    driver = _driver(RACK, rules_raised=False)
    assert driver.state.rules_version < PODS_PACKED_AT_SUBMIT
    assert driver.submit(gang("g", "b", 0, (3, 5))).phase is GroupPhase.PENDING
    driver.configure(rack_spec(racks=1, quota=(vc("b", ("A100-RACK", "A100-SW", 4)),
                                               vc("d", ("A100-RACK", "A100-NODE", 1)))))
    assert driver.state.groups["g"].phase is GroupPhase.PENDING
    # The checks of then still apply: more GPUs than the tenant's cells hold.
    assert _refused(driver, gang("h", "b", 0, (1, 16))).startswith("16 GPUs")
