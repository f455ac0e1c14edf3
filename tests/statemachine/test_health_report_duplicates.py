"""A failed GPU comes back only after `recover_reports` passing reports in a row; one report
(or registration) naming the GPU several times must not count as several reports. A rule of
the machine's version 2 (`statemachine.rules`): under the rules a log was written by before,
such a report is applied as it was then, so that replaying that log gives the same state."""

from __future__ import annotations

import pytest

from statemachine.commands import HealthReport, HealthStatus, RegisterNode, ReportHealth
from statemachine.errors import Code, Rejection
from statemachine.rules import ONE_REPORT_PER_GPU, system_tick
from tests.statemachine.builders import SYSTEM, Driver, inventory, node_principal, rack_spec

N0 = node_principal("n0")


def _passes(driver: Driver) -> tuple[HealthReport, ...]:
    return tuple(HealthReport(uuid="GPU-n0-1", status=HealthStatus.PASS, reason="")
                 for _ in range(driver.state.policy.recover_reports))


def _failed_gpu(*, rules_raised: bool) -> Driver:
    driver = Driver()
    driver.configure(rack_spec(racks=2))
    if rules_raised:
        driver.ok(system_tick(), SYSTEM)
        assert driver.state.rules_version >= ONE_REPORT_PER_GPU
    driver.register("n0")
    driver.ok(ReportHealth(node="n0", incarnation=1, reports=(
        HealthReport(uuid="GPU-n0-1", status=HealthStatus.FAIL, reason=""),)), N0)
    assert driver.state.nodes["n0"].health[1].failed
    return driver


def _report(driver: Driver) -> ReportHealth:
    return ReportHealth(node="n0", incarnation=1, reports=_passes(driver))


def _registration(driver: Driver) -> RegisterNode:
    return RegisterNode(node="n0", boot_id="boot-2", gpus=inventory("n0"),
                        health=_passes(driver))


@pytest.mark.parametrize("command", [_report, _registration])
def test_a_gpu_named_several_times_in_one_report_is_refused(command: object) -> None:
    driver = _failed_gpu(rules_raised=True)
    result = driver.run(command(driver), N0)  # type: ignore[operator]
    assert isinstance(result, Rejection) and result.code is Code.MALFORMED, result
    assert "twice" in result.message
    assert driver.state.nodes["n0"].health[1].failed


def test_under_the_earlier_rules_such_a_report_is_applied_as_it_was() -> None:
    driver = _failed_gpu(rules_raised=False)
    assert driver.state.rules_version < ONE_REPORT_PER_GPU
    driver.ok(_report(driver), N0)
    assert not driver.state.nodes["n0"].health[1].failed
