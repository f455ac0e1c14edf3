"""A submission whose preemption frees GPUs at once hands them to the queue in the same command.

A guaranteed gang's submission may release gangs on the spot: a victim none of whose pods
was started yet leaves at once (nothing to wait for), a lazily preempted gang gives its
tenant's cells back, a cancelled preemptor drops its reservations. The submission tried only
the gang submitted: the GPUs it did not need stayed idle, with gangs that fit them pending,
until some later command ran a scheduling pass. A rule of the machine's version 3
(`statemachine.rules`): under the rules a log was written by before, the submission applies
as it did then, so that replaying that log gives the same state.
"""

from __future__ import annotations

from statemachine.results import GroupPhase
from statemachine.rules import PASS_AFTER_SUBMIT_FREES, system_tick
from tests.statemachine.builders import SYSTEM, Driver, gang, rack_spec, vc


def _evicting_submission(*, rules_raised: bool) -> Driver:
    """An opportunistic gang fills the rack (16 GPUs, not started); a second one (4 GPUs)
    waits. Tenant a's 4-GPU gang evicts the first, which leaves at once: 12 GPUs are free."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),)))
    if rules_raised:
        driver.ok(system_tick(), SYSTEM)
        assert driver.state.rules_version >= PASS_AFTER_SUBMIT_FREES
    driver.register("n0", "n1")
    assert driver.submit(gang("fill", "a", -1, (2, 8))).phase is GroupPhase.ALLOCATED
    assert driver.submit(gang("waiting", "a", -1, (1, 4))).phase is GroupPhase.PENDING
    assert driver.submit(gang("train", "a", 0, (1, 4))).phase is GroupPhase.ALLOCATED
    assert "fill" not in driver.state.groups
    return driver


def test_gpus_a_victim_leaves_at_submission_go_to_the_pending_gangs() -> None:
    driver = _evicting_submission(rules_raised=True)
    assert driver.state.groups["waiting"].phase is GroupPhase.ALLOCATED, (
        driver.state.groups["waiting"].why_pending)


def test_under_the_earlier_rules_the_submission_applies_as_it_did() -> None:
    driver = _evicting_submission(rules_raised=False)
    assert driver.state.rules_version < PASS_AFTER_SUBMIT_FREES
    assert driver.state.groups["waiting"].phase is GroupPhase.PENDING
