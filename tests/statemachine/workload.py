"""A seeded, closed-loop workload: a log of envelopes exercising every command, for replay,
snapshot and hash-seed tests. The generator watches a machine as it goes so its commands are
mostly meaningful (binding pods of allocated gangs, exits of running ones), with a share of
refused ones mixed in; the same seed always gives the same log."""

from __future__ import annotations

from collections.abc import Callable

from consensus.codec import encode_envelope
from consensus.envelope import Envelope, Principal, Role
from consensus.prng import Prng
from statemachine import Machine
from statemachine.codec import encode_command
from statemachine.commands import (
    AckPodStarted,
    ApplyConfig,
    BindPod,
    ClearBad,
    Command,
    Cordon,
    Drain,
    HealthReport,
    HealthStatus,
    Heartbeat,
    MarkBad,
    RegisterNode,
    ReleaseGroup,
    ReportHealth,
    ReportPodExit,
    Tick,
    Uncordon,
)
from statemachine.lifecycle import pod_uuids
from statemachine.limits import SESSION_TTL_MS_MIN
from statemachine.results import GroupPhase, PodPhase
from statemachine.spec import FailurePolicy, PolicySpec
from tests.statemachine.builders import ADMIN, SCHEDULER, SYSTEM, gang, inventory, rack_spec, vc

NODES = tuple(f"n{index}" for index in range(6))
QUOTA = (vc("a", ("A100-RACK", "A100-NODE", 2)), vc("b", ("A100-RACK", "A100-RACK", 1)),
         vc("c", ("A100-RACK", "A100-SOCK", 2), on_failure=FailurePolicy.RELEASE))
POLICY = PolicySpec(lease_ms=3_000, down_after_ms=3_000, preemption_grace_ms=2_000,
                    session_ttl_ms=SESSION_TTL_MS_MIN, recover_reports=2)


class Workload:
    def __init__(self, seed: int) -> None:
        self.prng = Prng(seed)
        self.machine = Machine()
        self.now_ms = 1_000
        self.sequence = 0
        self.next_group = 0
        self.log: list[bytes] = []

    def send(self, command: Command, principal: Principal) -> bytes:
        self.now_ms += self.prng.int_inclusive(0, 400)
        self.sequence += 1
        sequence = 0 if principal.role is Role.SYSTEM else self.sequence
        entry = encode_envelope(Envelope(principal=principal, session=f"{principal.name}",
                                         sequence=sequence, now_ms=self.now_ms,
                                         body=encode_command(command)))
        self.log.append(entry)
        return self.machine.apply(entry)

    def start(self) -> None:
        self.send(ApplyConfig(expected_version=0, spec=rack_spec(quota=QUOTA, policy=POLICY)),
                  ADMIN)
        for node in NODES:
            self.send(RegisterNode(node=node, boot_id="boot", gpus=inventory(node)),
                      Principal(Role.NODE, node))

    def step(self) -> None:
        actions: list[tuple[int, Callable[[], None]]] = [
            (6, self.submit), (4, self.bind), (3, self.ack), (3, self.exit), (2, self.release),
            (3, self.heartbeats), (2, self.tick), (1, self.health), (1, self.admin),
        ]
        pick = self.prng.below(sum(weight for weight, _ in actions))
        for weight, action in actions:
            if pick < weight:
                action()
                return
            pick -= weight

    def submit(self) -> None:
        self.next_group += 1
        members = [(self.prng.int_inclusive(1, 3), self.prng.choice((1, 2, 4, 8)))
                   for _ in range(self.prng.int_inclusive(1, 2))]
        self.send(gang(f"g{self.next_group}", self.prng.choice(("a", "b", "c")),
                       self.prng.choice((-1, 0, 3, 7)), *members,
                       lazy=self.prng.chance_ppm(300_000)), SCHEDULER)

    def _groups(self, phase: GroupPhase) -> list[str]:
        return sorted(name for name, group in self.machine.state.groups.items()
                      if group.phase is phase)

    def bind(self) -> None:
        allocated = self._groups(GroupPhase.ALLOCATED)
        name = self.prng.choice(allocated) if allocated else "nobody"
        self.send(BindPod(group=name, member=0, pod_uid=f"{name}-p{self.prng.below(4)}"),
                  SCHEDULER)

    def _pods(self, phase: PodPhase) -> list[tuple[str, str, str]]:
        state = self.machine.state
        if state.config is None:
            return []
        ids = state.config.topology.node_ids
        return sorted((name, pod.pod_uid, ids[pod.node]) for name, group in state.groups.items()
                      for pod in group.pods if pod.phase is phase)

    def ack(self) -> None:
        pods = self._pods(PodPhase.BOUND)
        if pods:
            name, uid, node = self.prng.choice(pods)
            group = self.machine.state.groups[name]
            position = next(index for index, pod in enumerate(group.pods) if pod.pod_uid == uid)
            self.send(AckPodStarted(node=node, incarnation=self.machine.state.nodes[node]
                                    .incarnation, group=name, pod_uid=uid,
                                    gpu_uuids=pod_uuids(self.machine.state, group, position)),
                      Principal(Role.NODE, node))

    def exit(self) -> None:
        pods = self._pods(PodPhase.RUNNING) + self._pods(PodPhase.BOUND)
        if pods:
            name, uid, node = self.prng.choice(pods)
            self.send(ReportPodExit(node=node, incarnation=self.machine.state.nodes[node]
                                    .incarnation, group=name, pod_uid=uid, exit_code=0),
                      Principal(Role.NODE, node))

    def release(self) -> None:
        names = sorted(self.machine.state.groups) or ["nobody"]
        self.send(ReleaseGroup(group=self.prng.choice(names), reason="done"), SCHEDULER)

    def heartbeats(self) -> None:
        for node in NODES:
            if self.prng.chance_ppm(800_000):
                record = self.machine.state.nodes[node]
                self.send(Heartbeat(node=node, incarnation=record.incarnation),
                          Principal(Role.NODE, node))

    def tick(self) -> None:
        self.now_ms += self.prng.choice((0, 500, 4_000))
        self.send(Tick(), SYSTEM)

    def health(self) -> None:
        node = self.prng.choice(NODES)
        status = self.prng.choice(tuple(HealthStatus))
        self.send(ReportHealth(node=node, incarnation=self.machine.state.nodes[node].incarnation,
                               reports=(HealthReport(uuid=f"GPU-{node}-{self.prng.below(8)}",
                                                     status=status, reason=status.value),)),
                  Principal(Role.NODE, node))

    def admin(self) -> None:
        node = self.prng.choice(NODES)
        commands: tuple[Command, ...] = (
            MarkBad(node=node, gpu=f"GPU-{node}-{self.prng.below(8)}", reason="admin"),
            ClearBad(node=node, gpu=f"GPU-{node}-{self.prng.below(8)}"),
            Cordon(node=node), Uncordon(node=node), Drain(node=node))
        self.send(self.prng.choice(commands), ADMIN)


def workload_log(seed: int, steps: int) -> list[bytes]:
    workload = Workload(seed)
    workload.start()
    for _ in range(steps):
        workload.step()
    return workload.log
