"""A command leader taking its own space back (after another replica recovered part of it, or
after a restart): the round must see to the end of what acceptors hold before the leader
proposes or fills anything, commands known to have lost their index are proposed again
(those whose fate is unknown never are), and acceptors that truncated past the leader's
unfinished indexes neither stop the round nor the leader. Found by review; each scenario
stepped by hand with the stepper."""

from __future__ import annotations

import dataclasses

import pytest

from consensus.command_log import next_ballot
from consensus.config import ReplicaConfig
from consensus.messages import (
    NOOP,
    CAccept,
    CAck,
    CCommit,
    CNack,
    CPrepare,
    CPromise,
    CRequest,
    Heartbeat,
    Message,
    OAccept,
)
from consensus.prng import Prng
from consensus.records import Record
from consensus.replica import Replica
from tests.consensus.stepper import Stepper


def _warm(replicas: int) -> Stepper:
    cluster = Stepper(replicas)
    for _ in range(20):
        cluster.round()
    return cluster


def _ordered_with_no_accept(cluster: Stepper, command: bytes) -> int:
    """Replica 1 proposes `command`: its accepts are lost, its C-request reaches the
    sequencer. The index it took."""
    leader = cluster.node(1)
    index = leader.inspect.exec_count(1)
    leader.propose(command)
    cluster.process(1)
    assert cluster.drop(lambda s, t, m: s == 1 and isinstance(m, CAccept))
    cluster.deliver(lambda s, t, m: s == 1)  # the C-request to the sequencer
    return index


def _ran(cluster: Stepper, replica: int, text: str) -> bool:
    return any(text in batch.strip("[]").split() for _, batch in cluster.executed[replica])


def _compact(cluster: Stepper, replica: int) -> None:
    node = cluster.node(replica)
    cluster.process(replica)
    assert node.may_compact
    node.compact(b"state", node.executed_slots)
    cluster.process(replica)


def _run_others(cluster: Stepper) -> None:
    """0 and 2 run commands of their own, execute them and compact past what they ran."""
    for text in ("x", "y", "z"):
        cluster.node(0).propose(text.encode())
        cluster.node(2).propose((text + "2").encode())
        for _ in range(5):
            cluster.round()
    assert _ran(cluster, 0, "z") and _ran(cluster, 2, "z")
    _compact(cluster, 0)
    _compact(cluster, 2)


def _lost_index_then_peers_compact() -> tuple[Stepper, int]:
    """3 replicas, sequencer 0. Leader 1 proposes "a" at (1, k): its C-accept to 2 is lost,
    its C-request reaches the sequencer, which orders (1, k). Then 1's outbound links fail
    (it still hears everything). 2 stalls on (1, k) and recovers it as a no-op; 1 learns the
    no-op, executes it, sees "a" lost its index and starts taking its space back, which
    cannot reach anyone. Meanwhile 0 and 2 run more commands and compact past (1, k)."""
    cluster = _warm(3)
    k = _ordered_with_no_accept(cluster, b"a")
    leader = cluster.node(1)
    cluster.blocked |= {(1, 0), (1, 2)}
    for _ in range(600):
        cluster.round()
        if leader.inspect.committed_c(1, k) == NOOP and leader._leader.retaking:
            break
    assert cluster.node(2).inspect.committed_c(1, k) == NOOP, "2 recovered (1, k)"
    assert leader.inspect.committed_c(1, k) == NOOP and leader._leader.retaking
    _run_others(cluster)
    assert _ran(cluster, 1, "z")
    assert cluster.node(0)._ctx.clog[1].base > k and cluster.node(2)._ctx.clog[1].base > k
    cluster.blocked.clear()
    return cluster, k


def test_a_leader_whose_lost_index_peers_compacted_proposes_again() -> None:
    """Once 1's links work again, its retake round started from (1, k), below both peers'
    truncation: every promise reported log_base > k, the round gave up as "behind", and 1
    retried from the same index forever, while `retaking` held back every new proposal of
    1's: its clients got nothing although 1 was up to date (it executed everything)."""
    cluster, _ = _lost_index_then_peers_compact()
    cluster.node(1).propose(b"b")
    for _ in range(300):
        cluster.round()
    for replica in range(3):
        assert _ran(cluster, replica, "a") and _ran(cluster, replica, "b")


def test_a_command_known_to_have_lost_its_index_is_proposed_again_after_compaction() -> None:
    """The same, and 1 compacts too (its driver does, every snapshot_every_slots executed
    slots): the retake then starts above the truncation and succeeds, but `forget_below`
    dropped "a" as of unknown outcome, though 1 itself executed the no-op that took (1, k)
    and knew "a" had not run. "a" was never proposed again; its client only timed out."""
    cluster, _ = _lost_index_then_peers_compact()
    _compact(cluster, 1)
    cluster.node(1).propose(b"b")
    for _ in range(300):
        cluster.round()
    for replica in range(3):
        assert _ran(cluster, replica, "a") and _ran(cluster, replica, "b")
    assert sum(batch.strip("[]").split().count("a") for _, batch in cluster.executed[0]) == 1


def test_a_command_known_to_have_lost_its_index_survives_a_peers_snapshot() -> None:
    """3 replicas, sequencer 0. Leader 1 proposes "a" at (1, k); its C-accept to 2 is lost,
    its C-request reaches the sequencer, which orders (1, k). Then 1 hears only replica 2:
    2 stalls on (1, k), recovers it as a no-op and sends 1 the commit, but the O-commit
    ordering (1, k) never reaches 1, so "a" is not yet judged there. 0 and 2 run on and
    compact. 1's links to its peers heal, and it fetches from 2 (the sequencer still cannot
    reach it): it is behind 2's truncation and installs 2's snapshot. The install dropped
    "a" as of unknown outcome, though the no-op committed at (1, k) on 1 said it had not
    run: it is queued again before the truncation instead."""
    cluster = _warm(3)
    k = _ordered_with_no_accept(cluster, b"a")
    leader = cluster.node(1)
    cluster.blocked |= {(1, 0), (1, 2), (0, 1)}
    for _ in range(600):
        cluster.round()
        if leader.inspect.committed_c(1, k) == NOOP:
            break
    assert leader.inspect.committed_c(1, k) == NOOP
    assert leader.inspect.exec_count(1) == k, "(1, k) is not ordered at 1"
    _run_others(cluster)
    assert not _ran(cluster, 1, "z")
    cluster.blocked -= {(1, 0), (1, 2)}
    for _ in range(300):
        cluster.round()
        if dict(leader.status().counters).get("catchup.snapshot_installed"):
            break
    assert leader.executed_slots > 0 and not cluster.executed[1], "installed, ran nothing"
    cluster.blocked.clear()
    cluster.node(1).propose(b"b")
    for _ in range(300):
        cluster.round()
    for replica in range(3):
        assert _ran(cluster, replica, "b")
        assert _ran(cluster, replica, "a") or replica == 1  # 1 has it in its snapshot
    assert sum(batch.strip("[]").split().count("a") for _, batch in cluster.executed[0]) == 1


def test_a_retake_goes_on_past_the_indexes_its_peers_truncated() -> None:
    """3 replicas, sequencer 0. Leader 1 proposes "a" at (1, k); every answer about its space
    is lost on the way to 1 (acknowledgements, refusals, commits, promises). A peer stalls on
    (1, k) and recovers it: "a", chosen at the recoverer's ballot. 1 learns the commit by a
    fetch and runs "a" (its client is answered), but its own proposal stays unfinished: no
    acknowledgement of its ballot ever came. 0 and 2 run on and compact past (1, k). Then
    the answers come through: 1's resend of (1, k) is refused (the peers promised the
    recoverer's ballot) and 1 takes its space back from k; every promise reported a
    truncation past k, the round gave up as "behind", and 1 tried again from k for as long
    as it did not compact past k itself, proposing nothing meanwhile. The round goes on
    from the truncation instead: (1, k) is decided, and 1 knows its value."""
    cluster = _warm(3)
    leader = cluster.node(1)
    k = leader.inspect.exec_count(1)
    leader.propose(b"a")

    def answers_to_1(source: int, target: int, message: object) -> bool:
        return target == 1 and isinstance(message, (CAck, CNack, CCommit, CPromise)) and \
            getattr(message, "space", None) == 1

    def round_losing_answers() -> None:
        cluster.tick()
        cluster.process_all()
        cluster.drop(answers_to_1)
        cluster.deliver()
        cluster.process_all()
        cluster.drop(answers_to_1)

    for _ in range(600):
        round_losing_answers()
        if _ran(cluster, 1, "a") and _ran(cluster, 0, "a") and _ran(cluster, 2, "a"):
            break
    assert _ran(cluster, 1, "a"), "1 learned (1, k) by a fetch"
    assert leader._leader.lowest_unfinished() == k, "its own proposal there is unfinished"
    for text in ("x", "y", "z"):
        cluster.node(0).propose(text.encode())
        for _ in range(5):
            round_losing_answers()
    assert _ran(cluster, 1, "z")
    _compact(cluster, 0)
    _compact(cluster, 2)
    assert cluster.node(0)._ctx.clog[1].base > k and cluster.node(2)._ctx.clog[1].base > k
    leader.propose(b"b")
    for _ in range(300):
        cluster.round()
    assert dict(leader.status().counters).get("recovery.owner_past_truncation", 0) >= 1
    for replica in range(3):
        assert _ran(cluster, replica, "b"), "1 proposes again"
        assert sum(batch.strip("[]").split().count("a")
                   for _, batch in cluster.executed[replica]) == 1


def test_a_resumed_proposal_known_to_have_lost_its_index_is_queued_before_compaction(
) -> None:
    """After a restart the leader finishes its own instances accepted before the crash (no
    longer kept for readiness). One of them, "a" at (1, 0), was recovered meanwhile as a
    no-op: 1 learns the commit and executes it while its retake round is still out, then
    compacts past it. The truncation left nothing to tell that "a" lost its index: it stayed
    a proposal nobody would finish; it is queued again before the truncation instead."""
    config = ReplicaConfig(replica_id=1, replica_count=3)
    leader = Replica(config, Prng(1))
    leader.propose(b"a")
    records: list[Record] = [*leader.ready().records]
    leader.advance()
    restarted = Replica.restore(config, Prng(101), records)
    assert restarted._leader.retaking and restarted.status().pending_proposals == 0
    restarted.step(CCommit(2, 0, 1, 0, next_ballot(1, 2), NOOP))  # 2 recovered (1, 0)
    restarted.step(OAccept(0, 0, 0, (1,), 1))  # ordered at slot 0, the sequencer's vote
    executed = [item.commands for item in restarted.ready().executed]
    restarted.advance()
    executed += [item.commands for item in restarted.ready().executed]
    assert executed == [NOOP]
    restarted.compact(b"state", 1)
    assert restarted.status().pending_proposals == 1, "a is queued again"


def _small_promises(replicas: int) -> Stepper:
    """A cluster whose promises (and fetch replies) carry at most 2 instances, one command
    per instance: the cap that `fetch_instances_max` (256 by default) puts on a promise,
    reached with a handful of instances."""
    cluster = Stepper(replicas)
    for replica in cluster.configs:
        cluster.configs[replica] = dataclasses.replace(
            cluster.configs[replica], fetch_instances_max=2, batch_commands_max=1)
        cluster.replicas[replica] = Replica(cluster.configs[replica], Prng(replica))
    for _ in range(20):
        cluster.round()
    return cluster


def test_a_retake_cut_short_by_the_promise_cap_goes_on_before_anything_is_proposed(
) -> None:
    """3 replicas, sequencer 0, promises capped at 2 instances. Leader 1 sends c0..c3 at
    (1, 0..3) to 2 and a C-request to 0, and crashes before its acceptance records are on
    disk (the case `Replica._rejoin` names). Replica 2 recovers 1's space in two rounds (the
    cap): c0, c1, then c2, c3, chosen at 2's ballot by {0, 2}; the commits of the second
    round to 0 are lost. 1 restarts and takes its space back from index 0: both promises
    report 2 instances (the cap) and max_index 3, so the round settles only (1, 0..1).
    Having no unfinished proposal of its own, 1 took that for the whole space, set
    next_index to 2, stalled on (1, 2) (its fetch from 0 brings only the committed c0, c1)
    and `fill_to` proposed a no-op at (1, 2) under its new ballot, with no phase 1 there:
    replica 2, which holds c2 chosen, stopped on the C-agreement assertion (had the no-op
    reached 0 first, which held c2 uncommitted, a second value would have been chosen)."""
    cluster = _small_promises(3)
    leader = cluster.node(1)
    assert leader.inspect.exec_count(1) == 0
    durable = len(cluster.records[1])
    for text in ("c0", "c1", "c2", "c3"):
        leader.propose(text.encode())
    cluster.process(1)
    cluster.deliver(lambda s, t, m: s == 1)  # C-accepts to 2, the C-request to 0
    cluster.process_all()
    cluster.crash(1)
    cluster.records[1] = cluster.records[1][:durable]  # its acceptances never reached disk
    for _ in range(30):  # the sequencer's resend commits the four O-instances at 0 and 2
        cluster.round()
    recoverer = cluster.node(2)
    recoverer._recovery.start(1, 0)
    for _ in range(6):
        cluster.process_all()
        cluster.deliver()
    recoverer._recovery.start(1, 2)
    for _ in range(2):
        cluster.process_all()
        cluster.deliver()
    cluster.process(2)
    cluster.deliver(lambda s, t, m: isinstance(m, CAccept))
    cluster.process_all()
    cluster.deliver(lambda s, t, m: t == 2)
    cluster.process(2)
    chosen = recoverer.inspect.committed_c(1, 2)
    assert chosen is not None, "c2 chosen by {0, 2}"
    cluster.drop(lambda s, t, m: True)  # the commits to 0 (and to 1, down) are lost
    cluster.restart(1)
    for _ in range(400):  # stopped on the C-agreement assertion
        cluster.round()
    restarted = cluster.node(1)
    assert dict(restarted.status().counters).get("leader.retake_continued", 0) >= 1
    for replica in range(3):
        node = cluster.node(replica)
        assert [node.inspect.committed_c(1, index) for index in range(4)] == \
            [recoverer.inspect.committed_c(1, index) for index in range(4)]
        assert node.inspect.committed_c(1, 2) == chosen
        assert node.inspect.exec_count(1) == 4


@pytest.mark.parametrize("hears_orders", [True, False], ids=["hears_orders", "hears_nothing"])
def test_a_restarted_leader_puts_no_new_command_at_an_index_the_sequencer_ordered(
        hears_orders: bool) -> None:
    """3 replicas, sequencer 0. Leader 1 proposes "old" at (1, k): its C-accept to 2 is
    lost, its C-request reaches the sequencer, which orders (1, k) at slot s; 1 crashes
    before its own acceptance is on disk, so nobody holds a value there. 0's command "p" is
    ordered at slot s + 1 and is ready. 1 restarts and first hears a heartbeat sent before s
    was committed (so it has nothing to settle before it proposes), and then, or not (the
    thrifty O-accepts may reach only the sequencer and 1), the sequencer's O-accepts for s
    and s + 1. Its retake found nothing at k, and a client's "new" went to (1, k): "new" ran
    at slot s, ahead of "p", which was ready before "new" was proposed (the paper's
    invariant 7; seen in the simulator, seed 1016 of 3 replicas). The sequencer's promise
    says how many O-instances name 1: a no-op takes (1, k), and "new" the next index."""
    cluster = _warm(3)
    durable = len(cluster.records[1])
    k = _ordered_with_no_accept(cluster, b"old")
    cluster.crash(1)
    cluster.records[1] = cluster.records[1][:durable]
    tag = cluster.node(0).propose(b"p")
    held: list[Message] = []  # what the network holds for 1 meanwhile
    for _ in range(60):
        cluster.tick()
        cluster.process_all()
        held += [m for _, _, m in cluster.drop(lambda s, t, m: t == 1)]
        cluster.deliver()
        cluster.process_all()
        if tag in cluster.readied[0]:
            break
    assert tag in cluster.readied[0], "p is ready, ordered after (1, k)"
    assert cluster.node(0).inspect.committed_c(1, k) is None, "(1, k) not recovered yet"
    first_heartbeat = next(m for m in held if isinstance(m, Heartbeat))
    assert first_heartbeat.commit_prefix <= cluster.node(0).inspect.log_end - 2
    cluster.restart(1)
    restarted = cluster.node(1)
    restarted.step(first_heartbeat)
    if hears_orders:
        for message in held:
            if not isinstance(message, Heartbeat):
                restarted.step(message)
    cluster.process(1)
    restarted.propose(b"new")
    for _ in range(300):
        cluster.round()
    for replica in range(3):
        ran = [batch for _, batch in cluster.executed[replica]]
        assert "[p]" in ran and "[new]" in ran
        assert ran.index("[p]") < ran.index("[new]"), f"replica {replica}: {ran}"
    assert not _ran(cluster, 0, "old")


def test_a_c_request_from_before_a_retake_orders_nothing() -> None:
    """A C-request the leader sent in an earlier life, at its old ballot, reaches the
    sequencer after the sequencer promised the leader's retake a higher ballot (and told it
    how many O-instances name it): it orders nothing (the leader, told of no O-instance
    there, may put a new command at that index, which must not run ahead of commands ready
    before it), and the leader hears of the higher ballot."""
    cluster = _warm(3)
    sequencer = cluster.node(0)
    view = sequencer.inspect.view
    end = sequencer.inspect.log_end
    count = sequencer.inspect.o_count(1, end)
    retake = next_ballot(1, 1)
    sequencer.step(CPrepare(1, view, 1, count, retake))
    cluster.process(0)
    promise = next(m for _, _, m in cluster.drop(lambda s, t, m: isinstance(m, CPromise)))
    assert isinstance(promise, CPromise) and promise.ordered == count
    sequencer.step(CRequest(1, view, 1, count + 2, 1))  # the old life's, at ballot 1
    cluster.process(0)
    assert sequencer.inspect.log_end == end, "nothing ordered"
    nacks = cluster.drop(lambda s, t, m: isinstance(m, CNack))
    assert [(t, m.promised) for _, t, m in nacks if isinstance(m, CNack)] == [(1, retake)]
    sequencer.step(CRequest(1, view, 1, count, retake))  # the new life's
    cluster.process(0)
    assert sequencer.inspect.o_count(1, sequencer.inspect.log_end) == count + 1
