"""O-acks that reach a command leader before the sequencer's O-accept for their slots, stepped
by hand. With 5 or more replicas an acceptor acknowledges a run to the leaders it names; its
path can be the faster one, and an ack for slots the leader does not hold yet was dropped: the
leader's slot then committed only when a heartbeat carried the commit prefix (with 7 replicas
the command was not ready until then). The learner keeps such acks (bounded, for its view) and
counts them when the slot arrives; never for a voter that restarted on a lost disk since, nor
across a view change."""

from __future__ import annotations

from consensus.learner import EARLY_ACK_WINDOW_SLOTS
from consensus.messages import Heartbeat, Message, OAccept, OAck, RejoinQuery
from tests.consensus.stepper import Stepper

ROUNDS_WARM = 20
DELIVERIES_MAX = 50


def _is_heartbeat(source: int, target: int, message: Message) -> bool:
    return isinstance(message, Heartbeat)


def _early_acks_cluster(replica_count: int, leader: int) -> tuple[Stepper, set[int]]:
    """Warm a cluster, have `leader` propose, and deliver everything but the sequencer's
    O-accept to `leader` (and heartbeats) until nothing else moves; returns the cluster and the
    acceptors whose O-acks reached `leader` early."""

    def held_back(source: int, target: int, message: Message) -> bool:
        return isinstance(message, OAccept) and target == leader

    cluster = Stepper(replica_count)
    for _ in range(ROUNDS_WARM):
        cluster.round()
    assert cluster.node(0).inspect.is_sequencer
    cluster.drop(_is_heartbeat)
    cluster.node(leader).propose(b"a")
    cluster.process(leader)
    early: set[int] = set()
    for _ in range(DELIVERIES_MAX):
        cluster.drop(_is_heartbeat)
        moving = [item for item in cluster.queue if not held_back(*item)]
        if not moving:
            break
        early |= {source for source, target, message in moving
                  if isinstance(message, OAck) and target == leader and source != 0}
        cluster.deliver(lambda s, t, m: not held_back(s, t, m))
        cluster.process_all()
    else:
        raise AssertionError("messages kept moving")
    assert any(held_back(*item) for item in cluster.queue), cluster.queue
    return cluster, early


def _deliver_the_rest(cluster: Stepper) -> None:
    """Deliver everything queued, heartbeats dropped, until nothing moves (no ticks)."""
    for _ in range(DELIVERIES_MAX):
        cluster.drop(_is_heartbeat)
        if not cluster.queue:
            return
        cluster.deliver()
        cluster.process_all()
    raise AssertionError("messages kept moving")


def test_seven_replicas_early_acks_make_the_command_ready_without_a_heartbeat() -> None:
    cluster, early = _early_acks_cluster(7, leader=6)
    assert len(early) >= 2, "the schedule sent too few acceptor acks ahead of the O-accept"
    slot = cluster.node(0).inspect.log_end - 1
    assert cluster.node(0).inspect.o_value(slot) == 6
    assert cluster.node(6).inspect.o_value(slot) is None  # the acks came first
    _deliver_the_rest(cluster)
    assert cluster.node(6).inspect.committed_o(slot) == 6
    assert len(cluster.readied[6]) == 1, cluster.readied[6]
    assert any("a" in batch for _, batch in cluster.executed[6]), cluster.executed[6]


def test_five_replicas_early_acks_let_the_leader_execute_without_a_heartbeat() -> None:
    cluster, early = _early_acks_cluster(5, leader=4)
    assert early, "the schedule sent no acceptor ack ahead of the O-accept"
    slot = cluster.node(0).inspect.log_end - 1
    assert cluster.node(4).inspect.o_value(slot) is None
    _deliver_the_rest(cluster)
    assert cluster.node(4).inspect.committed_o(slot) == 4
    assert any("a" in batch for _, batch in cluster.executed[4]), cluster.executed[4]


def test_early_acks_of_voters_that_lost_their_disks_since_count_no_more() -> None:
    """An acceptor acknowledged the slot early, then lost its disk and asked the leader to
    report (a rejoin): the leader's report names its log's end, which the slot is past, so
    the old life's ack must not complete a quorum afterwards (the acceptance it stood for is
    gone, and this report did not tell the rejoining replica of the slot)."""
    cluster, early = _early_acks_cluster(7, leader=6)
    assert len(early) == 2, early  # with the leader and the sequencer: a majority of 7
    slot = cluster.node(0).inspect.log_end - 1
    leader = cluster.node(6)
    asker = min(early)
    leader.step(RejoinQuery(asker, leader.inspect.view, 7))
    cluster.drop(lambda s, t, m: s == 6 and t == asker)  # the report
    cluster.blocked = {(asker, 6)}  # its new life is not heard from here
    cluster.deliver(lambda s, t, m: isinstance(m, OAccept) and t == 6)
    cluster.process(6)
    assert leader.inspect.o_value(slot) == 6
    assert leader.inspect.committed_o(slot) is None  # three votes of seven: no majority


def test_an_early_ack_for_every_slot_keeps_no_more_than_a_window() -> None:
    """A peer's ack range is a claim: one naming [0, 2**62) keeps a window's worth and costs
    no more when a run arrives."""
    cluster, _ = _early_acks_cluster(7, leader=6)
    leader = cluster.node(6)
    leader.step(OAck(1, leader.inspect.view, 0, 2**62))
    _deliver_the_rest(cluster)
    slot = cluster.node(0).inspect.log_end - 1
    assert leader.inspect.committed_o(slot) == 6
    kept = leader._learner._early  # the bound is the point of the test
    assert all(high - low <= EARLY_ACK_WINDOW_SLOTS for ranges in kept.values()
               for low, high in ranges), kept
