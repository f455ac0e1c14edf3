"""One simulator run: build the cluster from the options, then two phases.

1. Safety: clients run while the nemesis injects its faults; the monitor checks every
   execution as it happens.
2. Liveness: every fault heals (crashed replicas restart, partitions and pauses end, loss and
   duplication stop); clients keep going, then stop, and the run waits for quiet. Every
   operation invoked after the heal must complete (none may time out), every replica must
   reach the same executed prefix and state digest, and every command reported ready must have
   run.

Then the clients' history must be linearizable for the key-value model (checked per key,
within a step budget, so the verdict never depends on the machine's speed). The result carries
the violations, the history, the verdict and the trace digest (same seed and options, same
digest).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from consensus.config import ReplicaConfig
from consensus.prng import Prng
from consensus.replica import Replica
from jepsen.checker import check
from jepsen.history import History
from jepsen.models import KvModel
from jepsen.sim.cluster import UNANSWERED, Cluster
from jepsen.sim.monitor import Violation
from jepsen.sim.nemesis import Fault, NemesisEvent, disturbance, draw_schedule
from jepsen.sim.network import Disturbance, LinkFaults, Network
from jepsen.sim.options import SimOptions
from jepsen.verdict import Verdict

QUIESCE_MS = 3000
CHECK_STEPS_MAX = 2_000_000
CLOG_US_MAX = 250_000  # long enough for the others to elect a new sequencer meanwhile


@dataclass(frozen=True, slots=True)
class SimResult:
    options: SimOptions
    schedule: tuple[NemesisEvent, ...]
    violations: tuple[Violation, ...]
    trace_digest: str
    history: History
    linearizability: Verdict
    operations: int
    executed_slots: int
    views: int
    ready_latency_ms: tuple[float, ...]  # median per replica
    peer_snapshot_bytes: tuple[int, ...]  # the size of each snapshot installed from a peer
    wipes: int = 0  # disks lost (replicas that rejoined)
    wipes_refused: int = 0  # wipes left plain crashes: another replica was still rejoining

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def chunked_snapshots(self) -> int:
        """Snapshots installed from a peer that came in more than one chunk."""
        return sum(1 for size in self.peer_snapshot_bytes
                   if size > self.options.snapshot_chunk_bytes)


def replica_configs(options: SimOptions, latency_us: list[list[int]],
                    **overrides: object) -> list[ReplicaConfig]:
    configs = []
    for replica in range(options.replica_count):
        peers = sorted((other for other in range(options.replica_count) if other != replica),
                       key=lambda other: (latency_us[replica][other], other))
        configs.append(ReplicaConfig(
            replica_id=replica, replica_count=options.replica_count, mode=options.mode,
            peer_order=tuple(peers), thrifty=options.thrifty,
            batch_commands_max=options.batch_commands_max, defects=options.defects,
            **{"snapshot_chunk_bytes": options.snapshot_chunk_bytes,
               "snapshot_window_bytes": options.snapshot_window_bytes,
               **overrides},  # type: ignore[arg-type]
        ).validate())
    return configs


def latency_matrix(options: SimOptions, prng: Prng) -> list[list[int]]:
    count = options.replica_count
    matrix = [[0] * count for _ in range(count)]
    for source in range(count):
        for target in range(source + 1, count):
            one_way = prng.int_inclusive(options.latency_us_min, options.latency_us_max)
            matrix[source][target] = matrix[target][source] = one_way
    return matrix


def build(options: SimOptions, latency_us: list[list[int]] | None = None,
          **overrides: object) -> Cluster:
    prng = Prng(options.seed)
    matrix = latency_us if latency_us is not None else latency_matrix(options, prng.fork(1))
    faults = LinkFaults(options.loss_ppm, options.duplicate_ppm, options.jitter_us)
    network = Network(matrix, prng.fork(2), faults)
    configs = replica_configs(options, matrix, **overrides)
    cluster = Cluster(options, configs, network, prng.fork(3))
    for config in configs:
        cluster.start(cluster.nodes[config.replica_id],
                      Replica(config, prng.fork(10 + config.replica_id)))
    return cluster


def run(options: SimOptions, schedule: tuple[NemesisEvent, ...] | None = None) -> SimResult:
    cluster = build(options)
    if schedule is None:
        schedule = draw_schedule(options, Prng(options.seed).fork(4))
    for client in range(options.clients):
        cluster.add_client(client, client * 137)
    for event in schedule:
        cluster.call_at(event.at_ms * 1000, _inject(event))
    safety_end = options.safety_ms * 1000
    cluster.run_until(safety_end)
    heal(cluster)
    liveness_end = safety_end + options.liveness_ms * 1000
    cluster.run_until(liveness_end)
    cluster.issuing = False
    cluster.run_until(liveness_end + max(QUIESCE_MS, options.client_timeout_ms * 2) * 1000)
    cluster.monitor.check_ready_order()
    violations = [*cluster.monitor.violations, *_liveness_violations(cluster, safety_end)]
    history = cluster.history.history()
    verdict = check(KvModel(), history, max_steps=CHECK_STEPS_MAX, explain=False).verdict
    if verdict is Verdict.NOT_LINEARIZABLE:
        violations.append(Violation(cluster.now_us, "linearizability",
                                    "the clients' history has no linearization"))
    return _result(cluster, schedule, violations, history, verdict)


def _inject(event: NemesisEvent) -> Callable[[Cluster], None]:
    """The fault's start: it ends `duration_ms` later, and only it ends then (the network's
    links are recomputed from the faults still in force)."""
    def apply(cluster: Cluster) -> None:
        end_us = cluster.now_us + event.duration_ms * 1000
        node = cluster.nodes[event.target]
        if event.fault in (Fault.CRASH, Fault.WIPE):  # down until the last crash ends
            node.crashes_in_force += 1
            cluster.crash(node, torn=cluster.options.torn_writes)
            if event.fault is Fault.WIPE:
                cluster.wipe(node)
            cluster.call_at(end_us, lambda later: _end_crash(later, event.target))
            return
        if event.fault is Fault.PAUSE:
            node.paused_until = max(node.paused_until, end_us)
            return
        disturbance_id = cluster.network.disturb(_disturbance(cluster, event))
        cluster.call_at(end_us, lambda later: _restore(later, disturbance_id))
    return apply


def _restore(cluster: Cluster, disturbance_id: int) -> None:
    cluster.network.restore(disturbance_id)
    cluster.release_held()


def _disturbance(cluster: Cluster, event: NemesisEvent) -> Disturbance:
    count = cluster.options.replica_count
    sequencer = max(range(count), key=lambda replica: _view_of(cluster, replica))
    sequencer = _view_of(cluster, sequencer) % count
    clog_us = min(CLOG_US_MAX, 100 * cluster.options.latency_us_max)
    return disturbance(event.fault, event.target, count, sequencer=sequencer, clog_us=clog_us)


def _view_of(cluster: Cluster, replica: int) -> int:
    node = cluster.nodes[replica].replica
    return node.inspect.view if node is not None else -1


def _end_crash(cluster: Cluster, replica: int) -> None:
    node = cluster.nodes[replica]
    node.crashes_in_force = max(0, node.crashes_in_force - 1)  # a heal may have cleared it
    if not node.crashes_in_force:
        _restart(cluster, replica)


def _restart(cluster: Cluster, replica: int) -> None:
    node = cluster.nodes[replica]
    if node.replica is not None:
        return
    prng = Prng(cluster.options.seed).fork(1000 * node.incarnation + replica)
    if node.wiped:
        node.wiped = False
        cluster.start(node, Replica.rejoining(node.config, prng, epoch_floor=node.last_epoch))
        return
    cluster.start(node, Replica.restore(node.config, prng, node.disk.records()))


def heal(cluster: Cluster) -> None:
    cluster.network.heal()
    cluster.release_held(reconnect_us_max=0)  # the liveness phase starts with every link up
    cluster.network.faults = LinkFaults(jitter_us=cluster.network.faults.jitter_us)
    for node in cluster.nodes:
        node.paused_until = min(node.paused_until, cluster.now_us)
        node.crashes_in_force = 0
        _restart(cluster, node.id)


def _liveness_violations(cluster: Cluster, heal_us: int) -> list[Violation]:
    now, found = cluster.now_us, []
    if cluster.client_ops:
        found.append(Violation(now, "liveness", f"{len(cluster.client_ops)} operations never "
                               "completed"))
    unanswered = sum(1 for invoked, outcome in cluster.completed_after
                     if invoked >= heal_us and outcome == UNANSWERED)
    if unanswered:
        found.append(Violation(now, "liveness", f"{unanswered} operations invoked after the "
                               "heal got no answer"))
    replicas = [node.replica for node in cluster.nodes if node.replica is not None]
    executed = {replica.executed_slots for replica in replicas}
    digests = {node.sm.digest() for node in cluster.nodes}
    rejoining = [node.id for node in cluster.nodes
                 if node.replica is not None and not node.replica.rejoin_cleared]
    if rejoining:
        found.append(Violation(now, "liveness", f"replicas {rejoining} lost their disks and "
                               "never knew again all that their old lives voted on"))
    if len(replicas) != len(cluster.nodes) or len(executed) != 1 or len(digests) != 1:
        found.append(Violation(now, "convergence", f"executed slots {sorted(executed)}, "
                               f"{len(digests)} distinct digests"))
    reference = cluster.nodes[0].replica
    if reference is not None:
        for (space, index) in sorted(cluster.monitor.ready_instances()):
            if reference.inspect.exec_count(space) <= index:
                found.append(Violation(now, "liveness", f"ready C({space}, {index}) never ran"))
                break
    return found


def _result(cluster: Cluster, schedule: tuple[NemesisEvent, ...],
            violations: list[Violation], history: History, verdict: Verdict) -> SimResult:
    latencies = tuple(statistics.median(samples) / 1000 if samples else 0.0
                      for samples in cluster.ready_latency_us)
    replicas = [node.replica for node in cluster.nodes if node.replica is not None]
    return SimResult(
        options=cluster.options, schedule=schedule, violations=tuple(violations),
        trace_digest=cluster.trace_digest, history=history, linearizability=verdict,
        operations=len(cluster.completed_after),
        executed_slots=max((replica.executed_slots for replica in replicas), default=0),
        views=max((replica.inspect.view for replica in replicas), default=0),
        ready_latency_ms=latencies, peer_snapshot_bytes=tuple(cluster.peer_snapshot_bytes),
        wipes=cluster.wipes, wipes_refused=cluster.wipes_refused,
    )


def with_options(options: SimOptions, **changes: object) -> SimOptions:
    return dataclasses.replace(options, **changes)  # type: ignore[arg-type]
