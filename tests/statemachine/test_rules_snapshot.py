"""The rules version (`statemachine.rules`) on the paths a Tick does not take: a
snapshot that already holds a later build's rules (installed from an upgraded peer, or read
back at a restart after a downgrade) must stop the replica as the Tick that raised them would
have, not be installed and then applied by this build's older rules."""

from __future__ import annotations

import pytest

from statemachine import Machine
from statemachine.commands import Cordon
from statemachine.rules import RULES_VERSION, RulesTooNew, system_tick
from tests.statemachine.builders import ADMIN, SYSTEM
from tests.statemachine.test_machine import ready_machine, run


def later_builds_snapshot() -> bytes:
    """A snapshot from a replica of a later build, whose Tick raised the rules past this
    build's (as its own `raise_rules` would)."""
    machine = ready_machine()
    run(machine, system_tick(), SYSTEM)
    machine.state.rules_version = RULES_VERSION + 1
    return machine.snapshot()


def test_a_snapshot_naming_rules_this_build_does_not_know_stops_the_replica() -> None:
    """An upgraded peer's snapshot, installed on a replica left on this build (catch-up), or
    its own snapshot read back after a downgrade: the commands after it would be applied by
    this build's rules while the state says the later ones are in force, and the replicas
    would diverge; a Tick naming the same version stops the replica (exit 76)."""
    lagging = Machine()
    with pytest.raises(RulesTooNew, match=f"version {RULES_VERSION + 1}"):
        lagging.restore(later_builds_snapshot())


def test_a_refused_snapshot_leaves_the_machine_as_it_was() -> None:
    lagging = ready_machine()
    before = lagging.digest()
    with pytest.raises(RulesTooNew):
        lagging.restore(later_builds_snapshot())
    assert lagging.digest() == before


def test_a_snapshot_of_this_builds_rules_is_still_installed() -> None:
    upgraded = ready_machine()
    run(upgraded, system_tick(), SYSTEM)
    run(upgraded, Cordon(node="n0"), ADMIN)
    lagging = Machine()
    lagging.restore(upgraded.snapshot())
    assert lagging.state.rules_version == RULES_VERSION
    assert lagging.digest() == upgraded.digest()
