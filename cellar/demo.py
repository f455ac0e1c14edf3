"""`cellar demo`: the GPU-allocation state machine at work on a 1,024-node, 8,192-GPU cluster.

One replica's state machine, driven through `Machine` (the bytes interface consensus uses) by a
simulated control plane: schedulers submit gangs of 1 to 64 GPUs for five tenants at mixed
priorities, bind their pods once placed; simulated node agents acknowledge starts, run each pod
for a while, obey kill effects from the outbox, heartbeat, and now and then report a failing
GPU; an admin drains a node; one node goes silent. Every logical second is one round: the log
shows what the state machine decided (placed, preempting, downgraded, released, hardware
trouble), then a one-line status. It ends after `--rounds` rounds (or `--seconds` of wall
time), checks every invariant, and prints a summary.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from cellar.bench.statemachine import TENANTS, Driver, bring_up
from consensus.envelope import Principal, Role
from consensus.prng import Prng
from consensus.runtime.arguments import at_least, seconds
from statemachine import Machine, State, check_invariants
from statemachine.commands import (
    AckPodStarted,
    BindPod,
    Command,
    Drain,
    HealthReport,
    HealthStatus,
    Heartbeat,
    Member,
    ReportHealth,
    ReportPodExit,
    SubmitGroup,
    Uncordon,
)
from statemachine.effects import Effect, EffectKind
from statemachine.queries import stats
from statemachine.results import GroupPhase, PodPhase
from statemachine.rules import system_tick

ADMIN = Principal(Role.ADMIN, "demo")
SCHEDULER = Principal(Role.SCHEDULER, "demo")
SYSTEM = Principal(Role.SYSTEM, "cellar")
ROUND_MS = 1_000
SHOWN_PER_ROUND = 6
# GPUs per pod, pods, weight
SHAPES = ((1, 1, 30), (2, 1, 12), (4, 1, 12), (8, 1, 20), (8, 2, 12), (8, 4, 8), (8, 8, 6))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=at_least(1), default=90,
                        help="logical seconds to simulate (default 90)")
    parser.add_argument("--seconds", type=seconds(), default=100.0,
                        help="stop earlier after this much wall time (default 100)")
    parser.add_argument("--seed", type=at_least(0), default=7, help="workload seed (default 7)")
    parser.add_argument("--pace", type=seconds(zero_ok=True), default=0.25,
                        help="least wall seconds per round, to keep the log readable")
    parser.set_defaults(handler=run)


@dataclass
class Agents:
    """What the simulated node agents know: pods they run and when those finish."""

    finishing: dict[tuple[str, str], int] = field(default_factory=dict)  # (group, pod) -> ms
    killed: list[tuple[str, str, str]] = field(default_factory=list)  # (node, group, pod)
    silent: set[str] = field(default_factory=set)  # nodes that stopped heartbeating
    failed_gpus: dict[str, int] = field(default_factory=dict)  # uuid -> passes to send


class Demo:
    def __init__(self, seed: int) -> None:
        self.prng = Prng(seed)
        self.driver = Driver(Machine(), session="demo")
        self.agents = Agents()
        self.seen = 1  # next outbox index to read
        self.counts: Counter[str] = Counter()
        self.next_gang = 0
        self.round = 0
        self.notes: list[str] = []  # what the simulation did this round, shown first
        self.busy_s = 0.0  # wall time spent simulating, not pacing

    @property
    def state(self) -> State:
        return self.driver.machine.state

    def send(self, command: Command, principal: Principal) -> None:
        self.driver.send(command, principal, step_ms=0)
        self.counts["commands"] += 1

    def node_principal(self, node: str) -> Principal:
        return Principal(Role.NODE, node)

    # One round: a logical second of a busy cluster.

    def play_round(self) -> list[str]:
        self.round += 1
        self.notes = []
        self.driver.now_ms += ROUND_MS
        self.heartbeats()
        self.incidents()
        low, high = (30, 50) if self.round <= 15 else (8, 24)
        for _ in range(self.prng.int_inclusive(low, high)):
            self.submit()
        self.bind_placed()
        self.agents_act()
        self.send(system_tick(), SYSTEM)
        return self.notes + self.read_outbox()

    def heartbeats(self) -> None:
        if self.round % 5:
            return
        for name in sorted(self.state.nodes):
            if name not in self.agents.silent:
                record = self.state.nodes[name]
                self.send(Heartbeat(node=name, incarnation=record.incarnation),
                          self.node_principal(name))

    def incidents(self) -> None:
        """Scripted trouble, at fixed rounds, on nodes the seed picks."""
        nodes = sorted(self.state.nodes)
        if self.round % 9 == 4:
            node = self.prng.choice(nodes)
            uuid = f"GPU-{node}-{self.prng.below(8)}"
            self.agents.failed_gpus[uuid] = 3 + self.prng.below(10)
            self.report(node, uuid, HealthStatus.FAIL, "xid 79: fallen off the bus")
            self.notes.append(f"  ! agent on {node} reports {uuid} failed (xid 79)")
        for uuid in sorted(self.agents.failed_gpus):
            self.agents.failed_gpus[uuid] -= 1
            if self.agents.failed_gpus[uuid] <= 0:
                del self.agents.failed_gpus[uuid]
            elif self.agents.failed_gpus[uuid] <= 3:
                node = uuid.removeprefix("GPU-").rsplit("-", 1)[0]
                self.report(node, uuid, HealthStatus.PASS, "reset, healthy")
                if self.agents.failed_gpus[uuid] == 1:
                    self.notes.append(f"  ! {uuid} passes its checks again")
        if self.round == 20:
            node = self.busy_node()
            self.agents.silent.add(node)
            self.notes.append(f"  ! node {node} stops heartbeating (its lease will run out)")
        if self.round == 30:
            node = self.busy_node()
            self.send(Drain(node=node), ADMIN)
            self.notes.append(f"  ! admin drains node {node}")
        if self.round == 60:
            for name in nodes:
                if self.state.nodes[name].draining:
                    self.send(Uncordon(node=name), ADMIN)
                    self.notes.append(f"  ! admin uncordons node {name}")

    def busy_node(self) -> str:
        """A node that holds some gang's GPUs (the first such, by the seed's choice of gang)."""
        placed = sorted(name for name, group in self.state.groups.items()
                        if group.phase is GroupPhase.ALLOCATED)
        if not placed:
            return sorted(self.state.nodes)[0]
        group = self.state.groups[self.prng.choice(placed)]
        return self.state.configured().topology.node_ids[group.pods[0].node]

    def report(self, node: str, uuid: str, status: HealthStatus, reason: str) -> None:
        record = self.state.nodes[node]
        self.send(ReportHealth(node=node, incarnation=record.incarnation, reports=(
            HealthReport(uuid=uuid, status=status, reason=reason),)), self.node_principal(node))

    def submit(self) -> None:
        self.next_gang += 1
        pick = self.prng.below(sum(weight for _, _, weight in SHAPES))
        gpus, pods = SHAPES[-1][:2]
        for shape_gpus, shape_pods, weight in SHAPES:
            if pick < weight:
                gpus, pods = shape_gpus, shape_pods
                break
            pick -= weight
        tenant = self.prng.choice(TENANTS)
        priority = -1 if tenant == "batch" or self.prng.chance_ppm(200_000) else (
            self.prng.below(10))
        self.send(SubmitGroup(group=f"job-{self.next_gang:04d}", vc=tenant, priority=priority,
                              members=(Member(pods=pods, gpus=gpus),),
                              gpu_model=self.prng.choice(("", "", "A100", "H100")),
                              lazy_preemption=self.prng.chance_ppm(400_000)), SCHEDULER)
        self.counts["submitted"] += 1

    def bind_placed(self) -> None:
        """The scheduler binds a pod to every slot of each newly allocated gang."""
        for name in sorted(self.state.groups):
            group = self.state.groups.get(name)
            if group is None or group.phase is not GroupPhase.ALLOCATED or group.evicting:
                continue
            for pod in group.pods:
                if pod.phase is PodPhase.UNBOUND:
                    self.send(BindPod(group=name, member=pod.member,
                                      pod_uid=f"{name}-{pod.index}"), SCHEDULER)

    def agents_act(self) -> None:
        """Agents acknowledge started pods, report killed ones gone, and finished ones exited."""
        state = self.state
        topology = state.configured().topology
        done = [key for key, finish_ms in self.agents.finishing.items()
                if finish_ms <= self.driver.now_ms]
        exits = sorted({*self.agents.killed, *(("", group, pod) for group, pod in done)})
        self.agents.killed.clear()
        for _, name, pod_uid in exits:
            self.agents.finishing.pop((name, pod_uid), None)
            group = state.groups.get(name)
            pod = next((pod for pod in group.pods if pod.pod_uid == pod_uid), None) if (
                group is not None) else None
            if group is None or pod is None or pod.phase is PodPhase.EXITED:
                continue
            node = topology.node_ids[pod.node]
            if node in self.agents.silent:
                continue
            self.send(ReportPodExit(node=node, incarnation=state.nodes[node].incarnation,
                                    group=name, pod_uid=pod_uid, exit_code=0),
                      self.node_principal(node))

    def read_outbox(self) -> list[str]:
        effects = self.state.outbox.since(self.seen - 1, None, 1 << 30)
        self.seen = self.state.outbox.next_index
        lines: list[tuple[int, str]] = []
        for effect in effects:
            self.counts[effect.kind.value] += 1
            if effect.kind is EffectKind.START_POD:
                self.start_pod(effect)
            elif effect.kind is EffectKind.KILL_POD:
                self.agents.killed.append((effect.node, effect.group, effect.pod_uid))
            elif effect.kind is not EffectKind.POD_EXITED:  # one a pod: counted, not shown
                lines.append(self.describe(effect))
        lines.sort(key=lambda line: line[0])
        shown = [text for _, text in lines[:SHOWN_PER_ROUND]]
        hidden = Counter(text.split()[0] for _, text in lines[SHOWN_PER_ROUND:])
        if hidden:
            shown.append("  ... and " + ", ".join(f"{count} more {kind}"
                                                  for kind, count in sorted(hidden.items())))
        return shown

    def start_pod(self, effect: Effect) -> None:
        if effect.node in self.agents.silent:
            return
        record = self.state.nodes[effect.node]
        self.send(AckPodStarted(node=effect.node, incarnation=record.incarnation,
                                group=effect.group, pod_uid=effect.pod_uid,
                                gpu_uuids=effect.gpu_uuids), self.node_principal(effect.node))
        runtime_ms = 10_000 + self.prng.below(50) * 1_000
        self.agents.finishing[(effect.group, effect.pod_uid)] = self.driver.now_ms + runtime_ms

    def describe(self, effect: Effect) -> tuple[int, str]:
        """A log line for a gang event, ranked: rare events first."""
        group = self.state.groups.get(effect.group)
        who = effect.group
        reason = effect.reason
        if group is not None:
            who = f"{effect.group} {group.vc:<8} p{group.priority:<2} {group.gpus:>2} GPUs"
            if effect.kind is EffectKind.GANG_ALLOCATED:
                topology = self.state.configured().topology
                nodes = sorted({topology.node_ids[pod.node] for pod in group.pods})
                where = ", ".join(nodes) if len(nodes) <= 2 else f"{nodes[0]} .. {nodes[-1]}"
                reason = f"{reason} ({where})"
        rank, verb = {
            EffectKind.GANG_PREEMPTING: (0, "preempting"), EffectKind.GANG_DOWNGRADED: (0,
                                                                                      "downgraded"),
            EffectKind.GANG_FAILURE: (0, "hardware"), EffectKind.GANG_REQUEUED: (1, "requeued"),
            EffectKind.GANG_ALLOCATED: (2, "placed"), EffectKind.GANG_RELEASED: (3, "released"),
        }[effect.kind]
        return rank, f"  {verb:<10} {who}: {reason}"

    def status(self) -> str:
        figures = stats(self.state)
        phases = figures["groups"]
        running = phases["allocated"]
        return (f"[t={self.round:>3}s] {figures['held_gpus']:>5}/{figures['gpus']} GPUs held "
                f"({figures['held_gpus'] * 100 // figures['gpus']:>2}%), {running} gangs "
                f"placed, {phases['pending']} pending, {phases['preempting']} preempting, "
                f"{figures['evicting']} leaving")


def summary(demo: Demo, wall_s: float) -> list[str]:
    state = demo.state
    figures = stats(state)
    counts = demo.counts
    config = state.configured()
    lines = [
        f"Summary after {demo.round} logical seconds ({wall_s:.1f} s wall, "
        f"{counts['commands']:,} commands in {demo.busy_s:.1f} s of work, "
        f"{counts['commands'] / max(demo.busy_s, 1e-9):,.0f} per second, simulation included):",
        f"  gangs: {counts['submitted']} submitted, {counts['gang_allocated']} placed, "
        f"{counts['gang_preempting']} preemptions, {counts['kill_pod']} pods killed, "
        f"{counts['gang_downgraded']} downgraded lazily, {counts['gang_requeued']} requeued, "
        f"{counts['gang_released']} released, {counts['gang_failure']} hit failed hardware",
        f"  now: {figures['held_gpus']:,} of {figures['gpus']:,} GPUs held, "
        f"{figures['groups']['pending']} gangs pending, {figures['groups']['preempting']} "
        f"preempting",
    ]
    for vc in config.topology.vc_names:
        quota = sum(count * chain.size[level] for chain in config.topology.chains
                    for level, count in enumerate(config.topology.quota[vc][chain.index]))
        used = sum(group.gpus for group in state.groups.values() if group.vc == vc
                   and group.guaranteed and group.phase is GroupPhase.ALLOCATED)
        lines.append(f"  tenant {vc:<8} guaranteed GPUs in use {used:>5} of {quota:>5}")
    snapshot = demo.driver.machine.snapshot()
    copy = Machine()
    copy.restore(snapshot)
    same = copy.digest() == demo.driver.machine.digest()
    lines.append(f"  snapshot: {len(snapshot) / 1e6:.2f} MB, digest "
                 f"{demo.driver.machine.digest().hex()[:16]}; a restored copy "
                 f"{'has the same digest' if same else 'DIFFERS'}")
    check_invariants(state)
    lines.append("  invariants: all hold")
    return lines


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    demo = Demo(args.seed)
    bring_up(demo.driver)
    demo.seen = demo.state.outbox.next_index
    figures = stats(demo.state)
    print(f"cellar demo: {figures['nodes']:,} nodes, {figures['gpus']:,} GPUs, "
          f"{len(TENANTS)} tenants configured and registered in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    while demo.round < args.rounds and time.perf_counter() - started < args.seconds:
        round_started = time.perf_counter()
        lines = demo.play_round()
        demo.busy_s += time.perf_counter() - round_started
        print(demo.status())
        for line in lines:
            print(line)
        sys.stdout.flush()
        time.sleep(max(0.0, args.pace - (time.perf_counter() - round_started)))
    print()
    for line in summary(demo, time.perf_counter() - started):
        print(line)
    return 0
