"""A naive reference for the stateful test: health and liveness re-derived from the commands
sent, and placement feasibility by plain bin packing, with none of the state machine's code.

- Health: per node registration, incarnation, lease, liveness, cordon, drain and admin mark;
  per GPU failure, pass count and admin mark; `usable` is the conjunction the design states.
- Pod exits: what a pod's first exit report does to its gang (`pod_exit_outcome`), from the
  gang's pod failure policy, phase and eviction and its other pods' phases.
- Feasibility: pods sized 1, 2, 4 or 8 divide one another, so packing them largest first into
  any node that still has room succeeds exactly when some packing exists (a size-s pod takes
  s/t slots of size t from whichever node it lands on, so the count of free t-slots after each
  size class does not depend on the choices).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from statemachine.spec import PolicySpec


@dataclass
class RefGpu:
    failed: bool = False
    passes: int = 0
    admin_bad: bool = False


@dataclass
class RefNode:
    gpus: int
    registered: bool = False
    boot: str = ""
    incarnation: int = 0
    lease_ms: int = 0
    liveness: str = "unregistered"
    cordoned: bool = False
    draining: bool = False
    admin_bad: bool = False
    health: list[RefGpu] = field(default_factory=list)


class Reference:
    def __init__(self, nodes: dict[str, int], policy: PolicySpec) -> None:
        self.nodes = {name: RefNode(gpus=count) for name, count in nodes.items()}
        self.policy = policy

    def usable(self, node: str, index: int) -> bool:
        record = self.nodes[node]
        if not record.registered or record.liveness != "up":
            return False
        if record.cordoned or record.draining or record.admin_bad:
            return False
        gpu = record.health[index]
        return not gpu.failed and not gpu.admin_bad

    def register(self, node: str, boot: str, now_ms: int) -> None:
        record = self.nodes[node]
        if not record.health:  # a node registered before (deregistered since) keeps it
            record.health = [RefGpu() for _ in range(record.gpus)]
        if not record.registered or record.boot != boot:
            record.incarnation += 1
        record.registered, record.boot, record.liveness = True, boot, "up"
        record.lease_ms = now_ms + self.policy.lease_ms

    def heartbeat(self, node: str, now_ms: int) -> bool:
        record = self.nodes[node]
        if not record.registered:
            return False
        record.lease_ms = now_ms + self.policy.lease_ms
        record.liveness = "up"
        return True

    def tick(self, now_ms: int) -> None:
        for name in sorted(self.nodes):
            record = self.nodes[name]
            if record.liveness == "up" and now_ms > record.lease_ms:
                record.liveness = "suspect"
                record.lease_ms = now_ms  # Down counts from the Tick that saw it expire
            if record.liveness == "suspect" and now_ms > record.lease_ms + (
                    self.policy.down_after_ms):
                record.liveness = "down"

    def report(self, node: str, index: int, status: str) -> bool:
        record = self.nodes[node]
        if not record.registered:
            return False
        gpu = record.health[index]
        if status == "pass":
            gpu.passes += 1
            if gpu.failed and gpu.passes >= self.policy.recover_reports:
                gpu.failed = False
        else:
            gpu.passes = 0
            gpu.failed = gpu.failed or status == "fail"
        return True

    def mark(self, node: str, index: int | None, bad: bool) -> bool:
        record = self.nodes[node]
        if index is None:
            record.admin_bad = bad
            if not bad:  # clearing the whole node clears its GPUs' marks too
                for gpu in record.health:
                    gpu.admin_bad = False
            return True
        if not record.health:  # never registered: the GPU is unknown
            return False
        record.health[index].admin_bad = bad
        if not bad:
            record.health[index].failed = False
            record.health[index].passes = 0
        return True

    def deregister(self, node: str) -> None:
        """The registration goes; the cordon, drain, marks and GPU health stay."""
        record = self.nodes[node]
        record.registered, record.boot, record.liveness = False, "", "unregistered"


def packs(pods: Sequence[int], free: Sequence[int]) -> bool:
    """Whether pods fit into nodes with these free GPU counts, each pod on one node."""
    room = sorted(free)
    for pod in sorted(pods, reverse=True):
        for position, available in enumerate(room):
            if available >= pod:
                room[position] -= pod
                break
        else:
            return False
    return True


@dataclass(frozen=True)
class ExitOutcome:
    """What a pod's first exit report does to its gang: `evicting` is the reason it is told to
    leave (its other live pods killed), empty when it is not; `released` says it is gone."""

    evicting: str
    released: bool
    kills: tuple[str, ...]  # the pods told to stop by this report


def pod_exit_outcome(*, policy: str, exit_code: int, reason: str, pod_uid: str,
                     allocated: bool, evicting: str, others: Sequence[tuple[str, str]]
                     ) -> ExitOutcome:
    """The gang after its pod `pod_uid` (live until now) is reported exited; `others` are its
    other pods as (uid, phase). A failed pod (any code but 0) of an allocated gang told to
    leave by nobody evicts it under policy "release"; an evicting gang with no live pod left,
    or an allocated one with every pod exited, is released."""
    live = tuple(uid for uid, phase in others if phase in ("bound", "running"))
    if exit_code != 0 and allocated and not evicting and policy == "release":
        why = f": {reason}" if reason else ""
        failed = f"pod {pod_uid} failed with exit code {exit_code}{why}"
        return ExitOutcome(evicting=failed, released=not live, kills=live)
    if allocated and evicting:
        return ExitOutcome(evicting=evicting, released=not live, kills=())
    done = allocated and all(phase == "exited" for _, phase in others)
    return ExitOutcome(evicting="", released=done, kills=())
