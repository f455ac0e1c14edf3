"""A gang's pod failure policy: under RELEASE (the default) a pod that exits non-zero, or is
lost, while its gang runs evicts the gang (its other pods are killed, its GPUs freed once none
is live); under KEEP the other pods go on. Every first exit report is announced (POD_EXITED).
The policy survives a snapshot; a gang of a snapshot from before it existed reads as KEEP."""

from __future__ import annotations

import msgpack
import pytest

from statemachine.codec import decode_command
from statemachine.commands import Drain, ReportPodExit
from statemachine.effects import Effect, EffectKind
from statemachine.errors import Code
from statemachine.results import GroupPhase
from statemachine.sessions import Sessions
from statemachine.snapshot_codec import decode_snapshot, encode_snapshot
from statemachine.spec import FailurePolicy
from tests.statemachine.builders import (
    ADMIN,
    SCHEDULER,
    Driver,
    gang,
    node_principal,
    rack_spec,
    vc,
)
from tests.statemachine.test_scenarios import started

LOST = "lost: started before the agent restarted and not running when it reconciled"


@pytest.fixture
def driver() -> Driver:
    """One rack of two 8-GPU nodes, both registered; tenant b may use all of it."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("b", ("A100-RACK", "A100-RACK", 1)),)))
    driver.register("n0", "n1")
    return driver


def running_pair(driver: Driver, policy: FailurePolicy) -> None:
    """"job", two live pods that fill the cluster, and "next" waiting for its GPUs."""
    driver.submit(gang("job", "b", -1, (2, 8), on_pod_failure=policy))
    started(driver, "job")
    waiting = driver.submit(gang("next", "b", -1, (1, 8), on_pod_failure=policy))
    assert waiting.phase is GroupPhase.PENDING


def report_exit(driver: Driver, pod_uid: str, exit_code: int, reason: str = "") -> int:
    """Report a pod of "job" exited; the index of the first effect it put out."""
    group = driver.state.groups["job"]
    pod = next(pod for pod in group.pods if pod.pod_uid == pod_uid)
    node = driver.state.configured().topology.node_ids[pod.node]
    first = driver.state.outbox.next_index
    driver.ok(ReportPodExit(node=node, incarnation=driver.incarnations[node], group="job",
                            pod_uid=pod_uid, exit_code=exit_code, reason=reason),
              node_principal(node))
    return first


def phase(driver: Driver, group: str) -> GroupPhase:
    return driver.state.groups[group].phase


def effects_since(driver: Driver, first: int) -> list[Effect]:
    return driver.state.outbox.since(first - 1, None, 1 << 20)


def kinds(effects: list[Effect], group: str = "job") -> list[tuple[EffectKind, str, str]]:
    return [(effect.kind, effect.pod_uid, effect.reason) for effect in effects
            if effect.group == group]


def test_a_failed_pod_evicts_its_gang_and_frees_its_gpus_once_the_others_exit(
        driver: Driver) -> None:
    running_pair(driver, FailurePolicy.RELEASE)
    first = report_exit(driver, "job-0-0", 1, "NCCL error")
    why = "pod job-0-0 failed with exit code 1: NCCL error"
    assert kinds(effects_since(driver, first)) == [
        (EffectKind.POD_EXITED, "job-0-0", "exit code 1: NCCL error"),
        (EffectKind.KILL_POD, "job-0-1", why)]
    assert driver.state.groups["job"].evicting == why
    assert phase(driver, "next") is GroupPhase.PENDING, "job holds its GPUs"
    first = report_exit(driver, "job-0-1", 143, "killed by signal 15 (SIGTERM)")
    assert kinds(effects_since(driver, first)) == [
        (EffectKind.POD_EXITED, "job-0-1", "exit code 143: killed by signal 15 (SIGTERM)"),
        (EffectKind.GANG_RELEASED, "", why)]
    assert "job" not in driver.state.groups
    assert phase(driver, "next") is GroupPhase.ALLOCATED


def test_under_keep_a_failed_pod_leaves_its_gang_running(driver: Driver) -> None:
    running_pair(driver, FailurePolicy.KEEP)
    first = report_exit(driver, "job-0-0", 1)
    assert kinds(effects_since(driver, first)) == [
        (EffectKind.POD_EXITED, "job-0-0", "exit code 1")]
    group = driver.state.groups["job"]
    assert group.phase is GroupPhase.ALLOCATED and not group.evicting
    assert phase(driver, "next") is GroupPhase.PENDING
    first = report_exit(driver, "job-0-1", 0)
    assert kinds(effects_since(driver, first)) == [
        (EffectKind.POD_EXITED, "job-0-1", "exit code 0"),
        (EffectKind.GANG_RELEASED, "", "all pods exited")]
    assert phase(driver, "next") is GroupPhase.ALLOCATED


def test_a_pod_that_succeeds_evicts_nothing(driver: Driver) -> None:
    running_pair(driver, FailurePolicy.RELEASE)
    first = report_exit(driver, "job-0-0", 0)
    assert kinds(effects_since(driver, first)) == [
        (EffectKind.POD_EXITED, "job-0-0", "exit code 0")]
    assert not driver.state.groups["job"].evicting


def test_a_lost_pod_evicts_its_gang(driver: Driver) -> None:
    running_pair(driver, FailurePolicy.RELEASE)
    first = report_exit(driver, "job-0-1", -1, LOST)
    why = f"pod job-0-1 failed with exit code -1: {LOST}"
    assert kinds(effects_since(driver, first)) == [
        (EffectKind.POD_EXITED, "job-0-1", f"exit code -1: {LOST}"),
        (EffectKind.KILL_POD, "job-0-0", why)]
    report_exit(driver, "job-0-0", 137)
    assert "job" not in driver.state.groups
    assert phase(driver, "next") is GroupPhase.ALLOCATED


def test_a_failed_pod_with_no_other_live_pod_releases_its_gang_at_once(
        driver: Driver) -> None:
    """The other slot was never bound: nothing to wait for."""
    driver.submit(gang("job", "b", -1, (2, 8)))
    started(driver, "job")
    report_exit(driver, "job-0-0", 0)  # its other pod ended well: no eviction
    first = report_exit(driver, "job-0-1", 2)
    assert kinds(effects_since(driver, first)) == [
        (EffectKind.POD_EXITED, "job-0-1", "exit code 2"),
        (EffectKind.GANG_RELEASED, "", "pod job-0-1 failed with exit code 2")]


def test_an_exit_while_the_gang_is_leaving_keeps_the_reason_it_leaves(driver: Driver) -> None:
    running_pair(driver, FailurePolicy.RELEASE)
    driver.ok(Drain(node="n0"), ADMIN)
    drained = driver.state.groups["job"].evicting
    assert drained
    first = report_exit(driver, "job-0-0", 137, "killed by signal 9 (SIGKILL)")
    assert [kind for kind, _, _ in kinds(effects_since(driver, first))] == [
        EffectKind.POD_EXITED]
    assert driver.state.groups["job"].evicting == drained
    first = report_exit(driver, "job-0-1", 143)
    assert kinds(effects_since(driver, first))[-1] == (EffectKind.GANG_RELEASED, "", drained)


@pytest.mark.parametrize("policy", list(FailurePolicy))
def test_the_policy_survives_a_snapshot(driver: Driver, policy: FailurePolicy) -> None:
    driver.submit(gang("job", "b", -1, (2, 8), on_pod_failure=policy))
    snapshot = encode_snapshot(driver.state, Sessions(), 3)
    state, _, _ = decode_snapshot(snapshot)
    assert state.groups["job"].on_pod_failure is policy
    assert encode_snapshot(state, Sessions(), 3) == snapshot


def test_a_format_5_snapshot_restores_its_gangs_as_keep(driver: Driver) -> None:
    """They were submitted when a failed pod left its gang running: so it stays."""
    running_pair(driver, FailurePolicy.RELEASE)
    raw = msgpack.unpackb(encode_snapshot(driver.state, Sessions(), 3), strict_map_key=False)
    raw[1] = 5
    del raw[15:]  # the rules version: none before format 7
    for fields in raw[10]:
        assert fields.pop() == "release"
    state, _, _ = decode_snapshot(msgpack.packb(raw))
    # None: KEEP, and exits unannounced, as the build that wrote it applied them
    assert {group.on_pod_failure for group in state.groups.values()} == {None}
    restored = Driver(state=state, now_ms=state.now_ms, incarnations=driver.incarnations)
    first = report_exit(restored, "job-0-0", 1)
    assert kinds(effects_since(restored, first)) == []
    assert state.groups["job"].phase is GroupPhase.ALLOCATED
    assert not state.groups["job"].evicting
    again, _, _ = decode_snapshot(encode_snapshot(state, Sessions(), 3))  # formats 6+ keep it
    assert again.groups["job"].on_pod_failure is None
    raw[1] = 6
    with pytest.raises(ValueError, match="fields"):
        decode_snapshot(msgpack.packb(raw))


def test_resubmitting_a_gang_with_another_policy_is_a_conflict(driver: Driver) -> None:
    driver.submit(gang("job", "b", -1, (1, 8)))
    driver.submit(gang("job", "b", -1, (1, 8), on_pod_failure=FailurePolicy.RELEASE))
    driver.rejected(gang("job", "b", -1, (1, 8), on_pod_failure=FailurePolicy.KEEP), SCHEDULER,
                    Code.GROUP_CONFLICT)


def test_an_old_logs_exit_report_puts_out_what_it_did_then() -> None:
    """A gang of an old submission body (no on_pod_failure), its pod's exit replayed: the
    build of then put out no effect for an exit that released nothing, and a replica replaying
    the log must number its outbox as one restored from that build's snapshot (agents read
    effects by index). The gang is kept, as it was then."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("b", ("A100-RACK", "A100-RACK", 1)),)))
    driver.register("n0", "n1")
    old_body = msgpack.packb({"v": 1, "type": "submit_group", "group": "job", "vc": "b",
                              "priority": -1, "members": [{"pods": 2, "gpus": 8}],
                              "gpu_model": "", "lazy_preemption": False})
    driver.ok(decode_command(old_body), SCHEDULER)
    started(driver, "job")
    pod = driver.state.groups["job"].pods[0]
    node = driver.state.configured().topology.node_ids[pod.node]
    before = driver.state.outbox.next_index
    driver.ok(ReportPodExit(node=node, incarnation=driver.incarnations[node], group="job",
                            pod_uid=pod.pod_uid, exit_code=1), node_principal(node))
    new = [effect.kind for effect in driver.state.outbox.since(before - 1, None, 1 << 20)]
    assert EffectKind.POD_EXITED not in new
    assert "job" in driver.state.groups and not driver.state.groups["job"].evicting
