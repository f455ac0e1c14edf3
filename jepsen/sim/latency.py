"""The paper's WAN latency experiment (§5, Table 1 and Fig. 12), in the simulator.

Sites CA, OR, OH (3 replicas) or CA, OR, OH, IRE, SEL (5 replicas) with the round-trip times of
Table 1, the sequencer in CA, and open-loop clients at every site proposing to their own
replica. The figure is the median time from proposal to ready (the paper's commit latency) at
each site. The paper's model predicts, for a command leader n and sequencer s,
ready = max(RTT to the nearest majority, RTT(n, s)); for the Multi-Paxos baseline a remote
site pays its round trip to the leader plus the leader's majority round trip.

Timeouts are scaled to WAN round trips (ticks are 1 ms); disks sync instantly, as in the paper
(its prototype does not persist O-instances), so only the network is measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from consensus.config import Mode
from jepsen.sim.cluster import Cluster
from jepsen.sim.options import SimOptions
from jepsen.sim.runner import build

SITES = ("CA", "OR", "OH", "IRE", "SEL")
# Round-trip times in ms between sites (paper Table 1).
RTT_MS = {
    ("CA", "OR"): 20, ("CA", "OH"): 52, ("CA", "IRE"): 139, ("CA", "SEL"): 146,
    ("OR", "OH"): 68, ("OR", "IRE"): 125, ("OR", "SEL"): 133,
    ("OH", "IRE"): 84, ("OH", "SEL"): 197, ("IRE", "SEL"): 229,
}
# The paper's measured SDPaxos averages (Fig. 12), for comparison.
PAPER_MS = {3: {"CA": 21, "OR": 21, "OH": 52},
            5: {"CA": 52, "OR": 69, "OH": 72, "IRE": 139, "SEL": 148}}
WAN_TIMEOUTS = {
    "heartbeat_ticks": 200, "lease_ticks": 1500, "lease_drift_ticks": 50,
    "election_ticks": 3000, "resend_ticks": 1000, "repair_ticks": 1500,
    "recovery_ticks": 6000, "straggler_enabled": False,
}
WARMUP_MS = 1000


@dataclass(frozen=True, slots=True)
class SiteLatency:
    site: str
    median_ms: float
    model_ms: float
    samples: int


def rtt_ms(first: str, second: str) -> int:
    if first == second:
        return 0
    return RTT_MS.get((first, second)) or RTT_MS[(second, first)]


def model_ms(sites: tuple[str, ...], site: str, protocol: Mode) -> float:
    """The paper's latency model for a command proposed at `site` (sequencer at sites[0])."""
    majority_peers = len(sites) // 2
    def nearest_majority(at: str) -> int:
        return sorted(rtt_ms(at, other) for other in sites if other != at)[majority_peers - 1]
    sequencer = sites[0]
    if protocol is Mode.MULTIPAXOS:
        return rtt_ms(site, sequencer) + nearest_majority(sequencer)
    return max(nearest_majority(site), rtt_ms(site, sequencer))


def run_latency(replicas: int, protocol: Mode, *, seconds: int = 4, interval_ms: int = 10,
                seed: int = 1) -> list[SiteLatency]:
    sites = SITES[:replicas]
    matrix = [[rtt_ms(source, target) * 500 for target in sites] for source in sites]
    options = SimOptions(seed=seed, replica_count=replicas, mode=protocol, clients=0,
                         sync_us=0, batch_commands_max=1, snapshot_every_slots=10**9)
    cluster = build(options, matrix, **WAN_TIMEOUTS)
    end_us = (WARMUP_MS + seconds * 1000) * 1000
    for replica in range(replicas):
        _open_loop(cluster, replica, interval_ms * 1000, end_us)
    cluster.run_until(WARMUP_MS * 1000)
    cluster.ready_latency_us = [[] for _ in sites]
    cluster.run_until(end_us + 2_000_000)
    return [SiteLatency(site, statistics.median(cluster.ready_latency_us[replica]) / 1000,
                        model_ms(sites, site, protocol), len(cluster.ready_latency_us[replica]))
            for replica, site in enumerate(sites)]


def _open_loop(cluster: Cluster, replica: int, interval_us: int, end_us: int) -> None:
    offset = replica * 997  # sites do not propose in lockstep

    def propose(at_cluster: Cluster) -> None:
        at_cluster.propose_at(replica, b"w" * 16)
        next_at = at_cluster.now_us + interval_us
        if next_at < end_us:
            at_cluster.call_at(next_at, propose)

    cluster.call_at(offset, propose)


def paper_ms(replicas: int, site: str) -> float | None:
    return PAPER_MS.get(replicas, {}).get(site)
