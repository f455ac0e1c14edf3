"""The nemesis's faults as the simulated network and replicas feel them: each network fault ends
only itself, however faults overlap, and overlapping crashes hold a replica down until the last
ends; every partition shape cuts something at every group size; a held cut loses the frames on
their way and delivers the later ones, in order, once it ends; a paused replica does nothing
until its pause ends; a schedule that does not fit the cluster is named; long faults come on
top of a seed's schedule without changing it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from consensus.codec import decode_messages, encode_messages
from consensus.messages import Message
from consensus.prng import Prng
from consensus.ready import Ready
from jepsen.sim import runner
from jepsen.sim.cluster import Cluster, SimNode
from jepsen.sim.nemesis import (
    HELD_CUTS,
    Fault,
    NemesisEvent,
    disturbance,
    draw_schedule,
    partition_groups,
    schedule_problems,
)
from jepsen.sim.network import Disturbance, LinkFaults, Network
from jepsen.sim.options import WIPES_ONE_IN, SimOptions, swarm

Link = tuple[int, int]


def blocked_links(cluster: Cluster) -> set[Link]:
    count = cluster.options.replica_count
    return {(source, target) for source in range(count) for target in range(count)
            if cluster.network.is_blocked(source, target)
            or cluster.network.holds(source, target)}


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


def test_a_mute_replica_hears_everybody_and_nobody_hears_it() -> None:
    cluster = cluster_with(NemesisEvent(100, Fault.MUTE, 1, 100))
    assert links_at(cluster, 150) == {(1, 0), (1, 2)}
    held = cluster_with(NemesisEvent(100, Fault.MUTE_HELD, 1, 100))
    assert links_at(held, 150) == {(1, 0), (1, 2)}
    assert not held.network.is_blocked(1, 0)  # held, not lost
    assert links_at(held, 201) == set()


def test_held_cuts_are_the_cuts_they_name() -> None:
    for held, plain in HELD_CUTS.items():
        for target in range(5):
            cut = disturbance(held, target, 5, sequencer=2, clog_us=0)
            same = disturbance(plain, target, 5, sequencer=2, clog_us=0)
            assert cut == Disturbance(held=same.blocked), held


def network(replicas: int = 3) -> Network:
    return Network([[100] * replicas for _ in range(replicas)], Prng(1), LinkFaults())


def test_a_held_link_keeps_its_frames_in_order_until_no_fault_holds_it() -> None:
    net = network()
    first = net.disturb(Disturbance(held=frozenset({(0, 1)})))
    second = net.disturb(Disturbance(held=frozenset({(0, 1), (0, 2)})))
    assert net.holds(0, 1) and net.arrivals(0, 0, 1) == []
    for frame in (b"a", b"b"):
        net.hold(0, 1, frame)
    net.hold(0, 2, b"c")
    net.restore(second)
    assert net.released() == [((0, 2), [b"c"])]  # (0, 1) is still held by the first
    net.restore(first)
    assert net.released() == [((0, 1), [b"a", b"b"])]
    assert net.released() == []


def test_frames_held_on_a_link_a_fault_blocks_when_the_hold_ends_are_lost() -> None:
    net = network()
    hold = net.disturb(Disturbance(held=frozenset({(0, 1)})))
    net.hold(0, 1, b"a")
    net.disturb(Disturbance(blocked=frozenset({(0, 1)})))
    assert not net.holds(0, 1)  # blocked wins: what is sent now is lost
    net.restore(hold)
    assert net.released() == []


def test_a_crashed_sender_loses_what_its_links_held() -> None:
    net = network()
    net.disturb(Disturbance(held=frozenset({(0, 1), (1, 0)})))
    net.hold(0, 1, b"from 0")
    net.hold(1, 0, b"to 0")
    net.forget_held_from(0)  # its queues died with it; its peers' queues to it did not
    net.heal()
    assert net.released() == [((1, 0), [b"to 0"])]


def test_a_hold_severs_the_links_it_cuts_each_time_it_begins() -> None:
    net = network()
    assert net.severed(0, 1) == 0
    net.disturb(Disturbance(held=frozenset({(0, 1)})))
    net.disturb(Disturbance(held=frozenset({(0, 1)})))  # already cut: the same connection
    net.disturb(Disturbance(blocked=frozenset({(1, 0)})))  # a plain cut severs nothing
    assert (net.severed(0, 1), net.severed(1, 0)) == (1, 0)
    net.heal()
    net.disturb(Disturbance(held=frozenset({(0, 1)})))
    assert net.severed(0, 1) == 2


def received_by(cluster: Cluster, replica: int) -> list[tuple[int, int, bytes]]:
    """(time, sender, frame) of every frame `replica` is handed from now on."""
    seen: list[tuple[int, int, bytes]] = []
    node = cluster.nodes[replica].replica
    assert node is not None
    receive = node.receive

    def watched(frame: bytes, sender: int | None = None) -> None:
        seen.append((cluster.now_us, decode_messages(frame)[0].sender, frame))
        receive(frame, sender)

    node.receive = watched  # type: ignore[method-assign]
    return seen


def sent_to(cluster: Cluster, replica: int, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every frame sent to `replica` from now on, in the order they were sent."""
    frames: list[bytes] = []
    send = Cluster.send

    def watched(self: Cluster, node: SimNode, messages: list[tuple[int, Message]]) -> None:
        frames.append(encode_messages([m for target, m in messages if target == replica])
                      if any(target == replica for target, _ in messages) else b"")
        send(self, node, messages)

    monkeypatch.setattr(Cluster, "send", watched)
    return frames


def test_a_held_cut_delivers_what_was_sent_during_it_after_it_ends_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = cluster_with(NemesisEvent(100, Fault.ONE_WAY_HELD, 0, 200))
    for client in range(3):
        cluster.add_client(client, client * 137)
    seen = received_by(cluster, 0)
    sent = sent_to(cluster, 0, monkeypatch)
    cluster.run_until(299_000)
    assert [at for at, _, _ in seen if at >= 100_000] == []  # those under way were lost
    cluster.run_until(700_000)
    assert {1, 2} <= {sender for at, sender, _ in seen if at >= 300_000}  # held, then sent
    for peer in (1, 2):  # each link's frames arrive in the order they were sent
        arrived = iter(frame for _, sender, frame in seen if sender == peer)
        assert in_order(arrived, iter(sent)), peer


def test_the_heal_sends_what_held_cuts_kept_at_once() -> None:
    """The liveness phase starts with every link up: no reconnect delay after the heal."""
    cluster = cluster_with(NemesisEvent(100, Fault.ISOLATE_HELD, 0, 5000))
    for client in range(3):
        cluster.add_client(client, client * 137)
    seen = received_by(cluster, 0)
    cluster.run_until(300_000)
    runner.heal(cluster)
    cluster.run_until(300_000 + cluster.options.latency_us_max)
    assert {1, 2} <= {sender for at, sender, _ in seen if at >= 300_000}


def in_order(arrived: Iterator[bytes], sent: Iterator[bytes]) -> bool:
    """Whether the arrived frames are a subsequence of the sent ones."""
    return all(any(frame == candidate for candidate in sent) for frame in arrived)


def hears(groups: list[list[int]], replica: int) -> set[int]:
    return {member for group in groups if replica in group for member in group}


@pytest.mark.parametrize("replicas", [3, 5, 7])
@pytest.mark.parametrize("fault", [Fault.PARTITION_HALVES, Fault.PARTITION_RING,
                                   Fault.PARTITION_BRIDGE, Fault.ISOLATE,
                                   Fault.ISOLATE_SEQUENCER, Fault.ONE_WAY, Fault.MUTE,
                                   Fault.MUTE_SEQUENCER, Fault.DEAF_TO_SEQUENCER, *HELD_CUTS])
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


def test_long_faults_come_on_top_of_a_seed_schedule_and_leave_it_as_it_was() -> None:
    for seed in range(40):
        options = dataclasses.replace(swarm(seed, SimOptions(seed=seed, replica_count=5)),
                                      wipe_every_ms=0)
        without = dataclasses.replace(options, long_fault_every_ms=0)
        schedule = draw_schedule(options, Prng(seed).fork(4))
        before = draw_schedule(without, Prng(seed).fork(4))
        assert [event for event in schedule if event in before] == list(before)
        long_faults = [event for event in schedule if event not in before]
        assert bool(long_faults) == bool(options.long_fault_every_ms), seed
        assert all(options.long_fault_ms // 2 < event.duration_ms <= options.long_fault_ms
                   for event in long_faults)


def test_lost_disks_come_on_top_of_a_seed_schedule_and_leave_it_as_it_was() -> None:
    """Wipes are drawn last, from a stream of their own: a seed's other faults stay as they
    were before wipes existed, and one seed in `WIPES_ONE_IN` or so gets them."""
    wiped = 0
    for seed in range(80):
        options = swarm(seed, SimOptions(seed=seed, replica_count=3))
        without = dataclasses.replace(options, wipe_every_ms=0)
        schedule = draw_schedule(options, Prng(seed).fork(4))
        before = draw_schedule(without, Prng(seed).fork(4))
        assert [event for event in schedule if event.fault is not Fault.WIPE] == list(before)
        wipes = [event for event in schedule if event.fault is Fault.WIPE]
        assert bool(wipes) == bool(options.wipe_every_ms), seed
        wiped += bool(wipes)
    assert 80 // WIPES_ONE_IN // 2 <= wiped <= 80 * 2 // WIPES_ONE_IN
