"""Lifecycle sequences with preemption, checked for leaks the invariant checker
does not look for.

After every command, besides `check_invariants` (the Driver runs it):

- no quota leak: every VC cell bound is used by a guaranteed gang of that VC (held or
  reserved), so an idle tenant's quota is entirely unbound;
- no stuck preemptor: a Preempting gang has at least one reserved GPU still held (else
  nothing will ever settle it);
- no stuck gang: an evicting gang has a live pod; no allocated gang has every pod exited
  (pods exit with success, failure, a kill or as lost, under either pod failure policy);
- drain to empty: on a restored copy, releasing every gang leaves every GPU free and every
  VC cell unbound (no GPU leaked, no quota drift), and restore gives the same snapshot.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from statemachine.commands import (
    AckPodStarted,
    ApplyConfig,
    BindPod,
    ClearBad,
    Cordon,
    Deregister,
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
from statemachine.lifecycle import LIVE_PHASES, pod_uuids
from statemachine.results import GroupPhase, PodPhase
from statemachine.sessions import Sessions
from statemachine.snapshot_codec import decode_snapshot, encode_snapshot
from statemachine.spec import FailurePolicy, PolicySpec
from statemachine.state import State
from tests.statemachine.builders import (
    ADMIN,
    SCHEDULER,
    SYSTEM,
    Driver,
    gang,
    inventory,
    newest_rules,
    node_principal,
    rack_spec,
    vc,
)

NODES = ("n0", "n1", "n2", "n3")
POLICY = PolicySpec(lease_ms=3_000, down_after_ms=3_000, preemption_grace_ms=2_000,
                    recover_reports=1, schedule_attempts_max=8)
SPEC = rack_spec(racks=2, quota=(vc("a", ("A100-RACK", "A100-NODE", 1)),
                                 vc("b", ("A100-RACK", "A100-SOCK", 2),
                                    on_failure=FailurePolicy.RELEASE)),
                 policy=POLICY)
SPECS = (SPEC, rack_spec(racks=2, quota=(vc("a", ("A100-RACK", "A100-SOCK", 3)),
                                         vc("b", ("A100-RACK", "A100-NODE", 1)),
                                         vc("c", ("A100-RACK", "A100-SW", 2))),
                         policy=POLICY))


def lifecycle_violations(state: State) -> list[str]:
    found = []
    config = state.configured()
    buddy, cells, topology = config.buddy, config.cells, config.topology
    for root, vc_name in enumerate(buddy.bound_vc):
        if not vc_name:
            continue
        users = {name for leaf in topology.leaves(root)
                 for name in (cells.holder[leaf], cells.reserver[leaf]) if name}
        if not any(state.groups[name].vc == vc_name and state.groups[name].guaranteed
                   for name in users if name in state.groups):
            found.append(f"cell {root} stays bound to {vc_name} with no guaranteed user "
                         f"(users {sorted(users)})")
    for name in sorted(state.groups):
        group = state.groups[name]
        if group.phase is GroupPhase.PREEMPTING and not any(
                cells.holder[leaf] for leaf in group.leaves()):
            found.append(f"preemptor {name} has all its GPUs vacated but still preempts")
        if group.phase is GroupPhase.ALLOCATED:
            if group.evicting and not any(pod.phase in LIVE_PHASES for pod in group.pods):
                found.append(f"gang {name} is evicting with no live pod: never released")
            if all(pod.phase is PodPhase.EXITED for pod in group.pods):
                found.append(f"gang {name} has every pod exited but still holds GPUs")
    return found


def drained_copy_violations(state: State) -> list[str]:
    """Release every gang on a restored copy: nothing may stay held, reserved or bound."""
    snapshot = encode_snapshot(state, Sessions(), 0)
    copy, _, _ = decode_snapshot(snapshot)
    found = []
    if encode_snapshot(copy, Sessions(), 0) != snapshot:
        found.append("a restored copy encodes differently")
    driver = Driver(state=copy, now_ms=copy.now_ms)
    while copy.groups:
        driver.ok(ReleaseGroup(group=sorted(copy.groups)[0], reason="drain"), SCHEDULER)
    config = copy.configured()
    for leaf, (holder, reserver) in enumerate(zip(config.cells.holder, config.cells.reserver,
                                                  strict=True)):
        if holder or reserver:
            found.append(f"GPU cell {leaf} is still held/reserved by {holder!r}/{reserver!r}")
    if any(config.buddy.bound_vc):
        found.append(f"cells still bound with no gang: "
                     f"{[c for c, v in enumerate(config.buddy.bound_vc) if v]}")
    for vc_name, rows in config.buddy.unbound.items():
        if rows != [list(row) for row in config.topology.quota[vc_name]]:
            found.append(f"VC {vc_name}: unbound {rows} != quota")
    return found


class LifecycleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.driver = Driver(state=newest_rules())
        self.driver.configure(SPEC)
        self.boots = 0
        self.count = 0
        for node in NODES:
            self.register(node, reboot=False)

    @property
    def state(self) -> State:
        return self.driver.state

    def register(self, node: str, reboot: bool) -> None:
        record = self.state.nodes[node]
        if reboot or not record.boot_id:
            self.boots += 1
            boot = f"boot-{self.boots}"
        else:
            boot = record.boot_id
        self.driver.ok(RegisterNode(node=node, boot_id=boot, gpus=inventory(node)),
                       node_principal(node))

    @rule(vc_name=st.sampled_from("ab"), priority=st.sampled_from((-1, 0, 3, 7)),
          pods=st.integers(1, 2), gpus=st.sampled_from((1, 2, 4, 8)), lazy=st.booleans(),
          on_pod_failure=st.sampled_from(tuple(FailurePolicy)))
    def submit(self, *, vc_name: str, priority: int, pods: int, gpus: int, lazy: bool,
               on_pod_failure: FailurePolicy) -> None:
        self.count += 1
        self.driver.run(gang(f"g{self.count:02d}", vc_name, priority, (pods, gpus), lazy=lazy,
                             on_pod_failure=on_pod_failure), SCHEDULER)

    @rule(index=st.integers(0, 30))
    def release(self, index: int) -> None:
        names = sorted(self.state.groups)
        if names:
            self.driver.ok(ReleaseGroup(group=names[index % len(names)], reason="done"),
                           SCHEDULER)

    @rule(index=st.integers(0, 30))
    def bind(self, index: int) -> None:
        slots = [(name, pod.member) for name, group in sorted(self.state.groups.items())
                 if group.phase is GroupPhase.ALLOCATED for pod in group.pods
                 if pod.phase is PodPhase.UNBOUND]
        if slots:
            name, member = slots[index % len(slots)]
            self.driver.run(BindPod(group=name, member=member, pod_uid=f"{name}-{index}"),
                            SCHEDULER)

    @rule(index=st.integers(0, 30), exit_instead=st.booleans(),
          exit_code=st.sampled_from((0, 0, 1, 137, -1)))
    def agent(self, index: int, exit_instead: bool, exit_code: int) -> None:
        state = self.state
        live = [(name, position) for name, group in sorted(state.groups.items())
                for position, pod in enumerate(group.pods) if pod.phase in LIVE_PHASES]
        if not live:
            return
        name, position = live[index % len(live)]
        group = state.groups[name]
        pod = group.pods[position]
        node = state.configured().topology.node_ids[pod.node]
        incarnation = state.nodes[node].incarnation
        if exit_instead:
            self.driver.run(ReportPodExit(node=node, incarnation=incarnation, group=name,
                                          pod_uid=pod.pod_uid, exit_code=exit_code),
                            node_principal(node))
        else:
            self.driver.run(AckPodStarted(node=node, incarnation=incarnation, group=name,
                                          pod_uid=pod.pod_uid,
                                          gpu_uuids=pod_uuids(state, group, position)),
                            node_principal(node))

    @rule(step_ms=st.sampled_from((100, 2_500, 7_000)), silent=st.booleans())
    def tick(self, step_ms: int, silent: bool) -> None:
        if not silent:
            for node in NODES:
                record = self.state.nodes[node]
                if record.registered:
                    self.driver.ok(Heartbeat(node=node, incarnation=record.incarnation),
                                   node_principal(node))
        self.driver.ok(Tick(), SYSTEM, step_ms=step_ms)

    @rule(which=st.integers(0, 3),
          kind=st.sampled_from(("register", "reboot", "deregister", "drain", "cordon",
                                "uncordon", "mark", "clear", "fail", "pass")),
          index=st.integers(0, 7))
    def node_event(self, which: int, kind: str, index: int) -> None:
        node = NODES[which % len(NODES)]
        record = self.state.nodes[node]
        gpu = f"GPU-{node}-{index}"
        if kind in ("register", "reboot"):
            self.register(node, reboot=kind == "reboot")
        elif kind == "deregister":
            self.driver.ok(Deregister(node=node, force=True), ADMIN)
        elif kind == "drain":
            self.driver.ok(Drain(node=node), ADMIN)
        elif kind == "cordon":
            self.driver.ok(Cordon(node=node), ADMIN)
        elif kind == "uncordon":
            self.driver.ok(Uncordon(node=node), ADMIN)
        elif kind == "mark":
            self.driver.run(MarkBad(node=node, gpu=gpu, reason="admin"), ADMIN)
        elif kind == "clear":
            self.driver.run(ClearBad(node=node, gpu=gpu), ADMIN)
        else:
            status = HealthStatus.FAIL if kind == "fail" else HealthStatus.PASS
            self.driver.run(ReportHealth(node=node, incarnation=record.incarnation, reports=(
                HealthReport(uuid=gpu, status=status, reason=kind),)), node_principal(node))

    @rule(which=st.integers(0, 1))
    def reconfigure(self, which: int) -> None:
        version = self.state.configured().version
        self.driver.run(ApplyConfig(expected_version=version, spec=SPECS[which]), ADMIN)

    @invariant()
    def no_leak_no_stuck(self) -> None:
        found = lifecycle_violations(self.state)
        assert not found, found

    @invariant()
    def drains_to_empty(self) -> None:
        found = drained_copy_violations(self.state)
        assert not found, found


LifecycleMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestLifecycle = LifecycleMachine.TestCase
