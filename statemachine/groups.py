"""Gangs (HiveD's affinity groups): their spec, phase, placement, pod slots and preemption.

A gang is members x pods x GPUs, placed all or nothing on one chain (one GPU model), each pod on
one node. Phases (reference/hived.md 1.7): Pending (in the queue, with a "why pending"),
Preempting (its GPUs reserved, victims told to leave, a deadline), Allocated (its GPUs held).
A released gang is removed. An allocated gang told to leave (a preemption victim, a drain, a
hardware-failure policy, a failed pod under its pod failure policy) keeps its GPUs, with
`evicting` saying why, until its pods exit.

Each pod of the placement is a slot a client binds a pod to (BindPod), which the node agent
then acknowledges (AckPodStarted) and eventually reports gone (ReportPodExit). The gang's GPUs
are freed when every pod has exited, or when the gang is released. Under the gang's
`on_pod_failure` RELEASE (the default), a pod that exits non-zero or is lost evicts the gang.
"""

from __future__ import annotations

from dataclasses import dataclass

from statemachine.commands import Member
from statemachine.limits import OPPORTUNISTIC_PRIORITY
from statemachine.results import GroupPhase, PodPhase
from statemachine.spec import FailurePolicy


@dataclass(slots=True, kw_only=True)
class Pod:
    """One slot of a gang. Mutated only through the journal."""

    member: int
    index: int
    gpus: int
    node: int = -1  # topology node index once placed
    leaves: tuple[int, ...] = ()  # cell ids of its GPUs once placed
    pod_uid: str = ""
    command: tuple[str, ...] = ()
    phase: PodPhase = PodPhase.UNBOUND
    exit_code: int = 0
    exit_reason: str = ""


@dataclass(slots=True, kw_only=True)
class Group:
    """One gang. Mutated only through the journal."""

    group: str
    vc: str
    priority: int
    lazy_preemption: bool
    gpu_model: str
    members: tuple[Member, ...]
    submit_index: int
    submitted_ms: int
    pods: tuple[Pod, ...]
    on_pod_failure: FailurePolicy | None = None  # see SubmitGroup.on_pod_failure
    effective_priority: int = 0
    phase: GroupPhase = GroupPhase.PENDING
    chain: int = -1
    victims: tuple[str, ...] = ()  # while preempting: the gangs that must leave
    deadline_ms: int = 0  # while preempting: when kills are re-sent
    preempted_by: tuple[str, ...] = ()  # while a victim: the preemptors waiting on it
    evicting: str = ""
    downgraded: str = ""  # why it was lazily downgraded to opportunistic
    # (GPU, why) for each GPU under it that failed, the latest failure of each, by GPU: only
    # GPUs under it when the last failure was recorded (lifecycle.hardware_failed)
    failures: tuple[tuple[str, str], ...] = ()
    why_pending: str = ""
    attempt_epoch: int = -1  # the capacity epoch of its last failed placement attempt
    preempt_epoch: int = -1  # the change epoch of its last failed attempt with preemption

    @property
    def guaranteed(self) -> bool:
        """Whether it runs on its tenant's guaranteed cells (and so needs VC bindings)."""
        return self.effective_priority > OPPORTUNISTIC_PRIORITY

    @property
    def gpus(self) -> int:
        return sum(member.pods * member.gpus for member in self.members)

    def leaves(self) -> list[int]:
        return [leaf for pod in self.pods for leaf in pod.leaves]

    def queue_key(self) -> tuple[int, int, str]:
        """Pending order: higher priority first, then earlier submission."""
        return (-self.priority, self.submit_index, self.group)


def make_pods(members: tuple[Member, ...]) -> tuple[Pod, ...]:
    return tuple(Pod(member=member_index, index=pod_index, gpus=member.gpus)
                 for member_index, member in enumerate(members)
                 for pod_index in range(member.pods))
