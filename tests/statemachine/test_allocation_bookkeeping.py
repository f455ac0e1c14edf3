"""Long mixed histories on two chains: the allocator's books agree with a recomputation, a
twin replica (restored from snapshots along the way) agrees byte for byte, and every tenant can
take back all its guaranteed cells once the hardware is healthy again.

Goal: find a history of gangs (every size, priority, tenant and GPU model, lazy or not), binds,
starts, exits, releases, GPU failures and recoveries, admin marks, cordons, drains, node
reboots, deregistrations and re-registrations, lease expiries and reconfigurations after which
the free lists, counters, bindings and placements no longer add up, or a replica that restored
a snapshot decides differently. test_stateful.py checks decisions against a reference,
test_lifecycle_stateful.py leaks and stuck gangs, test_restore_property.py restores on one
chain; this one puts the bookkeeping checks side by side on two chains (A100 racks and T4
nodes, tenants with cells at several levels of both). After every command:

- every invariant of the checker (the Driver runs it) and the lifecycle checks (no binding
  without a guaranteed user, no stuck preemptor or gang);
- a refused command leaves the state's bytes unchanged;
- every placed pod is on a registered node, its GPUs that node's;
- the twin (fed the same commands, replaced now and then by a restore of its own snapshot)
  returns the same result and encodes to the same snapshot bytes;
- reclaim: on a restored copy, bring every node back (registered, up, uncordoned, no mark, no
  failed GPU), then submit for each tenant, chain by chain, one gang of top priority shaped as
  its whole quota (a pod per cell, node-sized pods for cells above a node): each must be placed
  at once, allocated or preempting (HiveD's VC safety plus preemption of every lower priority).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from consensus.envelope import Principal
from statemachine.apply import apply
from statemachine.commands import (
    AckPodStarted,
    ApplyConfig,
    BindPod,
    ClearBad,
    Command,
    Cordon,
    Deregister,
    Drain,
    HealthReport,
    HealthStatus,
    Heartbeat,
    MarkBad,
    Member,
    RegisterNode,
    ReleaseGroup,
    ReportHealth,
    ReportPodExit,
    SubmitGroup,
    Tick,
    Uncordon,
)
from statemachine.context import Context
from statemachine.errors import Rejection
from statemachine.invariants import check_invariants
from statemachine.lifecycle import LIVE_PHASES, pod_uuids
from statemachine.limits import PRIORITY_MAX
from statemachine.results import GroupPhase, GroupStatus, PodPhase, Result
from statemachine.sessions import Sessions
from statemachine.snapshot_codec import decode_snapshot, encode_snapshot
from statemachine.spec import FailurePolicy
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
)
from tests.statemachine.test_lifecycle_stateful import lifecycle_violations
from tests.statemachine.test_stateful import NODES, spec

NAMES = sorted(NODES)


def state_bytes(state: State) -> bytes:
    return encode_snapshot(state, Sessions(), 0)


def copy_of(state: State) -> State:
    return decode_snapshot(state_bytes(state))[0]


def model_of(node: str) -> str:
    return "A100" if NODES[node] == 8 else "T4"


def placement_violations(state: State) -> list[str]:
    """Every placed pod lies on a registered node that owns its GPUs."""
    found = []
    topology = state.configured().topology
    for name in sorted(state.groups):
        group = state.groups[name]
        if group.phase is GroupPhase.PENDING:
            continue
        for position, pod in enumerate(group.pods):
            node = topology.node_ids[pod.node]
            record = state.nodes[node]
            if not record.registered or len(record.gpus) != topology.node_gpu_count(pod.node):
                found.append(f"gang {name} pod {position} is on {node}, which is "
                             f"{record.liveness.value} with {len(record.gpus)} GPUs")
    return found


def quota_pods(state: State, vc_name: str, chain_index: int) -> list[int]:
    """A pod per quota cell of the tenant on the chain; node-sized pods for larger cells."""
    topology = state.configured().topology
    chain = topology.chains[chain_index]
    node = chain.size[chain.node_level]
    pods: list[int] = []
    for level, count in enumerate(topology.quota[vc_name][chain_index]):
        if count:
            size = chain.size[level]
            pods += [min(size, node)] * (count * max(1, size // node))
    return sorted(pods, reverse=True)


def heal(driver: Driver) -> None:
    """Every node registered (same boards), up, uncordoned, with no mark and no failed GPU."""
    state = driver.state
    for node in NAMES:
        record = state.nodes[node]
        gpus = record.gpus if len(record.gpus) == NODES[node] else inventory(
            node, NODES[node], model_of(node))
        boot = record.boot_id or "healed"
        driver.ok(RegisterNode(node=node, boot_id=boot, gpus=gpus), node_principal(node))
        driver.ok(Uncordon(node=node), ADMIN)
        driver.ok(ClearBad(node=node, gpu=""), ADMIN)
        for gpu in state.nodes[node].gpus:
            driver.ok(ClearBad(node=node, gpu=gpu.uuid), ADMIN)


def reclaim_violations(state: State) -> list[str]:
    """On a copy: heal everything, then each tenant takes its whole quota at top priority."""
    driver = Driver(state=copy_of(state), now_ms=state.now_ms, checked=False)
    heal(driver)
    found = []
    topology = driver.state.configured().topology
    for vc_name in topology.vc_names:
        for chain in topology.chains:
            pods = quota_pods(driver.state, vc_name, chain.index)
            if not pods:
                continue
            name = f"reclaim-{vc_name}-{chain.index}"
            command = SubmitGroup(group=name, vc=vc_name, priority=PRIORITY_MAX,
                                  members=tuple(Member(pods=1, gpus=gpus) for gpus in pods),
                                  gpu_model=chain.gpu_model, lazy_preemption=False)
            result = driver.run(command, SCHEDULER)
            if not isinstance(result, GroupStatus) or result.phase is GroupPhase.PENDING:
                found.append(f"VC {vc_name} cannot take back its {chain.name} quota {pods}: "
                             f"{result}")
    check_invariants(driver.state)
    return found


class BookkeepingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.driver = Driver(state=newest_rules())
        self.twin = newest_rules()
        self.second = False
        self.boots = 0
        self.count = 0
        self.run(ApplyConfig(expected_version=0, spec=spec(False)), ADMIN)
        for node in NAMES:
            self.register(node, reboot=False)

    @property
    def state(self) -> State:
        return self.driver.state

    def run(self, command: Command, principal: Principal, *, step_ms: int = 1) -> Result:
        """Apply to both replicas; a refusal must change nothing; both must agree."""
        before = state_bytes(self.state)
        result = self.driver.run(command, principal, step_ms=step_ms)
        if isinstance(result, Rejection):
            assert state_bytes(self.state) == before, f"refused {command} changed the state"
        twin = apply(self.twin, command, Context(principal=principal, now_ms=self.driver.now_ms))
        assert twin == result, (command, twin, result)
        return result

    def register(self, node: str, reboot: bool) -> None:
        record = self.state.nodes[node]
        if reboot or not record.boot_id:
            self.boots += 1
            boot = f"boot-{self.boots}"
        else:
            boot = record.boot_id
        self.run(RegisterNode(node=node, boot_id=boot,
                              gpus=inventory(node, NODES[node], model_of(node))),
                 node_principal(node))

    # Gangs.

    @rule(vc_name=st.sampled_from("abc"), priority=st.sampled_from((-1, 0, 3, 7)),
          shape=st.lists(st.tuples(st.integers(1, 3), st.sampled_from((1, 2, 4, 8))),
                         min_size=1, max_size=2),
          model=st.sampled_from(("", "A100", "T4")), lazy=st.booleans(),
          on_pod_failure=st.sampled_from(tuple(FailurePolicy)))
    def submit(self, *, vc_name: str, priority: int, shape: list[tuple[int, int]], model: str,
               lazy: bool, on_pod_failure: FailurePolicy) -> None:
        self.count += 1
        self.run(gang(f"g{self.count:02d}", vc_name, priority, *shape, model=model, lazy=lazy,
                      on_pod_failure=on_pod_failure), SCHEDULER)

    @rule(index=st.integers(0, 40))
    def release(self, index: int) -> None:
        names = sorted(self.state.groups)
        if names:
            self.run(ReleaseGroup(group=names[index % len(names)], reason="done"), SCHEDULER)

    @rule(index=st.integers(0, 40))
    def start_gang(self, index: int) -> None:
        """Bind every free slot of an allocated gang and acknowledge its pods running."""
        names = sorted(name for name, group in self.state.groups.items()
                       if group.phase is GroupPhase.ALLOCATED and not group.evicting)
        if not names:
            return
        name = names[index % len(names)]
        for position, pod in enumerate(self.state.groups[name].pods):
            if pod.phase is PodPhase.UNBOUND:
                self.run(BindPod(group=name, member=pod.member, pod_uid=f"{name}-{position}"),
                         SCHEDULER)
        group = self.state.groups.get(name)
        if group is None:
            return
        topology = self.state.configured().topology
        for position, pod in enumerate(group.pods):
            node = topology.node_ids[pod.node]
            record = self.state.nodes[node]
            if pod.phase is PodPhase.BOUND and record.registered:
                self.run(AckPodStarted(node=node, incarnation=record.incarnation, group=name,
                                       pod_uid=pod.pod_uid,
                                       gpu_uuids=pod_uuids(self.state, group, position)),
                         node_principal(node))

    @rule(index=st.integers(0, 40), exit_code=st.sampled_from((0, 0, 1, 143)))
    def pod_exit(self, index: int, exit_code: int) -> None:
        live = [(name, position) for name, group in sorted(self.state.groups.items())
                for position, pod in enumerate(group.pods) if pod.phase in LIVE_PHASES]
        if not live:
            return
        name, position = live[index % len(live)]
        pod = self.state.groups[name].pods[position]
        node = self.state.configured().topology.node_ids[pod.node]
        self.run(ReportPodExit(node=node, incarnation=self.state.nodes[node].incarnation,
                               group=name, pod_uid=pod.pod_uid, exit_code=exit_code),
                 node_principal(node))

    # Hardware and nodes.

    @rule(node=st.sampled_from(NAMES), index=st.integers(0, 7),
          status=st.sampled_from((HealthStatus.FAIL, HealthStatus.PASS)))
    def gpu_health(self, node: str, index: int, status: HealthStatus) -> None:
        record = self.state.nodes[node]
        self.run(ReportHealth(node=node, incarnation=record.incarnation, reports=(
            HealthReport(uuid=f"GPU-{node}-{index % NODES[node]}", status=status,
                         reason=status.value),)), node_principal(node))

    @rule(node=st.sampled_from(NAMES),
          kind=st.sampled_from(("register", "reboot", "deregister", "drain", "cordon",
                                "uncordon", "mark", "mark-node", "clear", "clear-node")),
          index=st.integers(0, 7))
    def node_event(self, node: str, kind: str, index: int) -> None:
        gpu = f"GPU-{node}-{index % NODES[node]}"
        if kind in ("register", "reboot"):
            self.register(node, reboot=kind == "reboot")
        elif kind == "deregister":
            self.run(Deregister(node=node, force=True), ADMIN)
        elif kind == "drain":
            self.run(Drain(node=node), ADMIN)
        elif kind == "cordon":
            self.run(Cordon(node=node), ADMIN)
        elif kind == "uncordon":
            self.run(Uncordon(node=node), ADMIN)
        elif kind.startswith("mark"):
            self.run(MarkBad(node=node, gpu="" if kind == "mark-node" else gpu, reason="x"),
                     ADMIN)
        else:
            self.run(ClearBad(node=node, gpu="" if kind == "clear-node" else gpu), ADMIN)

    @rule(step_ms=st.sampled_from((100, 2_500, 7_000)), silent=st.sampled_from([*NAMES, ""]))
    def tick(self, step_ms: int, silent: str) -> None:
        """Every registered agent but `silent` heartbeats, then time passes."""
        for node in NAMES:
            record = self.state.nodes[node]
            if record.registered and node != silent:
                self.run(Heartbeat(node=node, incarnation=record.incarnation),
                         node_principal(node))
        self.run(Tick(), SYSTEM, step_ms=step_ms)

    @rule()
    def reconfigure(self) -> None:
        self.second = not self.second
        self.run(ApplyConfig(expected_version=self.state.configured().version,
                             spec=spec(self.second)), ADMIN)

    @rule()
    def restore_twin(self) -> None:
        self.twin = copy_of(self.twin)
        check_invariants(self.twin)

    # Checks after every step.

    @invariant()
    def books_agree(self) -> None:
        found = lifecycle_violations(self.state) + placement_violations(self.state)
        assert not found, found
        assert state_bytes(self.twin) == state_bytes(self.state)

    @invariant()
    def every_tenant_can_take_back_its_quota(self) -> None:
        found = reclaim_violations(self.state)
        assert not found, found


BookkeepingMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestBookkeeping = BookkeepingMachine.TestCase
