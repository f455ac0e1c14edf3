"""A restarted leader decides the own proposals an earlier retake left undecided at a ballot
the restart does not resume. Found by a randomized stepper schedule (5 replicas): a retake
after a restart proposed no-ops over its reserved indexes, its accepts lost but its own
acceptance on disk; the round timed out and its successor's prepare was promised (on disk)
before the next crash. Restarted, the leader resumed only instances at the ballot it had
promised last (none), and started its retake at the next index, past the no-ops: nobody
decided them. Once ordered (the leader's next command asks for them; a view change orders
any index a voter accepted), every replica's execution waited on them, until another
replica recovered them (a recovery period each where its quorum missed the values; in the
randomized schedule 750 of them, every replica lagging and refusing to propose
meanwhile)."""

from __future__ import annotations

from consensus.messages import NOOP, CAccept
from tests.consensus.stepper import Stepper

LEADER = 1


def _warm() -> Stepper:
    cluster = Stepper(3)
    for _ in range(20):
        cluster.round()
    return cluster


def test_a_restarted_leader_decides_noops_an_earlier_retake_left_at_an_older_ballot() -> None:
    cluster = _warm()
    cluster.node(LEADER).propose(b"a")  # index 0; reserves indexes below 128
    for _ in range(10):
        cluster.round()
    assert cluster.node(0).inspect.exec_count(LEADER) == 1
    cluster.crash(LEADER)
    cluster.restart(LEADER)
    # The retake after the restart (ballot b1): its prepare and promises go through, its
    # no-ops over the reserved indexes are accepted by its own acceptor only.
    for _ in range(5):
        cluster.drop(lambda s, t, m: s == LEADER and isinstance(m, CAccept))
        cluster.deliver()
        cluster.process_all()
    node = cluster.node(LEADER)
    own = node._ctx.clog[LEADER]
    first, last = own.get(1), own.get(127)
    assert first is not None and last is not None
    b1 = first.ballot
    assert not first.committed and last.ballot == b1
    # b1's round times out; the next round's prepare is promised here, then a crash.
    config = node.config
    for _ in range(config.recovery_ticks * 3):
        cluster.tick([LEADER])
        cluster.process(LEADER)
        if cluster.node(LEADER)._ctx.clog[LEADER].promised > b1:
            break
    assert cluster.node(LEADER)._ctx.clog[LEADER].promised > b1
    cluster.crash(LEADER)
    cluster.restart(LEADER)
    restarted = cluster.node(LEADER)
    for _ in range(10):
        cluster.round()
    restarted.propose(b"b")  # at 128: its order request orders 1..127 too
    # Fewer ticks than any other replica waits before it recovers a silent leader's index.
    for _ in range(config.repair_ticks + config.recovery_ticks // 2):
        cluster.round()
    for replica in range(3):
        inspect = cluster.node(replica).inspect
        assert [inspect.committed_c(LEADER, index) for index in (1, 127)] == [NOOP, NOOP], \
            f"replica {replica}: own no-ops left undecided"
        assert "[b]" in [batch for _, batch in cluster.executed[replica]], \
            f"replica {replica}: execution waits on (1, 1)"
