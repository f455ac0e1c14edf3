"""Gang commands, accept and reject paths: submission checks against the configuration,
idempotent resubmission, binding pods to slots, and release in every phase."""

from __future__ import annotations

import pytest

from statemachine import limits
from statemachine.commands import (
    BindPod,
    Member,
    RegisterNode,
    ReleaseGroup,
    ReportPodExit,
    SubmitGroup,
)
from statemachine.effects import EffectKind
from statemachine.errors import Code
from statemachine.results import Done, GroupPhase, NodeRegistered, PodBound
from statemachine.sessions import Sessions
from statemachine.snapshot_codec import decode_snapshot, encode_snapshot
from statemachine.spec import FailurePolicy
from statemachine.views import group_status
from tests.statemachine.builders import (
    SCHEDULER,
    Driver,
    gang,
    inventory,
    node_principal,
    rack_spec,
    vc,
)
from tests.statemachine.test_scenarios import started


@pytest.fixture
def driver() -> Driver:
    """One rack, n0 and n1 registered; tenant a owns a node, tenant s two PCIe switches."""
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),
                                               vc("s", ("A100-RACK", "A100-SW", 2)))))
    driver.register("n0", "n1")
    return driver


@pytest.mark.parametrize(
    ("command", "code", "message"),
    [
        (gang("g", "zz", 0, (1, 1)), Code.UNKNOWN_VC, "no virtual cluster 'zz'"),
        (gang("g", "a", 0, (1, 1), model="H100"), Code.UNKNOWN_MODEL,
         "no chain has GPUs of model 'H100'"),
        (gang("g", "a", 1001, (1, 1)), Code.MALFORMED,
         "SubmitGroup.priority: 1001 is outside [-1, 1000]"),
        (gang("g", "a", 0), Code.MALFORMED, "SubmitGroup.members: between 1 and 16 needed"),
        (gang("g", "a", 0, (1, 0)), Code.MALFORMED,
         "SubmitGroup.members[0].gpus: outside [1, 64]"),
        (gang("g", "a", 0, (2, 8)), Code.NEVER_SATISFIABLE,
         "16 GPUs in pods of up to 8 can never fit: A100-RACK: pods of at most 8 GPUs, "
         "8 GPUs in all"),
        (gang("g", "s", 0, (1, 4)), Code.NEVER_SATISFIABLE,
         "4 GPUs in pods of up to 4 can never fit: A100-RACK: pods of at most 2 GPUs, "
         "4 GPUs in all"),
        (gang("g", "a", -1, (1, 16)), Code.NEVER_SATISFIABLE,
         "16 GPUs in pods of up to 16 can never fit: A100-RACK: pods of at most 8 GPUs, "
         "16 GPUs in all"),
        (gang("g", "a", -1, (3, 8)), Code.NEVER_SATISFIABLE,
         "24 GPUs in pods of up to 8 can never fit: A100-RACK: pods of at most 8 GPUs, "
         "16 GPUs in all"),
    ],
)
def test_submissions_are_checked(driver: Driver, command: SubmitGroup, code: Code,
                                 message: str) -> None:
    before = encode_snapshot(driver.state, Sessions(), 0)
    assert driver.rejected(command, SCHEDULER, code).message == message
    assert encode_snapshot(driver.state, Sessions(), 0) == before


def test_a_model_the_tenant_has_no_cells_of_is_refused() -> None:
    driver = Driver()
    driver.configure(rack_spec(racks=1, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),
                                               vc("none"))))
    assert driver.rejected(gang("g", "none", 0, (1, 1)), SCHEDULER,
                           Code.MODEL_NOT_IN_VC).message == (
        "VC none has no guaranteed cells of model any")
    assert driver.submit(gang("g", "none", -1, (1, 1))).phase is GroupPhase.PENDING


def test_resubmission_is_idempotent_and_a_changed_spec_conflicts(driver: Driver) -> None:
    first = driver.submit(gang("g", "a", 0, (1, 4)))
    assert driver.submit(gang("g", "a", 0, (1, 4))) == first
    assert len(driver.state.groups) == 1 and driver.state.next_submit == 2
    driver.rejected(gang("g", "a", 1, (1, 4)), SCHEDULER, Code.GROUP_CONFLICT)


def test_pods_bind_to_the_lowest_free_slot_of_their_member(driver: Driver) -> None:
    driver.submit(SubmitGroup(group="g", vc="a", priority=0, gpu_model="A100",
                              lazy_preemption=False,
                              members=(Member(pods=2, gpus=1), Member(pods=1, gpus=4))))
    first = driver.ok(BindPod(group="g", member=0, pod_uid="x"), SCHEDULER)
    second = driver.ok(BindPod(group="g", member=0, pod_uid="y"), SCHEDULER)
    assert isinstance(first, PodBound) and isinstance(second, PodBound)
    assert (first.index, second.index) == (0, 1)
    assert driver.ok(BindPod(group="g", member=0, pod_uid="x"), SCHEDULER) == first
    assert dict(first.env)["CUDA_VISIBLE_DEVICES"] == ",".join(first.gpu_uuids)
    driver.rejected(BindPod(group="g", member=0, pod_uid="z"), SCHEDULER, Code.NO_FREE_SLOT)
    driver.rejected(BindPod(group="g", member=1, pod_uid="x"), SCHEDULER, Code.POD_MISMATCH)
    driver.rejected(BindPod(group="g", member=5, pod_uid="w"), SCHEDULER, Code.UNKNOWN_POD)
    starts = [(effect.pod_uid, effect.gpu_uuids) for effect in driver.state.outbox.effects
              if effect.kind is EffectKind.START_POD]
    assert starts == [("x", first.gpu_uuids), ("y", second.gpu_uuids)]


def test_binding_needs_an_allocated_gang(driver: Driver) -> None:
    driver.submit(gang("big", "a", 0, (1, 8)))
    started(driver, "big")
    driver.submit(gang("wait", "a", 0, (1, 8)))
    message = driver.rejected(BindPod(group="wait", member=0, pod_uid="p"), SCHEDULER,
                              Code.GROUP_NOT_ALLOCATED).message
    assert message == "gang wait is pending"
    driver.submit(gang("boss", "a", 9, (1, 8)))
    message = driver.rejected(BindPod(group="big", member=0, pod_uid="p2"), SCHEDULER,
                              Code.GROUP_NOT_ALLOCATED).message
    assert message == "gang big is preempted by boss"


def test_release_in_every_phase(driver: Driver) -> None:
    driver.submit(gang("run", "a", 0, (1, 8)))
    started(driver, "run")
    driver.submit(gang("wait", "a", 0, (1, 8)))
    driver.submit(gang("boss", "a", 5, (1, 8)))
    assert driver.state.groups["boss"].phase is GroupPhase.PREEMPTING
    assert driver.ok(ReleaseGroup(group="boss", reason=""), SCHEDULER) == Done(
        note="released boss (preempting)")
    assert driver.ok(ReleaseGroup(group="wait", reason=""), SCHEDULER) == Done(
        note="released wait (pending)")
    assert driver.ok(ReleaseGroup(group="run", reason="done"), SCHEDULER) == Done(
        note="released run (allocated)")
    assert driver.state.groups == {}
    assert len(driver.state.queue) == 0
    driver.rejected(ReleaseGroup(group="run", reason=""), SCHEDULER, Code.UNKNOWN_GROUP)
    kinds = [effect.kind for effect in driver.state.outbox.effects][-4:]
    assert kinds == [EffectKind.GANG_RELEASED, EffectKind.GANG_RELEASED, EffectKind.KILL_POD,
                     EffectKind.GANG_RELEASED]


def test_a_gang_spreads_over_several_tenant_cells(driver: Driver) -> None:
    status = driver.submit(gang("two", "s", 0, (2, 2)))
    assert status.phase is GroupPhase.ALLOCATED
    assert [pod.gpu_indices for pod in status.pods] == [(0, 1), (2, 3)]
    assert len(driver.state.configured().buddy.bound_cells["s"][0]) == 2


def test_a_binding_carries_its_command_to_the_agent_and_its_end_back(driver: Driver) -> None:
    """The START_POD effect and a re-registration both hand the agent the argv to run; the
    pod's exit code and reason are kept and shown, and survive a snapshot."""
    # one pod fails, the gang stays
    driver.submit(gang("job", "a", 0, (2, 1), on_pod_failure=FailurePolicy.KEEP))
    argv = ("python3", "train.py", "--epochs", "3")
    bound = driver.ok(BindPod(group="job", member=0, pod_uid="job-0", command=argv), SCHEDULER)
    assert isinstance(bound, PodBound)
    start = [effect for effect in driver.state.outbox.effects
             if effect.kind is EffectKind.START_POD]
    assert [(effect.pod_uid, effect.command) for effect in start] == [("job-0", argv)]
    reboot = driver.ok(RegisterNode(node=bound.node, boot_id="boot-2",
                                    gpus=inventory(bound.node)), node_principal(bound.node))
    assert isinstance(reboot, NodeRegistered)
    assert [(pod.pod_uid, pod.command) for pod in reboot.pods] == [("job-0", argv)]
    driver.ok(ReportPodExit(node=bound.node, incarnation=reboot.incarnation, group="job",
                            pod_uid="job-0", exit_code=255, reason="lost: gone after restart"),
              node_principal(bound.node))
    restored, _, _ = decode_snapshot(encode_snapshot(driver.state, Sessions(), 0))
    for state in (driver.state, restored):
        view = group_status(state, state.groups["job"])
        assert [(pod.exit_code, pod.exit_reason) for pod in view.pods] == [
            (255, "lost: gone after restart"), (0, "")]
        assert state.groups["job"].pods[0].command == argv


def test_gangs_past_the_bound_are_refused_until_one_is_released(
        driver: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "GROUPS_MAX", 2)
    first, second = gang("g1", "a", 1, (1, 1)), gang("g2", "a", 1, (1, 1))
    driver.ok(first, SCHEDULER)
    driver.ok(second, SCHEDULER)  # it waits in the queue, and counts all the same
    driver.rejected(gang("g3", "a", 1, (1, 1)), SCHEDULER, Code.GROUPS_FULL)
    driver.ok(first, SCHEDULER)  # a resubmission holds nothing new: still answered
    driver.ok(ReleaseGroup(group="g1", reason="done"), SCHEDULER)
    driver.ok(gang("g3", "a", 1, (1, 1)), SCHEDULER)
