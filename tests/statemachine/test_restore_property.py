"""Property: a replica restored from a snapshot at any point agrees with one that never
restored, reply for reply and digest for digest.

Method: one log of envelopes goes to two machines. One only applies; the other, at points
Hypothesis picks, is replaced by a machine restored from its own snapshot. Every reply must be
the same bytes, every restored state must keep the invariants and have the same digest. The
log is drawn from the state as it goes (so most commands mean something): configurations that
change the session lifetime and the tenants, registrations (reboots, new boards), heartbeats,
health reports, admin marks, cordons, drains and deregistrations, gangs submitted, bound,
started, exited and released, Ticks that expire leases and sessions, and exactly-once sessions
with retries and late copies of earlier commands (the cached replies and expiries are in the
snapshot too). Short logs, so that the default profile runs in a few seconds.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from consensus.codec import encode_envelope
from consensus.envelope import Envelope, Principal, Role
from statemachine import Machine, check_invariants
from statemachine.codec import encode_command
from statemachine.commands import (
    AckPodStarted,
    ApplyConfig,
    BindPod,
    ClearBad,
    Command,
    Cordon,
    Deregister,
    Drain,
    GpuInventory,
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
from statemachine.spec import ClusterSpec, FailurePolicy, PolicySpec
from tests.statemachine.builders import ADMIN, SCHEDULER, SYSTEM, gang, inventory, rack_spec, vc

NODES = ("n0", "n1", "n2", "n3")
SPECS: tuple[ClusterSpec, ...] = (
    rack_spec(racks=2, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),
                              vc("b", ("A100-RACK", "A100-SOCK", 2),
                                 on_failure=FailurePolicy.RELEASE)),
              policy=PolicySpec(lease_ms=3_000, down_after_ms=3_000, preemption_grace_ms=2_000,
                                session_ttl_ms=SESSION_TTL_MS_MIN, recover_reports=2)),
    rack_spec(racks=2, quota=(vc("a", ("A100-RACK", "A100-RACK", 1)),
                              vc("b", ("A100-RACK", "A100-NODE", 1))),
              policy=PolicySpec(lease_ms=5_000, down_after_ms=2_000, preemption_grace_ms=1_000,
                                session_ttl_ms=5 * SESSION_TTL_MS_MIN, recover_reports=1)),
)
SESSIONS = ("s0", "s1", "s2")  # per principal
STEPS_MAX = 30
STEPS = ("submit", "submit", "bind", "ack", "exit", "release", "heartbeat", "tick", "health",
         "admin", "register", "config", "copy")


def boards(node: str, serial: int) -> tuple[GpuInventory, ...]:
    """A node's GPUs; serial 0 is the original boards, another one a new board at GPU 0."""
    gpus = inventory(node)
    return gpus if serial == 0 else (replace(gpus[0], uuid=f"GPU-{node}-0-{serial}"), *gpus[1:])


def assert_same_derived(restored: Machine, straight: Machine) -> None:
    """What a snapshot does not hold but a restore rebuilds (the digest does not cover it)."""
    state, other = restored.state, straight.state
    assert state.uuid_owner == other.uuid_owner
    assert state.queue.keys == other.queue.keys
    assert restored.sessions.table == straight.sessions.table
    if state.config is not None and other.config is not None:
        for field in ("holder", "holder_priority", "reserver", "reserver_priority", "usable",
                      "free", "bad"):
            assert getattr(state.config.cells, field) == getattr(other.config.cells, field), field
        for field in ("free_lists", "split", "bound_vc", "bound_root", "unbound", "demand"):
            assert getattr(state.config.buddy, field) == getattr(other.config.buddy, field), field


class Log:
    """Draws the next command from the state of the machine that never restores, and applies
    it to both machines."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data
        self.straight = Machine()
        self.restored = Machine()
        self.now_ms = 1_000
        self.sequences: dict[tuple[str, str], int] = {}
        self.sent: list[bytes] = []
        self.groups = 0

    def send(self, command: Command, principal: Principal) -> None:
        self.now_ms += self.data.draw(st.sampled_from((0, 1, 300)))
        session, sequence = "", 0
        if principal.role is not Role.SYSTEM:
            session = self.data.draw(st.sampled_from(SESSIONS))
            sequence = self.sequences.get((principal.text, session), 0) + 1
            self.sequences[principal.text, session] = sequence
        self.apply(encode_envelope(Envelope(principal=principal, session=session,
                                            sequence=sequence, now_ms=self.now_ms,
                                            body=encode_command(command))))

    def apply(self, entry: bytes) -> None:
        self.sent.append(entry)
        reply = self.straight.apply(entry)
        assert self.restored.apply(entry) == reply, f"replies differ at entry {len(self.sent)}"
        if self.data.draw(st.integers(0, 3)) == 0:
            restored = Machine()
            restored.restore(self.restored.snapshot())
            check_invariants(restored.state)
            self.restored = restored
            assert restored.digest() == self.straight.digest()
            assert_same_derived(restored, self.straight)

    def step(self) -> None:
        getattr(self, f"_{self.data.draw(st.sampled_from(STEPS))}")()

    def _pods(self, *phases: PodPhase) -> list[tuple[str, int]]:
        return [(name, position) for name, group in sorted(self.straight.state.groups.items())
                for position, pod in enumerate(group.pods) if pod.phase in phases
                and group.phase is not GroupPhase.PENDING]

    def _node(self) -> str:
        return self.data.draw(st.sampled_from(NODES))

    def _submit(self) -> None:
        self.groups += 1
        pods, gpus = self.data.draw(st.tuples(st.integers(1, 2), st.sampled_from((1, 2, 4, 8))))
        self.send(gang(f"g{self.groups}", self.data.draw(st.sampled_from("ab")),
                       self.data.draw(st.sampled_from((-1, 0, 5))), (pods, gpus)), SCHEDULER)

    def _bind(self) -> None:
        pods = self._pods(PodPhase.UNBOUND)
        if pods:
            name, position = self.data.draw(st.sampled_from(pods))
            pod = self.straight.state.groups[name].pods[position]
            self.send(BindPod(group=name, member=pod.member, pod_uid=f"{name}-{position}",
                              command=("train",)), SCHEDULER)

    def _ack(self) -> None:
        pods = self._pods(PodPhase.BOUND)
        if pods:
            name, position = self.data.draw(st.sampled_from(pods))
            state = self.straight.state
            group = state.groups[name]
            node = state.configured().topology.node_ids[group.pods[position].node]
            self.send(AckPodStarted(node=node, incarnation=state.nodes[node].incarnation,
                                    group=name, pod_uid=group.pods[position].pod_uid,
                                    gpu_uuids=pod_uuids(state, group, position)),
                      Principal(Role.NODE, node))

    def _exit(self) -> None:
        pods = self._pods(PodPhase.BOUND, PodPhase.RUNNING)
        if pods:
            name, position = self.data.draw(st.sampled_from(pods))
            state = self.straight.state
            pod = state.groups[name].pods[position]
            node = state.configured().topology.node_ids[pod.node]
            self.send(ReportPodExit(node=node, incarnation=state.nodes[node].incarnation,
                                    group=name, pod_uid=pod.pod_uid,
                                    exit_code=self.data.draw(st.sampled_from((0, 1)))),
                      Principal(Role.NODE, node))

    def _release(self) -> None:
        names = sorted(self.straight.state.groups) or ["nobody"]
        self.send(ReleaseGroup(group=self.data.draw(st.sampled_from(names)), reason="done"),
                  SCHEDULER)

    def _heartbeat(self) -> None:
        for node in NODES:
            record = self.straight.state.nodes.get(node)
            if record is not None and record.registered:
                self.send(Heartbeat(node=node, incarnation=record.incarnation),
                          Principal(Role.NODE, node))

    def _tick(self) -> None:  # sometimes long enough for leases and sessions to run out
        self.now_ms += self.data.draw(st.sampled_from((100, 4_000, SESSION_TTL_MS_MIN)))
        self.send(Tick(), SYSTEM)

    def _health(self) -> None:
        node = self._node()
        record = self.straight.state.nodes.get(node)
        uuid = record.gpus[0].uuid if record is not None and record.gpus else f"GPU-{node}-0"
        status = self.data.draw(st.sampled_from((HealthStatus.FAIL, HealthStatus.PASS)))
        incarnation = record.incarnation if record is not None else 0
        self.send(ReportHealth(node=node, incarnation=incarnation, reports=(
            HealthReport(uuid=uuid, status=status, reason=f"{status.value} {self.now_ms}"),)),
            Principal(Role.NODE, node))

    def _admin(self) -> None:
        node = self._node()
        gpu = self.data.draw(st.sampled_from(("", f"GPU-{node}-3")))
        commands: tuple[Command, ...] = (
            MarkBad(node=node, gpu=gpu, reason="admin"), ClearBad(node=node, gpu=gpu),
            Cordon(node=node), Uncordon(node=node), Drain(node=node),
            Deregister(node=node, force=True))
        self.send(self.data.draw(st.sampled_from(commands)), ADMIN)

    def _register(self) -> None:
        node = self._node()
        boot, serial = self.data.draw(st.tuples(st.integers(0, 2), st.integers(0, 2)))
        self.send(RegisterNode(node=node, boot_id=f"boot-{boot}", gpus=boards(node, serial)),
                  Principal(Role.NODE, node))

    def _config(self) -> None:
        config = self.straight.state.config
        version = config.version if config is not None else 0
        self.send(ApplyConfig(expected_version=version, spec=SPECS[version % len(SPECS)]),
                  ADMIN)

    def _copy(self) -> None:
        """A retry or a late copy of an entry sent before: the cached reply, a refusal, or
        (its session forgotten, its stamp recent) a new command."""
        if self.sent:
            self.apply(self.sent[self.data.draw(st.integers(0, len(self.sent) - 1))])


@given(st.data())
def test_a_restored_replica_agrees_with_one_that_never_restored(data: st.DataObject) -> None:
    log = Log(data)
    log.send(ApplyConfig(expected_version=0, spec=SPECS[0]), ADMIN)
    for node in NODES:
        log.send(RegisterNode(node=node, boot_id="boot-0", gpus=boards(node, 0)),
                 Principal(Role.NODE, node))
    for _ in range(data.draw(st.integers(1, STEPS_MAX))):
        log.step()
    check_invariants(log.straight.state)
    final = Machine()
    final.restore(log.restored.snapshot())
    assert final.digest() == log.straight.digest() == log.restored.digest()
    assert final.snapshot() == log.straight.snapshot()
    assert_same_derived(final, log.straight)
