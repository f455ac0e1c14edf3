"""`cellar bench statemachine`: apply rate, allocation latency and snapshot cost at 8,192 GPUs.

The cluster: 1,024 nodes of 8 GPUs on two chains with different node shapes (96 racks of
eight A100 nodes, each node 2 sockets x 2 PCIe switches x 2 GPUs; 64 racks of four H100 nodes,
each node 4 switches x 2 GPUs) and five tenants with guaranteed racks, nodes and sockets.

Every figure goes through `Machine`, the bytes interface consensus drives, so decoding, session
handling and reply encoding are included:

- apply rate: a seeded, closed-loop workload (gangs submitted, pods bound, acknowledged and
  exiting, heartbeats, ticks) is generated once on one machine, then replayed on fresh ones
  (as a follower would) and timed;
- allocation latency: on the cluster left by that workload, one SubmitGroup at a time for
  gangs of 1, 8 and 64 GPUs, each released again untimed;
- snapshot: size, encode time and restore time of that state, checked by digest.

Figures are medians over several runs with min and max; `--json` prints one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from cellar.bench.stats import Spread, percentile
from consensus.codec import encode_envelope
from consensus.envelope import Envelope, Principal, Role
from consensus.prng import Prng
from consensus.runtime.arguments import at_least
from statemachine import Machine
from statemachine.codec import encode_command
from statemachine.commands import (
    AckPodStarted,
    ApplyConfig,
    BindPod,
    Command,
    GpuInventory,
    Heartbeat,
    Member,
    RegisterNode,
    ReleaseGroup,
    ReportPodExit,
    SubmitGroup,
)
from statemachine.errors import Rejection
from statemachine.lifecycle import pod_uuids
from statemachine.result_codec import decode_result
from statemachine.results import GroupPhase, GroupStatus, PodPhase
from statemachine.rules import system_tick
from statemachine.spec import (
    CellTypeSpec,
    ClusterSpec,
    GpuModelSpec,
    PhysicalCellSpec,
    PolicySpec,
    QuotaSpec,
    VirtualClusterSpec,
)

ADMIN = Principal(Role.ADMIN, "bench")
SCHEDULER = Principal(Role.SCHEDULER, "bench")
SYSTEM = Principal(Role.SYSTEM, "cellar")
GANG_SIZES = (1, 8, 64)
PROBE_SESSIONS = itertools.count(1)  # a fresh client session for each probe run
# (GPUs per pod, pods) for the mixed workload, with weights.
SHAPES = ((1, 1, 30), (2, 1, 15), (4, 1, 15), (8, 1, 20), (8, 2, 10), (8, 4, 6), (8, 8, 4))


def large_cluster_spec() -> ClusterSpec:
    a100 = (CellTypeSpec(name="A100-SW", child="A100", child_count=2),
            CellTypeSpec(name="A100-SOCK", child="A100-SW", child_count=2),
            CellTypeSpec(name="A100-NODE", child="A100-SOCK", child_count=2, node_level=True),
            CellTypeSpec(name="A100-RACK", child="A100-NODE", child_count=8))
    h100 = (CellTypeSpec(name="H100-SW", child="H100", child_count=2),
            CellTypeSpec(name="H100-NODE", child="H100-SW", child_count=4, node_level=True),
            CellTypeSpec(name="H100-RACK", child="H100-NODE", child_count=4))
    cells = [PhysicalCellSpec(cell_type="A100-RACK",
                              nodes=tuple(f"a{rack:02d}-{node}" for node in range(8)))
             for rack in range(96)]
    cells += [PhysicalCellSpec(cell_type="H100-RACK",
                               nodes=tuple(f"h{rack:02d}-{node}" for node in range(4)))
              for rack in range(64)]

    def tenant(name: str, *quota: tuple[str, str, int]) -> VirtualClusterSpec:
        return VirtualClusterSpec(name=name, quota=tuple(
            QuotaSpec(chain=chain, cell_type=cell_type, count=count)
            for chain, cell_type, count in quota))

    tenants = (
        tenant("research", ("A100-RACK", "A100-RACK", 16), ("A100-RACK", "A100-NODE", 32),
               ("H100-RACK", "H100-RACK", 8)),
        tenant("prod", ("A100-RACK", "A100-RACK", 24), ("H100-RACK", "H100-RACK", 16),
               ("H100-RACK", "H100-NODE", 8)),
        tenant("vision", ("A100-RACK", "A100-RACK", 8), ("A100-RACK", "A100-SOCK", 64)),
        tenant("nlp", ("A100-RACK", "A100-NODE", 128), ("H100-RACK", "H100-NODE", 32)),
        tenant("batch"),
    )
    return ClusterSpec(
        gpu_models=(GpuModelSpec(name="A100", memory_mib=81920),
                    GpuModelSpec(name="H100", memory_mib=81559)),
        cell_types=a100 + h100, physical_cells=tuple(cells), virtual_clusters=tenants,
        policy=PolicySpec(lease_ms=15_000, down_after_ms=30_000, schedule_attempts_max=8))


TENANTS = ("research", "prod", "vision", "nlp", "batch")


def node_inventory(node: str, model: str) -> tuple[GpuInventory, ...]:
    return tuple(GpuInventory(uuid=f"GPU-{node}-{index}", index=index,
                              pci_bus_id=f"0000:{0x18 + index:02x}:00.0", model=model,
                              memory_mib=81920) for index in range(8))


class Driver:
    """Sends commands to a machine as envelopes, keeping the log it sent."""

    def __init__(self, machine: Machine, session: str = "bench") -> None:
        self.machine = machine
        self.session = session
        self.now_ms = 1_000
        self.sequence = 0
        self.log: list[bytes] = []

    def send(self, command: Command, principal: Principal, step_ms: int = 1) -> bytes:
        self.now_ms += step_ms
        self.sequence += 1
        sequence = 0 if principal.role is Role.SYSTEM else self.sequence
        entry = encode_envelope(Envelope(principal=principal, session=self.session,
                                         sequence=sequence, now_ms=self.now_ms,
                                         body=encode_command(command)))
        self.log.append(entry)
        return self.machine.apply(entry)


def bring_up(driver: Driver) -> None:
    """Configure the cluster and register every node."""
    spec = large_cluster_spec()
    driver.send(ApplyConfig(expected_version=0, spec=spec), ADMIN)
    for cell in spec.physical_cells:
        model = "A100" if cell.cell_type.startswith("A100") else "H100"
        for node in cell.nodes:
            driver.send(RegisterNode(node=node, boot_id="boot-1",
                                     gpus=node_inventory(node, model)), Principal(Role.NODE, node))


class MixedWorkload:
    """A closed-loop stream of what a busy cluster sees: gangs submitted, their pods bound and
    acknowledged, pods exiting (which releases the gang), the odd cancellation, heartbeats
    round-robin, and ticks. It aims at roughly 80% of the GPUs held."""

    def __init__(self, driver: Driver, seed: int) -> None:
        self.driver = driver
        self.prng = Prng(seed)
        self.next_gang = 0
        self.next_heartbeat = 0
        self.nodes = sorted(driver.machine.state.nodes)

    def utilization_percent(self) -> int:
        config = self.driver.machine.state.configured()
        free = sum(config.cells.free[cell] for chain in config.topology.chains
                   for cell in chain.cells_at(chain.top_level))
        return 100 - free * 100 // 8192

    def step(self) -> None:
        busy = self.utilization_percent() >= 80
        actions: list[tuple[int, Callable[[], None]]] = [
            (10 if busy else 40, self.submit), (30, self.start), (40 if busy else 10, self.finish),
            (3, self.cancel), (25, self.heartbeat), (2, self.tick)]
        pick = self.prng.below(sum(weight for weight, _ in actions))
        for weight, action in actions:
            if pick < weight:
                action()
                return
            pick -= weight

    def submit(self) -> None:
        self.next_gang += 1
        total = sum(weight for _, _, weight in SHAPES)
        pick = self.prng.below(total)
        gpus, pods = SHAPES[-1][:2]
        for shape_gpus, shape_pods, weight in SHAPES:
            if pick < weight:
                gpus, pods = shape_gpus, shape_pods
                break
            pick -= weight
        tenant = self.prng.choice(TENANTS)
        priority = -1 if tenant == "batch" or self.prng.chance_ppm(150_000) else (
            self.prng.below(10))
        self.driver.send(SubmitGroup(
            group=f"job-{self.next_gang}", vc=tenant, priority=priority,
            members=(Member(pods=pods, gpus=gpus),), gpu_model=self.prng.choice(
                ("", "A100", "H100")), lazy_preemption=self.prng.chance_ppm(300_000)),
            SCHEDULER)

    def _pick(self, wanted: Callable[[Any], bool]) -> Any:
        groups = self.driver.machine.state.groups
        names = [name for name in sorted(groups) if wanted(groups[name])]
        return groups[self.prng.choice(names[:64])] if names else None

    def start(self) -> None:
        group = self._pick(lambda group: group.phase is GroupPhase.ALLOCATED
                           and not group.evicting and group.pods[0].phase is PodPhase.UNBOUND)
        if group is None:
            return
        state = self.driver.machine.state
        for position, pod in enumerate(group.pods):
            uid = f"{group.group}-{position}"
            self.driver.send(BindPod(group=group.group, member=pod.member, pod_uid=uid),
                             SCHEDULER)
            node = state.configured().topology.node_ids[pod.node]
            self.driver.send(AckPodStarted(node=node, incarnation=1, group=group.group,
                                           pod_uid=uid, gpu_uuids=pod_uuids(state, group,
                                                                            position)),
                             Principal(Role.NODE, node))

    def finish(self) -> None:
        group = self._pick(lambda group: any(pod.phase is PodPhase.RUNNING
                                             for pod in group.pods))
        if group is None:
            return
        topology = self.driver.machine.state.configured().topology
        for pod in group.pods:
            if pod.phase in (PodPhase.RUNNING, PodPhase.BOUND):
                node = topology.node_ids[pod.node]
                self.driver.send(ReportPodExit(node=node, incarnation=1, group=group.group,
                                               pod_uid=pod.pod_uid, exit_code=0),
                                 Principal(Role.NODE, node))

    def cancel(self) -> None:
        group = self._pick(lambda group: group.phase is not GroupPhase.ALLOCATED)
        if group is not None:
            self.driver.send(ReleaseGroup(group=group.group, reason="cancelled"), SCHEDULER)

    def heartbeat(self) -> None:
        node = self.nodes[self.next_heartbeat % len(self.nodes)]
        self.next_heartbeat += 1
        self.driver.send(Heartbeat(node=node, incarnation=1), Principal(Role.NODE, node))

    def tick(self) -> None:
        self.driver.send(system_tick(), SYSTEM, step_ms=50)


def build_workload(seed: int, commands: int) -> tuple[list[bytes], list[bytes], Machine]:
    """The bring-up log, the workload log and the machine that generated them."""
    driver = Driver(Machine())
    bring_up(driver)
    setup = list(driver.log)
    workload = MixedWorkload(driver, seed)
    while len(driver.log) - len(setup) < commands:
        workload.step()  # one step may send several: the log is cut at `commands`
    return setup, driver.log[len(setup):len(setup) + commands], driver.machine


def measure_apply(setup: list[bytes], log: list[bytes], runs: int) -> Spread:
    rates = []
    for _ in range(runs):
        machine = Machine()
        for entry in setup:
            machine.apply(entry)
        started = time.perf_counter()
        for entry in log:
            machine.apply(entry)
        rates.append(len(log) / (time.perf_counter() - started))
    return Spread.of(rates)


def measure_allocation(machine: Machine, size: int, samples: int, *, opportunistic: bool,
                       outcomes: Counter[str]) -> list[float]:
    """Milliseconds per SubmitGroup envelope for gangs of `size` GPUs, each released after;
    `outcomes` counts the replies (allocated, preempting, pending, or a rejection code)."""
    driver = Driver(machine, session=f"probe-{next(PROBE_SESSIONS)}")
    driver.now_ms = machine.state.now_ms
    pods, gpus = (size // 8, 8) if size >= 8 else (1, size)
    latencies = []
    for index in range(samples):
        tenant = "batch" if opportunistic else ("research", "prod", "nlp")[index % 3]
        name = f"probe-{driver.session}-{index}"
        command = SubmitGroup(group=name, vc=tenant, priority=-1 if opportunistic else 5,
                              members=(Member(pods=pods, gpus=gpus),), gpu_model="",
                              lazy_preemption=False)
        started = time.perf_counter()
        reply = driver.send(command, SCHEDULER)
        latencies.append((time.perf_counter() - started) * 1000)
        result = decode_result(reply)
        outcomes[result.phase.value if isinstance(result, GroupStatus) else
                 result.code.value if isinstance(result, Rejection) else "other"] += 1
        driver.send(ReleaseGroup(group=name, reason="probe"), SCHEDULER)
    return sorted(latencies)


def measure_snapshot(machine: Machine, runs: int) -> dict[str, Any]:
    encode, restore, size = [], [], 0
    digest = machine.digest()
    for _ in range(runs):
        started = time.perf_counter()
        snapshot = machine.snapshot()
        encode.append((time.perf_counter() - started) * 1000)
        copy = Machine()
        started = time.perf_counter()
        copy.restore(snapshot)
        restore.append((time.perf_counter() - started) * 1000)
        assert copy.digest() == digest, "a restored state must have the same digest"
        size = len(snapshot)
    roundtrip = [first + second for first, second in zip(encode, restore, strict=True)]
    return {"bytes": size, "encode_ms": Spread.of(encode), "restore_ms": Spread.of(restore),
            "roundtrip_ms": Spread.of(roundtrip)}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=at_least(1), default=3,
                        help="runs per figure (default 3)")
    parser.add_argument("--commands", type=at_least(1), default=20_000,
                        help="commands in the mixed workload (default 20,000)")
    parser.add_argument("--samples", type=at_least(1), default=200,
                        help="allocations timed per gang size and run (default 200)")
    parser.add_argument("--seed", type=at_least(0), default=1, help="workload seed (default 1)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    setup, log, machine = build_workload(args.seed, args.commands)
    generated_s = time.perf_counter() - started
    apply_rate = measure_apply(setup, log, args.runs)
    latency: dict[str, dict[int, Spread]] = {"p50": {}, "p99": {}, "opportunistic_p50": {}}
    outcomes: dict[str, Counter[str]] = {}
    for size in GANG_SIZES:
        for kind in ("guaranteed", "opportunistic"):
            outcomes[f"{kind}_{size}"] = Counter()
        guaranteed = [measure_allocation(machine, size, args.samples, opportunistic=False,
                                         outcomes=outcomes[f"guaranteed_{size}"])
                      for _ in range(args.runs)]
        opportunistic = [measure_allocation(machine, size, args.samples, opportunistic=True,
                                            outcomes=outcomes[f"opportunistic_{size}"])
                         for _ in range(args.runs)]
        latency["p50"][size] = Spread.of([percentile(run, 0.5) for run in guaranteed])
        latency["p99"][size] = Spread.of([percentile(run, 0.99) for run in guaranteed])
        latency["opportunistic_p50"][size] = Spread.of([percentile(run, 0.5)
                                                        for run in opportunistic])
    snapshot = measure_snapshot(machine, args.runs)
    stats = _stats(machine)
    figures = {
        "gpus": stats["gpus"], "nodes": stats["nodes"], "tenants": len(TENANTS),
        "workload_commands": len(log), "seed": args.seed, "runs": args.runs,
        "gpus_held_at_end": stats["held_gpus"], "gangs_at_end": stats["gangs"],
        "apply_per_s": round(apply_rate.median), "apply_per_s_spread": apply_rate.as_dict(),
        "alloc_p50_ms": {str(size): round(spread.median, 3)
                         for size, spread in latency["p50"].items()},
        "alloc_p99_ms": {str(size): round(spread.median, 3)
                         for size, spread in latency["p99"].items()},
        "alloc_opportunistic_p50_ms": {str(size): round(spread.median, 3)
                                       for size, spread in latency["opportunistic_p50"].items()},
        "snapshot_bytes": snapshot["bytes"],
        "snapshot_encode_ms": round(snapshot["encode_ms"].median, 1),
        "snapshot_restore_ms": round(snapshot["restore_ms"].median, 1),
        "snapshot_roundtrip_ms": round(snapshot["roundtrip_ms"].median, 1),
        "workload_generation_s": round(generated_s, 1),
        "alloc_outcomes": {key: dict(sorted(counts.items()))
                           for key, counts in outcomes.items()},
    }
    if args.json:
        print(json.dumps(figures, sort_keys=True))
    else:
        _print_table(figures, apply_rate, latency, snapshot)
    return 0


def _stats(machine: Machine) -> dict[str, int]:
    state = machine.state
    config = state.configured()
    gpus = sum(chain.size[chain.top_level] * chain.level_count[chain.top_level]
               for chain in config.topology.chains)
    return {"gpus": gpus, "nodes": len(state.nodes), "gangs": len(state.groups),
            "held_gpus": sum(1 for holder in config.cells.holder if holder)}


def _print_table(figures: dict[str, Any], apply_rate: Spread,
                 latency: dict[str, dict[int, Spread]], snapshot: dict[str, Any]) -> None:
    print(f"cellar bench statemachine: {figures['nodes']} nodes, {figures['gpus']} GPUs, "
          f"{figures['tenants']} tenants; medians of {figures['runs']} runs (min, max)")
    print(f"  mixed workload: {figures['workload_commands']} commands (seed {figures['seed']});"
          f" at the end {figures['gangs_at_end']} gangs hold {figures['gpus_held_at_end']} "
          f"GPUs")
    print(f"  apply rate             {apply_rate.describe('commands/s', digits=0)}")
    for size in GANG_SIZES:
        print(f"  allocate {size:>2}-GPU gang   p50 {latency['p50'][size].describe('ms', 3)};"
              f" p99 {latency['p99'][size].median:.3f} ms; opportunistic p50 "
              f"{latency['opportunistic_p50'][size].median:.3f} ms")
        for kind in ("guaranteed", "opportunistic"):
            counts = figures["alloc_outcomes"][f"{kind}_{size}"]
            print(f"      {kind} replies: " + ", ".join(f"{name} {count}"
                                                      for name, count in counts.items()))
    print(f"  snapshot               {snapshot['bytes'] / 1e6:.2f} MB")
    print(f"  snapshot encode        {snapshot['encode_ms'].describe('ms', 1)}")
    print(f"  snapshot restore       {snapshot['restore_ms'].describe('ms', 1)}")
    print(f"  snapshot round trip    {snapshot['roundtrip_ms'].describe('ms', 1)}")
