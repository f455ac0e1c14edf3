"""The Multi-Paxos baseline's forwarded commands: a deposed sequencer forwards its queue to
the new sequencer, others' commands with its own, and keeps only its own until they run. It
had kept every one by tag alone: another replica's command was forwarded again for ever
(nothing here ever learns it ran), and could hide an own command with the same tag, which
was then never proposed."""

from __future__ import annotations

from consensus.config import Mode, ReplicaConfig
from consensus.messages import Forward
from consensus.prng import Prng
from consensus.replica import Replica
from tests.consensus.stepper import Stepper


def _multipaxos(replicas: int) -> Stepper:
    """One C-instance in flight at a time, so that a sequencer's queue holds commands."""
    cluster = Stepper(replicas)
    for replica in range(replicas):
        cluster.configs[replica] = ReplicaConfig(replica_id=replica, replica_count=replicas,
                                                 mode=Mode.MULTIPAXOS, inflight_instances_max=1)
        cluster.replicas[replica] = Replica(cluster.configs[replica], Prng(replica))
    for _ in range(20):
        cluster.round()
    return cluster


def _deposed_until_1_or_2_serves(cluster: Stepper) -> None:
    for _ in range(400):
        cluster.round()
        if cluster.node(1).status().view > 0 and cluster.node(2).status().view > 0 and \
                any(cluster.node(replica).inspect.is_sequencer for replica in (1, 2)):
            return


def test_a_deposed_sequencer_does_not_forward_another_replicas_command_for_ever() -> None:
    """Multi-Paxos baseline, 3 replicas, one C-instance in flight at a time. Sequencer 0 holds
    1's forwarded command x in its queue (its window is full with its own y, whose C-accepts
    are lost) when it is deposed. As a follower of the new view it forwards its whole queue,
    x included, and keeps x in `_forwarded`, keyed by tag alone. Nothing ever removes it:
    `on_executed_own` only sees 0's own tags, no ReadyNotice for x is addressed to 0, and
    `forget_forwarded` asks whether 0's own tag ran. So 0 forwards x again every 4 resend
    periods for ever; the sequencer proposes it each time (a C-instance and an O-slot each)
    and every executor drops it as a repeat."""
    cluster = _multipaxos(3)
    for text in (b"w0", b"w1", b"w2"):  # 1's tags run ahead of 0's (no tag collision)
        cluster.node(1).propose(text)
        for _ in range(6):
            cluster.round()
    assert cluster.node(0).inspect.is_sequencer
    cluster.blocked = {(0, 1), (0, 2), (2, 0)}  # 0 hears 1 only; nobody hears 0
    cluster.node(0).propose(b"y")
    cluster.process(0)
    cluster.node(1).propose(b"x")
    cluster.process(1)
    cluster.deliver()
    cluster.process_all()
    assert cluster.node(0)._leader.pending_count() == 1  # x waits behind y
    _deposed_until_1_or_2_serves(cluster)
    cluster.blocked = set()
    forwards_of_x = 0
    for _ in range(1200):
        cluster.tick()
        cluster.process_all()
        forwards_of_x += sum(
            1 for s, t, m in cluster.queue
            if s == 0 and isinstance(m, Forward) and any(c.payload == b"x" for c in m.commands))
        cluster.deliver()
        cluster.process_all()
    ran = [batch for _, batch in cluster.executed[2]]
    assert sum(1 for batch in ran if "x" in batch) == 1, ran
    dropped = sum(dict(cluster.node(r).status().counters).get("executor.duplicate_dropped", 0)
                  for r in range(3))
    assert forwards_of_x <= 2, (forwards_of_x, dropped, cluster.node(0)._leader._forwarded)


def test_a_deposed_sequencer_keeps_its_own_command_whose_tag_another_replica_used() -> None:
    """Multi-Paxos baseline, 3 replicas, one C-instance in flight at a time. When sequencer 0
    is deposed its queue holds its own z and 1's forwarded x, which carry the same tag (tags
    count per replica). `_forward` files both in `_forwarded` by tag alone: x replaces z.
    The Forward carrying both is lost; every later resend carries x only, so z is never
    proposed and its client never hears back."""
    cluster = _multipaxos(3)
    cluster.node(1).propose(b"w")  # 1's tag 0; x takes tag 1
    for _ in range(6):
        cluster.round()
    assert cluster.node(0).inspect.is_sequencer
    cluster.blocked = {(0, 1), (0, 2), (2, 0)}  # 0 hears 1 only; nobody hears 0
    cluster.node(0).propose(b"y")  # 0's tag 0, in flight for ever
    cluster.process(0)
    z_tag = cluster.node(0).propose(b"z")  # 0's tag 1
    cluster.process(0)
    x_tag = cluster.node(1).propose(b"x")  # 1's tag 1
    assert z_tag == x_tag
    cluster.process(1)
    cluster.deliver()
    cluster.process_all()
    assert cluster.node(0)._leader.pending_count() == 2  # z and x wait behind y
    _deposed_until_1_or_2_serves(cluster)
    cluster.blocked = set()
    lost_once = False
    for _ in range(1200):
        cluster.tick()
        cluster.process_all()
        if not lost_once:
            lost_once = bool(cluster.drop(
                lambda s, t, m: s == 0 and isinstance(m, Forward)
                and any(c.payload == b"z" for c in m.commands)))
        cluster.deliver()
        cluster.process_all()
    assert lost_once
    ran = [batch for _, batch in cluster.executed[2]]
    assert any("z" in batch for batch in ran), (ran, cluster.node(0)._leader._forwarded)


def test_a_queue_is_forwarded_in_messages_of_a_batch_each() -> None:
    """Up to `pending_proposals_max` queued commands had gone in one Forward, past what a
    peer link carries in one frame."""
    config = ReplicaConfig(replica_id=1, replica_count=3, mode=Mode.MULTIPAXOS,
                           batch_commands_max=4, batch_bytes_max=100)
    follower = Replica(config, Prng(1))
    for payload in [b"x" * 30] * 6 + [b"y" * 150] + [b"z"] * 5:
        follower.propose(payload)
    ready = follower.ready()
    forwards = [message.commands for _, message in ready.messages
                if isinstance(message, Forward)]
    assert [[len(command.payload) for command in batch] for batch in forwards] == [
        [30, 30, 30], [30, 30, 30], [150], [1, 1, 1, 1], [1]]


def test_a_lost_forward_goes_again_while_newer_commands_keep_being_forwarded() -> None:
    """Replica 1's Forward of x is lost (as one is when it reaches a sequencer still
    establishing its view); 1's clients keep proposing, one command every 10 ticks. Each
    Forward had restarted the one clock of every command forwarded: x went again only once 1
    stopped forwarding for 4 resend periods, and its client gave up first (swarm seed 10 of
    the simulator, Multi-Paxos: 3 s). Now each command waits 4 resend periods at most, and
    the others, answered in time, go once."""
    cluster = _multipaxos(3)
    assert cluster.node(0).inspect.is_sequencer
    cluster.node(1).propose(b"x")
    cluster.process(1)
    assert cluster.drop(lambda s, t, m: s == 1 and isinstance(m, Forward))
    forwarded: list[str] = []
    resend_ticks = cluster.configs[1].resend_ticks
    for tick in range(6 * resend_ticks):
        if tick % 10 == 0:
            cluster.node(1).propose(b"w%d" % tick)
        cluster.tick()
        cluster.process_all()
        forwarded.extend(command.payload.decode() for s, _, m in cluster.queue
                         if s == 1 and isinstance(m, Forward) for command in m.commands)
        cluster.deliver()
        cluster.process_all()
    ran = [batch for _, batch in cluster.executed[2]]
    assert any("x" in batch for batch in ran), ran
    assert sorted(forwarded) == sorted(set(forwarded)), forwarded
