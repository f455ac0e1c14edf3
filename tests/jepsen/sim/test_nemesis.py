"""The nemesis's faults as the simulated network and replicas feel them: each network fault ends
only itself, however faults overlap, and overlapping crashes hold a replica down until the last
ends; every partition shape cuts something at every group size;
a paused replica does nothing until its pause ends; a schedule that does not fit the cluster is
named."""

from __future__ import annotations

import pytest

from consensus.messages import Message
from consensus.ready import Ready
from jepsen.sim import runner
from jepsen.sim.cluster import Cluster, SimNode
from jepsen.sim.nemesis import Fault, NemesisEvent, partition_groups, schedule_problems
from jepsen.sim.options import SimOptions

Link = tuple[int, int]


def blocked_links(cluster: Cluster) -> set[Link]:
    count = cluster.options.replica_count
    return {(source, target) for source in range(count) for target in range(count)
            if cluster.network.is_blocked(source, target)}


def cluster_with(*events: NemesisEvent, replicas: int = 3) -> Cluster:
    cluster = runner.build(SimOptions(seed=1, replica_count=replicas, safety_ms=1000,
                                      liveness_ms=0))
    for event in events:
        cluster.call_at(event.at_ms * 1000, runner._inject(event))
    return cluster


def links_at(cluster: Cluster, at_ms: int) -> set[Link]:
    cluster.run_until(at_ms * 1000)
    return blocked_links(cluster)


ISOLATED_0 = {(0, 1), (0, 2), (1, 0), (2, 0)}


def test_a_clog_ending_leaves_an_isolation_in_force() -> None:
    # Replica 0 isolated from 100 to 600 ms; replica 1 clogged from 150 to 160 ms.
    cluster = cluster_with(NemesisEvent(100, Fault.ISOLATE, 0, 500),
                           NemesisEvent(150, Fault.CLOG, 1, 10))
    assert links_at(cluster, 155) == ISOLATED_0
    assert cluster.network.clog_us(0, 1) > 0
    assert links_at(cluster, 170) == ISOLATED_0
    assert cluster.network.clog_us(0, 1) == 0
    assert links_at(cluster, 599) == ISOLATED_0
    assert links_at(cluster, 601) == set()


def test_a_partition_adds_to_a_one_way_cut_and_ends_without_it() -> None:
    cluster = cluster_with(NemesisEvent(100, Fault.ONE_WAY, 0, 500),
                           NemesisEvent(200, Fault.ISOLATE, 2, 100))
    one_way = {(1, 0), (2, 0)}
    assert links_at(cluster, 150) == one_way
    assert links_at(cluster, 250) == one_way | {(0, 2), (1, 2), (2, 1)}
    assert links_at(cluster, 350) == one_way
    assert links_at(cluster, 650) == set()


def test_overlapping_clogs_slow_a_link_until_the_last_ends() -> None:
    cluster = cluster_with(NemesisEvent(100, Fault.CLOG, 1, 300),
                           NemesisEvent(200, Fault.CLOG, 1, 50))
    cluster.run_until(300 * 1000)
    assert cluster.network.clog_us(1, 0) > 0
    cluster.run_until(401 * 1000)
    assert cluster.network.clog_us(1, 0) == 0


def test_heal_ends_every_fault_and_their_ends_change_nothing_after() -> None:
    cluster = cluster_with(NemesisEvent(100, Fault.ISOLATE, 0, 500))
    cluster.run_until(200 * 1000)
    runner.heal(cluster)
    assert blocked_links(cluster) == set()
    cluster.call_at(300 * 1000, runner._inject(NemesisEvent(300, Fault.ONE_WAY, 1, 900)))
    assert links_at(cluster, 700) == {(0, 1), (2, 1)}  # the isolation's end, at 600, was moot


def hears(groups: list[list[int]], replica: int) -> set[int]:
    return {member for group in groups if replica in group for member in group}


@pytest.mark.parametrize("replicas", [3, 5, 7])
@pytest.mark.parametrize("fault", [Fault.PARTITION_HALVES, Fault.PARTITION_RING,
                                   Fault.PARTITION_BRIDGE, Fault.ISOLATE,
                                   Fault.ISOLATE_SEQUENCER, Fault.ONE_WAY,
                                   Fault.DEAF_TO_SEQUENCER])
def test_every_partition_shape_cuts_a_link(fault: Fault, replicas: int) -> None:
    for target in range(replicas):
        cluster = cluster_with(NemesisEvent(0, fault, target, 300), replicas=replicas)
        assert links_at(cluster, 1), f"{fault} on {target} of {replicas} cuts nothing"


@pytest.mark.parametrize("replicas", [3, 5, 7])
def test_a_ring_leaves_each_replica_its_own_majority(replicas: int) -> None:
    groups = partition_groups(Fault.PARTITION_RING, 0, replicas, 0)
    views = [frozenset(hears(groups, replica)) for replica in range(replicas)]
    assert all(len(view) > replicas // 2 for view in views)
    assert len(set(views)) == replicas  # no two replicas see the same majority


def test_a_paused_replica_sends_and_executes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    acted_while_paused: list[tuple[str, int, int]] = []
    send, apply = Cluster.send, Cluster._apply

    def watched_send(self: Cluster, node: SimNode, messages: list[tuple[int, Message]]) -> None:
        if messages and self.now_us < node.paused_until:
            acted_while_paused.append(("send", self.now_us, node.id))
        send(self, node, messages)

    def watched_apply(self: Cluster, node: SimNode, ready: Ready) -> None:
        if ready.executed and self.now_us < node.paused_until:
            acted_while_paused.append(("execute", self.now_us, node.id))
        apply(self, node, ready)

    monkeypatch.setattr(Cluster, "send", watched_send)
    monkeypatch.setattr(Cluster, "_apply", watched_apply)
    # Slow syncs, so pauses start while a Ready waits for its sync.
    pauses = tuple(NemesisEvent(at, Fault.PAUSE, at // 100 % 3, 300)
                   for at in range(100, 1000, 150))
    for seed in (1, 3):
        result = runner.run(SimOptions(seed=seed, safety_ms=1000, liveness_ms=500,
                                       sync_us=5000), pauses)
        assert result.ok, result.violations
    assert acted_while_paused == []


def test_a_schedule_that_does_not_fit_the_cluster_is_named() -> None:
    fits = (NemesisEvent(0, Fault.CRASH, 2, 100), NemesisEvent(2000, Fault.PAUSE, 0, 1))
    assert schedule_problems(fits, 3, 2000) == []
    problems = schedule_problems((NemesisEvent(100, Fault.CRASH, 7, 100),
                                  NemesisEvent(100, Fault.CLOG, 0, -100),
                                  NemesisEvent(2001, Fault.PAUSE, -1, 10)), 3, 2000)
    assert problems == [
        "100:crash:7:100: target 7 is no replica (there are 3: 0 to 2)",
        "100:clog:0:-100: a fault lasts at least 1 ms, not -100",
        "2001:pause:-1:10: target -1 is no replica (there are 3: 0 to 2)",
        "2001:pause:-1:10: faults start in the safety phase, at 0 to 2000 ms, not at 2001",
    ]


def test_overlapping_crashes_keep_a_replica_down_until_the_last_one_ends() -> None:
    cluster = cluster_with(NemesisEvent(100, Fault.CRASH, 2, 300),
                           NemesisEvent(200, Fault.CRASH, 2, 500))
    cluster.run_until(150_000)
    assert cluster.nodes[2].replica is None
    cluster.run_until(500_000)  # the first crash ended at 400 ms; the second holds it down
    assert cluster.nodes[2].replica is None
    cluster.run_until(701_000)
    assert cluster.nodes[2].replica is not None
