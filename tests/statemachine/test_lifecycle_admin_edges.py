"""Gang lifecycle and node administration edge cases: a preemptor whose reserved GPU fails
is queued again whatever its tenant's failure policy (it never ran there; RELEASE had dropped it
for good), and clearing a whole node's mark clears its GPUs' marks too (as `clear-bad` says)."""

from __future__ import annotations

from statemachine.commands import ClearBad, HealthReport, HealthStatus, MarkBad, ReportHealth
from statemachine.effects import EffectKind
from statemachine.results import GroupPhase
from statemachine.spec import FailurePolicy
from tests.statemachine.builders import ADMIN, Driver, gang, node_principal, rack_spec, vc
from tests.statemachine.test_scenarios import started


def preempting(policy: FailurePolicy) -> tuple[Driver, str]:
    """g (guaranteed, tenant policy `policy`) reserves one node of opp (opportunistic)."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(
        vc("a", ("A100-RACK", "A100-NODE", 1), on_failure=policy),)))
    driver.register("n0", "n1")
    driver.submit(gang("opp", "a", -1, (2, 8)))
    started(driver, "opp")
    assert driver.submit(gang("g", "a", 10, (1, 8))).phase is GroupPhase.PREEMPTING
    topology = driver.state.configured().topology
    return driver, topology.node_ids[driver.state.groups["g"].pods[0].node]


def test_a_release_policy_preemptor_whose_reserved_gpu_fails_queues_again() -> None:
    """A preemptor has no pods and holds no GPU: a failed GPU it only reserved sends it back
    to the queue (as KEEP does, and as a drain or a forced deregistration do, README), not
    out of the store. Under RELEASE the never-started gang was dropped for good, with a
    GANG_RELEASED "hardware failed" for a gang that never ran on that hardware."""
    for kind in ("mark", "report"):
        driver, node = preempting(FailurePolicy.RELEASE)
        if kind == "mark":
            driver.ok(MarkBad(node=node, gpu=f"GPU-{node}-0", reason="bad memory"), ADMIN)
        else:
            driver.ok(ReportHealth(node=node, incarnation=driver.incarnations[node], reports=(
                HealthReport(uuid=f"GPU-{node}-0", status=HealthStatus.FAIL,
                             reason="xid 79"),)), node_principal(node))
        assert "g" in driver.state.groups, f"{kind}: the preemptor was released"
        group = driver.state.groups["g"]
        # Requeued, then placed at once on the node opp's release freed, not the failed GPU's.
        assert group.phase is GroupPhase.ALLOCATED
        topology = driver.state.configured().topology
        assert topology.node_ids[group.pods[0].node] != node
        released = [effect.group for effect in driver.state.outbox.effects
                    if effect.kind is EffectKind.GANG_RELEASED]
        assert "g" not in released
        # opp held the failed GPU: the tenant's RELEASE policy applies to it.
        assert "opp" not in driver.state.groups


def test_clearing_a_whole_node_clears_its_gpus_marks_too() -> None:
    """`cellar admin clear-bad NODE` (help: "--gpu one GPU's UUID (default: all)") answers
    "cleared", yet a GPU marked on its own stays out of the pool with no word of it."""
    driver = Driver()
    driver.configure(rack_spec(racks=2))
    driver.register("n0", "n1")
    driver.ok(MarkBad(node="n0", gpu="GPU-n0-3", reason="bad memory"), ADMIN)
    driver.ok(MarkBad(node="n0", gpu="", reason="maintenance"), ADMIN)
    driver.ok(ClearBad(node="n0", gpu=""), ADMIN)
    config = driver.state.configured()
    assert config.cells.free[config.topology.node_cell[0]] == 8, "GPU 3 is still marked bad"
