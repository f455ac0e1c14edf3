"""The invariant checker names broken states it once let pass.

Each test corrupts a healthy state the way a bug in `lifecycle` would (a forgotten unbind, a
victim released without settling its preemptor, a downgrade half done) and expects `violations`
to name it. Until then all three states passed the checker: it recomputes the derived
arrays *from* the bindings and placements it is given, so a binding nobody uses, or a
preemptor left waiting on nobody, looked consistent."""

from __future__ import annotations

from statemachine import State, violations
from statemachine.lifecycle import release_unused_bindings
from statemachine.limits import OPPORTUNISTIC_PRIORITY
from statemachine.results import GroupPhase
from tests.statemachine.builders import Driver, gang, rack_spec, vc
from tests.statemachine.test_scenarios import started

ONE_NODE_TENANT = (vc("a", ("A100-RACK", "A100-NODE", 1)),
                   vc("b", ("A100-RACK", "A100-NODE", 1)))


def _preempting() -> State:
    """P (a, guaranteed) waits on V (opportunistic, live) for n0 or n1."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=ONE_NODE_TENANT))
    driver.register("n0", "n1")
    driver.submit(gang("V", "b", -1, (2, 8)))
    started(driver, "V")
    assert driver.submit(gang("P", "a", 10, (1, 8))).phase is GroupPhase.PREEMPTING
    assert violations(driver.state) == []
    return driver.state


def test_a_binding_no_gang_uses_is_caught() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=ONE_NODE_TENANT))
    driver.register("n0", "n1")
    state = driver.state
    topology = state.configured().topology
    # A tenant cell left bound after its last gang left (release_unused_bindings forgotten).
    state.configured().buddy.bind(topology.node_cell[topology.node_index["n1"]], "a")
    assert violations(state), "a leaked binding passes the checker"


def test_a_preemptor_left_waiting_on_nobody_is_caught() -> None:
    state = _preempting()
    config = state.configured()
    victim = state.groups["V"]
    leaves = victim.leaves()
    # V leaves without `settle` being called for P: P would wait for ever.
    config.cells.unhold(leaves)
    release_unused_bindings(state, leaves)
    state.journal.del_item(state.groups, "V")
    assert state.groups["P"].phase is GroupPhase.PREEMPTING
    assert violations(state), "a preemptor whose GPUs are all vacated passes the checker"


def test_a_half_done_downgrade_is_caught() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=ONE_NODE_TENANT))
    driver.register("n0", "n1")
    driver.submit(gang("G", "a", 5, (1, 4)))
    group = driver.state.groups["G"]
    # Marked as lazily preempted while still held at its full priority (or the reverse).
    group.downgraded = "lazily preempted by H"
    assert group.effective_priority != OPPORTUNISTIC_PRIORITY
    assert violations(driver.state), "downgraded but at full priority passes the checker"
