"""A restarted leader never puts a new command at an index it may have sent before the crash
(the paper's invariant 7 across a view change). Leader m proposes x at (m, k); only acceptor A
accepts it (the C-request to the sequencer is lost) and m crashes before its own acceptance is
on disk. m restarts and retakes its space through a quorum without A. The sequencer fails; A
votes in the new view, whose sequencer orders (m, k) at slot s from A's accepted index
(`Sequencer.start_view`; at 5 replicas with m not voting, the rebuilt log). z is ordered at
s + 1 and becomes ready; then a client gives m a new command y. Before the index reservation,
m's next index was k (the sequencer's promise counted only (m, 0..k-1)): y ran at slot s,
before z, though z was answered before y was invoked. Now m's retake decides every index it
had reserved on disk (k among them: a no-op), and y goes past them."""

from __future__ import annotations

import pytest

from consensus.config import ReplicaConfig
from consensus.messages import CAccept, CRequest
from consensus.prng import Prng
from consensus.ready import Ready
from consensus.records import Record, ReserveRecord
from consensus.replica import Replica
from tests.consensus.stepper import Stepper


def _warm(replicas: int) -> Stepper:
    cluster = Stepper(replicas)
    for _ in range(20):
        cluster.round()
    return cluster


def _ran(cluster: Stepper, replica: int) -> list[str]:
    return [batch for _, batch in cluster.executed[replica]]


M, A, OLD = 1, 2, 0  # the leader that crashes, the one acceptor of x, the sequencer that fails


def _x_accepted_by_a_alone_then_m_restarted(replicas: int, *, upgraded: bool = False
                                            ) -> tuple[Stepper, Replica]:
    """m proposes x at (m, k); only A accepts it (the C-request to the sequencer is lost);
    m crashes before its own acceptance is on disk, restarts, and retakes its space through
    a quorum without A. The restarted m. `upgraded`: m's log was written by a build before
    the reservation (no ReserveRecord in it)."""
    cluster = _warm(replicas)
    leader = cluster.node(M)
    for text in (b"w0", b"w1"):
        leader.propose(text)
        for _ in range(5):
            cluster.round()
    durable = len(cluster.records[M])
    k = leader.inspect.exec_count(M)
    assert k == 2
    leader.propose(b"x")
    cluster.process(M)
    sent = cluster.drop(lambda s, t, msg: s == M)
    accepts = [msg for _, t, msg in sent if isinstance(msg, CAccept) and t == A]
    assert accepts, sent
    assert any(isinstance(msg, CRequest) and t == OLD for _, t, msg in sent)
    cluster.node(A).step(accepts[0])
    cluster.process(A)
    cluster.drop(lambda s, t, msg: t == M)
    cluster.crash(M)
    cluster.records[M] = [record for record in cluster.records[M][:durable]
                          if not (upgraded and isinstance(record, ReserveRecord))]
    cluster.restart(M)
    cluster.blocked |= {(M, A), (A, M)}  # m retakes its space through a quorum without A
    restarted = cluster.node(M)
    for _ in range(200):
        cluster.round()
        if not restarted._leader.retaking:
            break
    assert not restarted._leader.retaking
    assert cluster.node(A)._ctx.clog[M].get(k) is not None
    return cluster, restarted


def _elect(cluster: Stepper, new_sequencer: int) -> Replica:
    """Only `new_sequencer` stands (the others' randomized timeouts are the longer)."""
    candidate = cluster.node(new_sequencer)
    for other in cluster.live():
        if other != new_sequencer:
            cluster.node(other)._election._deadline = 10**9
    for _ in range(400):
        cluster.round()
        if candidate.inspect.is_sequencer and candidate.status().status == "normal":
            break
    assert candidate.inspect.is_sequencer and candidate.status().status == "normal"
    return candidate


def _ready(cluster: Stepper, replica: int, tag: int) -> None:
    for _ in range(100):
        if tag in cluster.readied[replica]:
            return
        cluster.round()
    assert tag in cluster.readied[replica], "z is ready"


def _z_ran_before_y_and_x_never(cluster: Stepper) -> None:
    for _ in range(400):
        cluster.round()
    for replica in cluster.live():
        ran = _ran(cluster, replica)
        assert "[z]" in ran and "[y]" in ran
        assert ran.index("[z]") < ran.index("[y]"), f"replica {replica}: {ran}"
        assert "[x]" not in ran


@pytest.mark.parametrize(("replicas", "new_sequencer", "upgraded"),
                         [(3, 1, False), (3, 2, False), (5, 1, False), (5, 2, False),
                          (5, 3, False), (3, 1, True), (5, 2, True)])
def test_a_command_proposed_after_a_ready_one_runs_after_it(replicas: int, new_sequencer: int,
                                                            upgraded: bool) -> None:
    """`upgraded`: m's log has no reservation (written before it existed): m reserves two
    Readys' worth of instances past its last index on disk at the restart."""
    cluster, restarted = _x_accepted_by_a_alone_then_m_restarted(replicas, upgraded=upgraded)
    cluster.crash(OLD)  # the new view has A vote
    cluster.blocked.clear()
    candidate = _elect(cluster, new_sequencer)
    s_slot = candidate.inspect.log_end - 1
    assert candidate.inspect.o_value(s_slot) == M, "the new view ordered (m, k)"
    _ready(cluster, A, cluster.node(A).propose(b"z"))  # z: ordered behind s
    assert not any("y" in batch for batch in _ran(cluster, M))
    restarted.propose(b"y")  # a new client command at m, invoked after z was answered
    _z_ran_before_y_and_x_never(cluster)


def test_a_non_voting_leader_behind_a_partition_does_not_reuse_its_index() -> None:
    """5 replicas: the same, but m is cut off during the view change and does not vote; the
    rebuilt log gives m a slot for (m, k) (Fig. 7's rule for a non-voter, from A's accepted
    index), z is ordered behind it and ready; m, still in the old view, then takes a client's
    y, and resends it once it hears the new view."""
    cluster, restarted = _x_accepted_by_a_alone_then_m_restarted(5)
    tag_z = cluster.node(3).propose(b"z")  # its C-accept reaches 4, not the dying sequencer
    cluster.process(3)
    cluster.drop(lambda s, t, msg: s == 3 and t in (OLD, M))
    cluster.crash(OLD)
    others = [replica for replica in cluster.live() if replica != M]
    cluster.blocked = {(M, other) for other in others} | {(other, M) for other in others}
    _elect(cluster, A)
    assert restarted.inspect.view == 0
    _ready(cluster, 3, tag_z)
    restarted.propose(b"y")  # invoked after z was answered
    for _ in range(3):
        cluster.round()
    cluster.blocked.clear()
    _z_ran_before_y_and_x_never(cluster)


def test_a_c_accept_leaves_only_once_the_reservation_of_its_index_is_on_disk() -> None:
    """The first proposal's reservation is in the same Ready as its acceptance: the peer's
    C-accept waits for that Ready's sync. The reservation runs ahead (renewed half way), so
    the next proposals' C-accepts leave at once, and a restart replays it."""
    config = ReplicaConfig(replica_id=1, replica_count=3, reserved_indexes=4)
    replica = Replica(config, Prng(1))
    records: list[Record] = []

    def accepts_sent(ready: Ready) -> tuple[list[int], list[int]]:
        records.extend(ready.records)
        return ([message.index for _, message in ready.messages
                 if isinstance(message, CAccept)],
                [message.index for _, message in ready.messages_after_persist
                 if isinstance(message, CAccept)])

    replica.propose(b"first")
    first = replica.ready()
    assert ReserveRecord(4) in first.records
    assert accepts_sent(first) == ([], [0])
    replica.advance()
    for index in (1, 2, 3):  # at 2, half way: renewed up to 6, ahead of need
        replica.propose(b"next")
        ready = replica.ready()
        assert accepts_sent(ready) == ([index], [])
        assert (ReserveRecord(6) in ready.records) == (index == 2)
        replica.advance()
    restarted = Replica.restore(config, Prng(2), records)
    assert restarted._leader.reserved_upto == 6
