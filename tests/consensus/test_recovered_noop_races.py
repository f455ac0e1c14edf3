"""Recovery racing a leader. A recovered no-op learned without its round's promise: a replica that
learns a chosen value by a commit or a catch-up, never having promised the recovering round's
ballot, must refuse a late accept of an older round (the cut-off leader's resend) rather than
meet a second value for a chosen instance and stop on the C-agreement assert. Found by review;
each scenario stepped by hand with the stepper. And a leader's commit whose own slot a
recoverer re-accepted meanwhile must still replay after a restart."""

from __future__ import annotations

from consensus.messages import NOOP, CAccept, CAck, CCommit, CPrepare
from tests.consensus.stepper import Stepper


def _warm(replicas: int) -> Stepper:
    cluster = Stepper(replicas)
    for _ in range(20):
        cluster.round()
    return cluster


def test_a_resent_accept_never_meets_a_peer_that_learned_a_recovered_noop() -> None:
    """5 replicas. Leader 1 proposes "a" at index k; its C-accepts are lost (1's outbound
    links are down), so only 1's own acceptor holds "a". Replica 3 recovers (1, k): its
    promise quorum {3, 0, 2} holds nothing there, so it decides a no-op. Replica 4 missed the
    prepare and the accept (a transient loss) but gets the commit. 1's links come back and
    its resend timer fires: the resend carries "a" at 1's round-0 ballot. Learning the commit
    made 4 promise the recovery's ballot, so it refuses the resend."""
    cluster = _warm(5)
    leader = cluster.node(1)
    k = leader.inspect.exec_count(1)
    leader.propose(b"a")
    cluster.process(1)
    lost = cluster.drop(lambda s, t, m: s == 1)  # 1's accepts (and any C-request) lost
    assert any(isinstance(m, CAccept) and m.space == 1 and m.index == k for _, _, m in lost)
    # Replica 3 recovers 1's space from k (as a replica stalled on (1, k) does).
    cluster.node(3)._recovery.start(1, k)
    cluster.process(3)
    # 4 and 1 miss the prepare and the accept of the round; 4 gets the commit later.
    for _ in range(6):
        cluster.drop(lambda s, t, m: t in (1, 4) and not isinstance(m, CCommit))
        cluster.deliver(lambda s, t, m: t not in (1, 4))
        cluster.process_all()
    assert cluster.node(3).inspect.committed_c(1, k) == NOOP
    cluster.deliver(lambda s, t, m: t == 4 and isinstance(m, CCommit) and m.space == 1)
    cluster.drop(lambda s, t, m: t == 1)
    assert cluster.node(4).inspect.committed_c(1, k) == NOOP
    # 1's resend timer fires.
    for _ in range(30):
        cluster.tick([1])
        cluster.process(1)
    resent = [m for s, t, m in cluster.queue
              if s == 1 and t == 4 and isinstance(m, CAccept) and m.index == k]
    assert resent, "1 resends its accept of (1, k)"
    cluster.deliver(lambda s, t, m: s == 1 and t == 4)  # had stopped replica 4 on the assert
    cluster.process(4)
    assert cluster.node(4).inspect.committed_c(1, k) == NOOP


def test_a_resend_after_a_partition_never_crashes_a_replica_that_caught_up_on_a_noop(
) -> None:
    """The same with no hand-made message: 5 replicas. Leader 1 proposes "a" at (1, k); its
    C-accepts to its two nearest peers are lost, its C-request reaches the sequencer, which
    orders (1, k); then 1 is cut off both ways. Replica 4 is down meanwhile. The live
    replicas stall on (1, k); replica 2 recovers it with a no-op (quorum {0, 2, 3}: nobody
    there holds "a"). 4 restarts and catches up: it learns (1, k) = no-op from a fetch, so
    it never promised the recovery's ballot. The partition heals and 1's resend timer sends
    "a" to every peer that has not acknowledged it: 4 had accepted it at 1's round-0 ballot,
    found a different committed value and stopped on the C-agreement assert."""
    cluster = _warm(5)
    leader = cluster.node(1)
    k = leader.inspect.exec_count(1)
    sequencer = next(r for r in range(5) if cluster.node(r).inspect.is_sequencer)
    assert sequencer not in (1, 2, 3)  # 1's nearest peers are 2 and 3: it sends a C-request
    cluster.crash(4)
    leader.propose(b"a")
    cluster.process(1)
    cluster.drop(lambda s, t, m: s == 1 and isinstance(m, CAccept))  # lost on the way
    cluster.deliver(lambda s, t, m: s == 1)  # the C-request
    cut = {(1, other) for other in range(5) if other != 1}
    cluster.blocked |= cut | {(b, a) for a, b in cut}
    for _ in range(400):
        cluster.round()
        if cluster.node(2).inspect.committed_c(1, k) is not None:
            break
    assert cluster.node(2).inspect.committed_c(1, k) == NOOP, "2 recovered (1, k)"
    cluster.restart(4)
    for _ in range(100):
        cluster.round()
        if cluster.node(4).inspect.committed_c(1, k) is not None:
            break
    assert cluster.node(4).inspect.committed_c(1, k) == NOOP, "4 caught up"
    cluster.blocked -= cut | {(b, a) for a, b in cut}
    crashed = None
    try:
        for _ in range(100):
            cluster.round()
    except AssertionError as error:
        crashed = str(error)
    assert crashed is None, f"a replica stopped: {crashed}"


def test_a_leaders_commit_record_replays_though_its_own_slot_was_reaccepted_higher() -> None:
    """Leader 1 proposes a at (1,k) at round 0; 2 and 3 accept it. Before 3's ack arrives,
    replica 4 recovers (1,k): its quorum {4,0,2} reports a, so it proposes a at its ballot,
    and 1's own acceptor accepts that (slot now at 4's ballot). 3's ack completes 1's round-0
    majority {1,2,3}: 1 commits (1,k). Its record had been a short one (no batch), which
    after a restart met the slot at 4's ballot and was not replayed: the commit was lost."""
    cluster = _warm(5)
    leader = cluster.node(1)
    k = leader.inspect.exec_count(1)
    leader.propose(b"a")
    cluster.process(1)
    accepts = [(s, t, m) for s, t, m in cluster.queue if s == 1 and isinstance(m, CAccept)]
    assert {t for _, t, _ in accepts} == {2, 3}, accepts
    cluster.deliver(lambda s, t, m: s == 1 and isinstance(m, CAccept))
    cluster.process(2)
    cluster.process(3)
    ack3 = cluster.drop(lambda s, t, m: s == 3 and t == 1 and isinstance(m, CAck))
    assert ack3
    cluster.drop(lambda s, t, m: s == 1 or (t == 1 and not isinstance(m, CAck)))
    # 2's ack reaches 1 (1 now has {1, 2}); everything else from 1 is held back
    cluster.deliver(lambda s, t, m: t == 1)
    cluster.process(1)
    cluster.drop(lambda s, t, m: s == 1)
    cluster.node(4)._recovery.start(1, k)
    cluster.process(4)
    # prepare reaches 0, 2, 1 (not 3); promises back; accepts go to 1 (and 0, 2)
    cluster.drop(lambda s, t, m: t == 3)
    cluster.deliver(lambda s, t, m: s == 4)
    cluster.process_all()
    cluster.drop(lambda s, t, m: s == 1 and not (t == 4 and isinstance(m, CPrepare)))
    cluster.deliver(lambda s, t, m: t == 4)
    cluster.process(4)
    accepts4 = [m for s, t, m in cluster.queue if s == 4 and isinstance(m, CAccept)]
    assert accepts4 and accepts4[0].batch != NOOP
    cluster.deliver(lambda s, t, m: s == 4 and t == 1 and isinstance(m, CAccept))
    cluster.process(1)
    slot = leader._ctx.clog[1].get(k)
    assert slot is not None and slot.ballot == accepts4[0].ballot and not slot.committed
    cluster.queue = [item for item in cluster.queue if item[0] != 1]
    cluster.queue.extend(ack3)
    cluster.deliver(lambda s, t, m: s == 3 and t == 1)
    cluster.process(1)
    assert leader.inspect.committed_c(1, k) is not None, "1 committed (1,k) with 3's ack"
    cluster.crash(1)
    cluster.restart(1)
    replayed = cluster.node(1).inspect.committed_c(1, k)
    assert replayed is not None, "the commit 1 persisted was lost on replay"
    assert [command.payload for command in replayed] == [b"a"]
