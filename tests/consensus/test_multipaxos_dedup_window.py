"""Multi-Paxos baseline: the executor's dedup window (`dedup_window_per_origin`) assumes one
origin's tags run in tag order. When the window evicts its lowest tag it sets `dedup_low` past
it, so every tag below counts as executed, including a tag that never ran: a command whose
Forward was lost, and which its origin forwards again after 4 resend periods, is then dropped
by every executor as a repeat. It never runs, its origin forwards it again for ever (a
C-instance and an O-slot at the sequencer each time), and its client is never told anything
until its deadline. It must run, or at least the forwarding must stop (the client's wait ends,
outcome unknown, and a retry in the same session runs it once)."""

from __future__ import annotations

from consensus.config import Mode, ReplicaConfig
from consensus.messages import Forward
from consensus.prng import Prng
from consensus.ready import Ready
from consensus.replica import Replica
from tests.consensus.stepper import Stepper


def _multipaxos(replicas: int, window: int) -> Stepper:
    cluster = Stepper(replicas)
    for replica in range(replicas):
        cluster.configs[replica] = ReplicaConfig(replica_id=replica, replica_count=replicas,
                                                 mode=Mode.MULTIPAXOS,
                                                 dedup_window_per_origin=window)
        cluster.replicas[replica] = Replica(cluster.configs[replica], Prng(replica))
    for _ in range(20):
        cluster.round()
    return cluster


def test_a_command_whose_forward_was_lost_still_runs_once_later_tags_fill_the_window() -> None:
    cluster = _multipaxos(3, window=2)
    assert cluster.node(0).inspect.is_sequencer
    origin = cluster.node(1)
    covered: list[int] = []
    ready = origin.ready

    def ready_noting_covered() -> Ready:
        result = ready()
        covered.extend(result.covered)
        return result

    origin.ready = ready_noting_covered  # type: ignore[method-assign]
    x_tag = origin.propose(b"x")  # tag 0
    cluster.process(1)
    lost = cluster.drop(lambda s, t, m: s == 1 and isinstance(m, Forward))
    assert lost
    for text in (b"w1", b"w2", b"w3"):  # tags 1, 2, 3: they run; the window evicts tag 1
        cluster.node(1).propose(text)
        for _ in range(6):
            cluster.round()
    forwards = 0
    for _ in range(1200):  # x is forwarded again after 4 resend periods
        cluster.tick()
        cluster.process_all()
        forwards += sum(1 for s, t, m in cluster.queue if s == 1 and isinstance(m, Forward))
        cluster.deliver()
        cluster.process_all()
    ran = [batch for _, batch in cluster.executed[2]]
    dropped = dict(cluster.node(2).status().counters).get("executor.duplicate_dropped", 0)
    if not any("x" in batch for batch in ran):
        # x never ran: it must not be reported as taken effect (`covered`), and its origin
        # must stop forwarding it (its client's wait ends, outcome unknown, and a retry in
        # the same session runs it once)
        assert x_tag not in covered, covered
        assert x_tag not in origin._leader._forwarded, (ran, dropped, forwards)
    assert forwards <= 2, (forwards, dropped)
