"""A reconfiguration that leaves a pending gang nothing it may ever run on releases it (it
waited for ever).

Submission refuses a guaranteed gang whose tenant has no guaranteed cells of its model
(MODEL_NOT_IN_VC) and any gang of a model no chain has (UNKNOWN_MODEL); a reconfiguration that
takes those away from an already pending gang left it pending for ever, with a "why pending"
naming no chain at all."""

from __future__ import annotations

from statemachine.results import GroupPhase
from tests.statemachine.builders import Driver, gang, rack_spec, vc


def test_a_pending_gang_whose_tenant_loses_its_quota_does_not_wait_for_ever() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),
                                               vc("b", ("A100-RACK", "A100-NODE", 1)))))
    driver.register("n0", "n1")
    driver.submit(gang("x", "b", 5, (1, 8)))
    assert driver.submit(gang("g", "b", 5, (1, 8))).phase is GroupPhase.PENDING
    # b keeps its name but loses every guaranteed cell: g can never be placed again.
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 2)),
                                               vc("b"))))
    driver.tick()
    driver.tick()
    group = driver.state.groups.get("g")
    assert group is None or group.phase is not GroupPhase.PENDING, (
        f"g pends for ever: {group.why_pending!r}")
