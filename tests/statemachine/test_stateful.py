"""Random command sequences against a naive reference, with every invariant after every step.

Goal: find any sequence of registrations, health changes, cordons and drains, gangs of mixed
sizes and priorities, binds, exits, releases, ticks and configuration changes after which the
state machine breaks an invariant or disagrees with the reference. Method: a Hypothesis
`RuleBasedStateMachine` drives the typed `apply` and a `Reference` (tests/statemachine/
reference.py) side by side and checks, after every step:

- every invariant of the checker;
- GPU usability equals the reference's health and liveness model, GPU by GPU;
- a gang placed in this step lies only on GPUs usable now;
- an opportunistic gang is allocated exactly when plain bin packing says it fits;
- a pod's exit is announced, and evicts, releases or keeps its gang as the reference's pod
  failure policy says, under either policy;
- the guarantee: a guaranteed gang of a tenant that runs nothing guaranteed, on healthy
  hardware, that fits the tenant's own cells as a private cluster, is never left pending.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

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
    SubmitGroup,
    Uncordon,
)
from statemachine.effects import Effect, EffectKind
from statemachine.errors import Rejection
from statemachine.lifecycle import pod_uuids
from statemachine.results import GroupPhase, GroupStatus, PodPhase
from statemachine.spec import (
    CellTypeSpec,
    ClusterSpec,
    FailurePolicy,
    GpuModelSpec,
    PhysicalCellSpec,
    PolicySpec,
)
from tests.statemachine.builders import (
    A100_TYPES,
    ADMIN,
    SCHEDULER,
    Driver,
    gang,
    inventory,
    newest_rules,
    node_principal,
    vc,
)
from tests.statemachine.reference import ExitOutcome, Reference, packs, pod_exit_outcome

POLICY = PolicySpec(lease_ms=3_000, down_after_ms=3_000, preemption_grace_ms=2_000,
                    recover_reports=2, schedule_attempts_max=4)
T4_TYPES = (CellTypeSpec(name="T4-SW", child="T4", child_count=2),
            CellTypeSpec(name="T4-NODE", child="T4-SW", child_count=2, node_level=True))
NODES = {"n0": 8, "n1": 8, "n2": 8, "n3": 8, "t0": 4, "t1": 4, "t2": 4}


def spec(second: bool) -> ClusterSpec:
    if second:
        quota = (vc("a", ("A100-RACK", "A100-NODE", 2)),
                 vc("b", ("A100-RACK", "A100-NODE", 1), ("T4-NODE", "T4-NODE", 2)),
                 vc("c", ("T4-NODE", "T4-NODE", 1), on_failure=FailurePolicy.RELEASE))
    else:
        quota = (vc("a", ("A100-RACK", "A100-NODE", 1), ("T4-NODE", "T4-NODE", 1)),
                 vc("b", ("A100-RACK", "A100-RACK", 1)),
                 vc("c", ("A100-RACK", "A100-SOCK", 2), on_failure=FailurePolicy.RELEASE))
    return ClusterSpec(
        gpu_models=(GpuModelSpec(name="A100", memory_mib=81920),
                    GpuModelSpec(name="T4", memory_mib=16384)),
        cell_types=(*A100_TYPES, *T4_TYPES),
        physical_cells=(PhysicalCellSpec(cell_type="A100-RACK", nodes=("n0", "n1")),
                        PhysicalCellSpec(cell_type="A100-RACK", nodes=("n2", "n3")),
                        *(PhysicalCellSpec(cell_type="T4-NODE", nodes=(name,))
                          for name in ("t0", "t1", "t2"))),
        virtual_clusters=quota, policy=POLICY)


node_names = st.sampled_from(sorted(NODES))
members = st.lists(st.tuples(st.integers(1, 3), st.sampled_from((1, 2, 4, 8))),
                   min_size=1, max_size=2)
# An exit code and reason an agent reports: success, a failure, a kill, a lost pod.
exits = st.sampled_from(((0, ""), (1, ""), (137, "killed by signal 9 (SIGKILL)"),
                         (-1, "lost: not running when the agent reconciled")))


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.driver = Driver(state=newest_rules())
        self.reference = Reference(NODES, POLICY)
        self.second = False
        self.driver.configure(spec(self.second))
        self.placed: dict[str, tuple[int, ...]] = {}
        self.boots = 0
        self.groups = 0
        for node in sorted(NODES):
            self.register(node, reboot=False)

    @property
    def now_ms(self) -> int:
        return self.driver.state.now_ms

    def accepted(self, result: object, expected: bool) -> None:
        assert (not isinstance(result, Rejection)) == expected, result

    # Nodes.

    @rule(node=node_names, kind=st.sampled_from(("register", "reboot", "heartbeat", "mark",
                                                  "clear", "cordon", "uncordon", "drain",
                                                  "deregister")),
          index=st.integers(0, 3), whole=st.booleans())
    def node_event(self, node: str, kind: str, index: int, whole: bool) -> None:
        """Something happens to a node: its agent registers, reboots or heartbeats, or an admin
        marks, clears, cordons, drains or deregisters it."""
        if kind in ("register", "reboot"):
            self.register(node, reboot=kind == "reboot")
        elif kind == "heartbeat":
            self.heartbeat(node)
        elif kind in ("mark", "clear"):
            self.mark(node, None if whole else index, kind == "mark")
        elif kind == "deregister":
            self.deregister(node)
        else:
            self.cordon(node, kind)

    @rule(node=st.sampled_from(("n0", "t0")), index=st.integers(0, 1),
          status=st.sampled_from(tuple(HealthStatus)))
    def gpu_health(self, node: str, index: int, status: HealthStatus) -> None:
        """An agent reports a GPU's health; few GPUs, so that reports meet their history."""
        self.report_health(node, index, status)

    def register(self, node: str, reboot: bool) -> None:
        record = self.reference.nodes[node]
        if reboot or not record.boot:
            self.boots += 1
        boot = f"boot-{self.boots}" if reboot or not record.boot else record.boot
        count = NODES[node]
        model = "A100" if count == 8 else "T4"
        self.driver.ok(RegisterNode(node=node, boot_id=boot, gpus=inventory(node, count, model)),
                       node_principal(node))
        self.reference.register(node, boot, self.now_ms)

    def heartbeat(self, node: str) -> None:
        record = self.reference.nodes[node]
        result = self.driver.run(Heartbeat(node=node, incarnation=record.incarnation),
                                 node_principal(node))
        self.accepted(result, self.reference.heartbeat(node, self.now_ms))

    @rule(step_ms=st.sampled_from((100, 2_000, 3_500, 7_000)), silent=st.booleans())
    def tick(self, step_ms: int, silent: bool) -> None:
        """Time passes; unless `silent`, every registered agent heartbeats first."""
        if not silent:
            for node in sorted(NODES):
                if self.reference.nodes[node].registered:
                    self.heartbeat(node)
                    self.new_placements_are_on_usable_gpus()
        self.driver.tick(step_ms=step_ms)
        self.reference.tick(self.now_ms)

    def report_health(self, node: str, index: int, status: HealthStatus) -> None:
        record = self.reference.nodes[node]
        command = ReportHealth(node=node, incarnation=record.incarnation, reports=(
            HealthReport(uuid=f"GPU-{node}-{index}", status=status, reason=status.value),))
        result = self.driver.run(command, node_principal(node))
        self.accepted(result, self.reference.report(node, index, status.value))

    def mark(self, node: str, index: int | None, bad: bool) -> None:
        gpu = "" if index is None else f"GPU-{node}-{index}"
        command = MarkBad(node=node, gpu=gpu, reason="admin") if bad else ClearBad(node=node,
                                                                                   gpu=gpu)
        result = self.driver.run(command, ADMIN)
        self.accepted(result, self.reference.mark(node, index, bad))

    def cordon(self, node: str, action: str) -> None:
        command: Cordon | Uncordon | Drain = (
            Cordon(node=node) if action == "cordon" else
            Uncordon(node=node) if action == "uncordon" else Drain(node=node))
        self.driver.ok(command, ADMIN)
        record = self.reference.nodes[node]
        record.cordoned = action != "uncordon"
        record.draining = action == "drain" or (record.draining and action == "cordon")

    def deregister(self, node: str) -> None:
        self.driver.ok(Deregister(node=node, force=True), ADMIN)
        self.reference.deregister(node)

    # Configuration.

    @rule()
    def reconfigure(self) -> None:
        self.second = not self.second
        version = self.driver.state.configured().version
        self.driver.ok(ApplyConfig(expected_version=version, spec=spec(self.second)), ADMIN)

    # Gangs.

    @rule(vc_name=st.sampled_from(("a", "b", "c")), priority=st.sampled_from((-1, 0, 4, 9)),
          shape=members, model=st.sampled_from(("", "", "A100", "T4")), lazy=st.booleans(),
          on_pod_failure=st.sampled_from(tuple(FailurePolicy)))
    def submit(self, *, vc_name: str, priority: int, shape: list[tuple[int, int]], model: str,
               lazy: bool, on_pod_failure: FailurePolicy) -> None:
        self.groups += 1
        command = gang(f"g{self.groups}", vc_name, priority, *shape, model=model, lazy=lazy,
                       on_pod_failure=on_pod_failure)
        expect_fit = self.fits_now(command)
        protected = self.guarantee_applies(command)
        result = self.driver.run(command, SCHEDULER)
        if not isinstance(result, GroupStatus):
            return
        if priority < 0:
            assert (result.phase is GroupPhase.ALLOCATED) == expect_fit, (result, expect_fit)
        elif protected:
            assert result.phase is not GroupPhase.PENDING, result

    def chains_for(self, command: SubmitGroup) -> list[int]:
        topology = self.driver.state.configured().topology
        return [chain.index for chain in topology.chains
                if not command.gpu_model or chain.gpu_model == command.gpu_model]

    def pods(self, command: SubmitGroup) -> list[int]:
        return [member.gpus for member in command.members for _ in range(member.pods)]

    def fits_now(self, command: SubmitGroup) -> bool:
        """Whether plain bin packing fits the gang on the free usable GPUs of one chain."""
        state = self.driver.state
        topology = state.configured().topology
        taken = {(node, index) for node, index in self.gpus_in_use()}
        for chain in self.chains_for(command):
            free = []
            for node, name in enumerate(topology.node_ids):
                if topology.node_chain[node] != chain:
                    continue
                free.append(sum(1 for index in range(NODES[name])
                                if self.reference.usable(name, index)
                                and (name, index) not in taken))
            if packs(self.pods(command), free):
                return True
        return False

    def gpus_in_use(self) -> list[tuple[str, int]]:
        topology = self.driver.state.configured().topology
        return [(topology.node_ids[pod.node], topology.gpu_index(leaf))
                for group in self.driver.state.groups.values() for pod in group.pods
                for leaf in pod.leaves]

    def guarantee_applies(self, command: SubmitGroup) -> bool:
        state = self.driver.state
        config = state.configured()
        topology = config.topology
        if command.vc not in topology.quota or command.priority < 0:
            return False
        for group in state.groups.values():
            if group.vc == command.vc and group.guaranteed and group.phase is not (
                    GroupPhase.PENDING):
                return False
        for chain in self.chains_for(command):
            quota = topology.quota[command.vc][chain]
            if not any(quota):
                continue
            nodes = [name for node, name in enumerate(topology.node_ids)
                     if topology.node_chain[node] == chain]
            if not all(self.reference.usable(name, index) for name in nodes
                       for index in range(NODES[name])):
                continue
            shape = topology.chains[chain]
            private = []
            for level, count in enumerate(quota):
                cell = shape.size[level]
                node = shape.size[shape.node_level]
                private += [min(cell, node)] * (count * max(1, cell // node))
            if packs(self.pods(command), private):
                return True
        return False

    def pick(self, index: int, phase: GroupPhase) -> str | None:
        names = sorted(name for name, group in self.driver.state.groups.items()
                       if group.phase is phase)
        return names[index % len(names)] if names else None

    @rule(index=st.integers(0, 50), member=st.integers(0, 1))
    def bind(self, index: int, member: int) -> None:
        name = self.pick(index, GroupPhase.ALLOCATED)
        if name is not None:
            self.driver.run(BindPod(group=name, member=member, pod_uid=f"{name}-{index}"),
                            SCHEDULER)

    @rule(index=st.integers(0, 50))
    def bind_all(self, index: int) -> None:
        """Bind every free slot of an allocated gang: a gang whose pods all run, so that one
        failing has peers to kill."""
        name = self.pick(index, GroupPhase.ALLOCATED)
        if name is None or self.driver.state.groups[name].evicting:
            return  # a gang being evicted (its node drained) takes no more pods
        for position, pod in enumerate(self.driver.state.groups[name].pods):
            if pod.phase is PodPhase.UNBOUND:
                self.driver.ok(BindPod(group=name, member=pod.member,
                                       pod_uid=f"{name}-all-{position}"), SCHEDULER)

    @rule(index=st.integers(0, 50), exit_instead=st.booleans(), exit_=exits)
    def agent_reports(self, index: int, exit_instead: bool, exit_: tuple[int, str]) -> None:
        state = self.driver.state
        topology = state.configured().topology
        live = sorted((name, position) for name, group in state.groups.items()
                      for position, pod in enumerate(group.pods)
                      if pod.phase in (PodPhase.BOUND, PodPhase.RUNNING))
        if not live:
            return
        name, position = live[index % len(live)]
        group = state.groups[name]
        pod = group.pods[position]
        node = topology.node_ids[pod.node]
        incarnation = state.nodes[node].incarnation
        if exit_instead:
            self.report_exit(name, position, exit_)
            return
        self.driver.run(AckPodStarted(node=node, incarnation=incarnation, group=name,
                                      pod_uid=pod.pod_uid,
                                      gpu_uuids=pod_uuids(state, group, position)),
                        node_principal(node))

    def report_exit(self, name: str, position: int, exit_: tuple[int, str]) -> None:
        """A live pod's first exit report, checked against the reference: announced, and its
        gang evicted, released or kept as the gang's pod failure policy says."""
        state = self.driver.state
        group = state.groups[name]
        pod = group.pods[position]
        node = state.configured().topology.node_ids[pod.node]
        exit_code, reason = exit_
        assert group.on_pod_failure is not None  # every rule here submits with a policy
        expected = pod_exit_outcome(
            policy=group.on_pod_failure.value, exit_code=exit_code, reason=reason,
            pod_uid=pod.pod_uid, allocated=group.phase is GroupPhase.ALLOCATED,
            evicting=group.evicting,
            others=[(other.pod_uid, other.phase.value) for other in group.pods
                    if other is not pod])
        before = state.outbox.next_index
        result = self.driver.run(ReportPodExit(
            node=node, incarnation=state.nodes[node].incarnation, group=name,
            pod_uid=pod.pod_uid, exit_code=exit_code, reason=reason), node_principal(node))
        if isinstance(result, Rejection):  # its node is not registered
            assert not state.nodes[node].registered, result
            return
        self.matches_outcome(name, pod.pod_uid, expected,
                             state.outbox.since(before - 1, None, 1 << 20))

    def matches_outcome(self, name: str, pod_uid: str, expected: ExitOutcome,
                        effects: list[Effect]) -> None:
        mine = [effect for effect in effects if effect.group == name]
        assert [effect.pod_uid for effect in mine
                if effect.kind is EffectKind.POD_EXITED] == [pod_uid], mine
        assert sorted(effect.pod_uid for effect in mine
                      if effect.kind is EffectKind.KILL_POD) == sorted(expected.kills), mine
        released = [effect.reason for effect in mine if effect.kind is EffectKind.GANG_RELEASED]
        group = self.driver.state.groups.get(name)
        if expected.released:
            assert group is None and len(released) == 1, mine
            assert released[0] == (expected.evicting or "all pods exited"), released
        else:
            assert group is not None and not released, mine
            assert group.evicting == expected.evicting, (group.evicting, expected)

    @precondition(lambda self: bool(self.driver.state.groups))
    @rule(index=st.integers(0, 50))
    def release(self, index: int) -> None:
        names = sorted(self.driver.state.groups)
        self.driver.ok(ReleaseGroup(group=names[index % len(names)], reason="done"), SCHEDULER)

    # Checks after every step (the driver already ran the invariant checker).

    @invariant()
    def usability_matches_the_reference(self) -> None:
        config = self.driver.state.configured()
        topology = config.topology
        for node, name in enumerate(topology.node_ids):
            for index in range(NODES[name]):
                leaf = topology.leaf_of(node, index)
                assert config.cells.usable[leaf] == self.reference.usable(name, index), (
                    name, index)

    @invariant()
    def new_placements_are_on_usable_gpus(self) -> None:
        state = self.driver.state
        topology = state.configured().topology
        now = {name: tuple(group.leaves()) for name, group in state.groups.items()
               if group.leaves()}
        for name, leaves in now.items():
            if self.placed.get(name) == leaves:
                continue
            for leaf in leaves:
                node = topology.node_ids[topology.node_of[leaf]]
                assert self.reference.usable(node, topology.gpu_index(leaf)), (name, node)
        self.placed = now


AllocatorMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40)
TestAllocator = AllocatorMachine.TestCase
