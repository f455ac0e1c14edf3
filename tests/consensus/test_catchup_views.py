"""Catching up across views: what a snapshot or a fetch reply from a peer (messages of no view)
does to a replica's roles. A sequencer replaced without hearing it, which learned the newer
view's slots that way, must leave its view before its heartbeat names them committed (its
followers would commit their own, unchosen, values there); a candidate that installs a
snapshot while it gathers votes counts its log from the snapshot's end; in the Multi-Paxos
baseline, a forwarded command a snapshot ran is forgotten, not forwarded for ever."""

from __future__ import annotations

import pytest

from consensus.catchup import state_digest
from consensus.config import Mode, ReplicaConfig
from consensus.messages import (
    NO_CL,
    CAccept,
    CCommit,
    FetchReply,
    Forward,
    Heartbeat,
    NewView,
    SnapshotChunk,
    SnapshotMeta,
)
from consensus.prng import Prng
from consensus.replica import Replica
from tests.consensus.stepper import Stepper


def _warm(replicas: int) -> Stepper:
    cluster = Stepper(replicas)
    for _ in range(20):
        cluster.round()
    return cluster


@pytest.mark.parametrize("via", ["snapshot", "fetch"])
@pytest.mark.parametrize("past", [1, 5])  # the snapshot ends at / past the sequencer's log
def test_a_deposed_sequencers_heartbeat_does_not_commit_its_views_unchosen_values(
        past: int, via: str) -> None:
    """5 replicas. Sequencer 0 and follower 1 are cut off from 2, 3, 4, which elect view 2
    and go on; slot j, accepted in view 0 by 0 and 1 only (never chosen), is NO_CL in view 2.
    Sequencer 0, stalled on slot j, fetches from 2 and installs 2's snapshot (a
    view-independent message: 0 stays sequencer of view 0). Its next heartbeat names the
    snapshot's slot as view 0's commit prefix, and follower 1 commits slot j with view 0's
    value, which view 2 did not choose."""
    cluster = _warm(5)
    sequencer, follower = cluster.node(0), cluster.node(1)
    assert sequencer.inspect.is_sequencer and sequencer.inspect.view == 0
    cluster.blocked = {(a, b) for a in (0, 1) for b in (2, 3, 4)} | \
        {(b, a) for a in (0, 1) for b in (2, 3, 4)}
    j = sequencer.inspect.log_end
    follower.propose(b"x")
    for _ in range(3):
        cluster.process_all()
        cluster.deliver()
    assert sequencer.inspect.o_value(j) == 1 and follower.inspect.o_value(j) == 1
    assert follower.inspect.committed_o(j) is None, "2 of 5 accepted: not chosen"
    # View 2's snapshot: everything up to j as before, NO_CL from j on (1 did not vote and
    # no voter accepted its command, so the rebuild left j a hole).
    counts = tuple(cluster.node(2).inspect.o_count(space, j) for space in range(5))
    meta = SnapshotMeta(slot=j + past, exec_counts=counts, o_counts=counts,
                        dedup_low=(0,) * 5, dedup_tags=((),) * 5)
    state = b"view-2 state"
    if via == "snapshot":
        sequencer.step(SnapshotChunk(2, 2, meta, 0, len(state), state_digest(state), state))
        cluster.process(0)
        assert sequencer.inspect.log_base == j + past
    else:  # the same facts through a fetch reply: view 2 committed NO_CL from j on
        sequencer.step(FetchReply(2, 2, j, (NO_CL,) * past, ()))
        cluster.process(0)
        assert sequencer.inspect.committed_o(j) == NO_CL
    cluster.queue.clear()
    for _ in range(50):  # until 0 heartbeats to 1
        cluster.tick([0])
        cluster.process(0)
        if any(isinstance(m, Heartbeat) and t == 1 for s, t, m in cluster.queue):
            break
    cluster.deliver(lambda s, t, m: isinstance(m, Heartbeat) and t == 1)
    cluster.process(1)
    assert follower.inspect.committed_o(j) in (None, NO_CL), (
        f"follower committed slot {j} to {follower.inspect.committed_o(j)} in view 0, "
        f"which view 2 chose NO_CL")


def _executed_everywhere(cluster: Stepper, replicas: list[int], slots: int) -> None:
    for _ in range(40):
        cluster.round()
        if all(cluster.node(r).executed_slots >= slots for r in replicas):
            return
    raise AssertionError("not executed")


def test_a_candidate_that_installs_a_snapshot_before_rebuilding_counts_its_log_right() -> None:
    """3 replicas. Replica 2, cut off while 0 and 1 ran c, d, e (slots k..k+2, all of 1's),
    stands for view 2 from its committed prefix k; before the votes are in it installs 0's
    snapshot (taken at k+3). `_rebuild` counts each replica's slots below `start` with
    `olog.count(replica, start)`, which past the truncation returns the snapshot's counts
    (below k+3), so the NewView's o_counts count 1's slots in [k, k+3) twice."""
    cluster = _warm(3)
    cluster.node(0).propose(b"a")
    _executed_everywhere(cluster, [0, 1, 2], 1)
    k = cluster.node(2).executed_slots
    cluster.blocked = {(a, 2) for a in (0, 1)} | {(2, a) for a in (0, 1)}
    for command in (b"c", b"d", b"e"):
        cluster.node(1).propose(command)
        cluster.round()
    _executed_everywhere(cluster, [0, 1], k + 3)
    server = cluster.node(0)
    cluster.process(0)
    server.compact(b"state-at-k+3", server.executed_slots)
    snapshot = server._catchup.snapshot  # white-box: the snapshot 0 serves to laggards
    assert snapshot is not None and snapshot.meta.slot > k
    truth = tuple(cluster.node(1).inspect.o_count(r, snapshot.meta.slot) for r in range(3))
    cluster.crash(0)
    for _ in range(2 * 40 + 5):  # replica 1's lease to 0 runs out; its pre-votes go nowhere
        cluster.tick([1])
        cluster.process(1)
        cluster.queue.clear()
    candidate = cluster.node(2)
    assert candidate.inspect.view == 0 and candidate._ctx.olog.commit_prefix == k
    candidate._election.start_candidacy()  # white-box: as its election timeout would
    cluster.process(2)
    state = snapshot.state
    candidate.step(SnapshotChunk(0, 0, snapshot.meta, 0, len(state), state_digest(state),
                                 state))
    cluster.process(2)
    assert candidate.inspect.log_base == snapshot.meta.slot
    cluster.blocked = set()
    for _ in range(4):
        cluster.deliver()
        cluster.process_all()
    new_views = [m for s, t, m in [*cluster.queue, (0, 0, candidate._election._new_view)]
                 if isinstance(m, NewView)]
    assert new_views, "no rebuild"
    new_view = new_views[-1]
    end = new_view.start + len(new_view.values)
    expected = tuple(truth[r] + sum(1 for slot in range(snapshot.meta.slot, end)
                                    if candidate.inspect.o_value(slot) == r)
                     for r in range(3))
    assert new_view.o_counts == expected, (new_view.start, new_view.values,
                                           new_view.o_counts, expected)


def test_a_forwarded_command_a_peers_snapshot_applied_is_not_forwarded_forever() -> None:
    """Multi-Paxos baseline. Replica 1 forwards x to sequencer 0, then is cut off while 0
    and 2 run x and 0 compacts; 1 installs 0's snapshot. x's tag stays in the leader's
    `_forwarded` (only `on_executed_own` clears it, and 1 never executes x: the snapshot did),
    so 1 forwards x again every 4 resend periods, for ever: the sequencer proposes it each
    time, and every replica's executor drops it as a repeat."""
    cluster = Stepper(3)
    for replica in range(3):
        cluster.configs[replica] = ReplicaConfig(replica_id=replica, replica_count=3,
                                                 mode=Mode.MULTIPAXOS)
        cluster.replicas[replica] = Replica(cluster.configs[replica], Prng(replica))
    for _ in range(20):
        cluster.round()
    cluster.node(1).propose(b"x")
    cluster.process(1)
    cluster.deliver(lambda s, t, m: s == 1 and isinstance(m, Forward))
    cluster.blocked = {(a, 1) for a in (0, 2)} | {(1, a) for a in (0, 2)}
    for _ in range(80):
        cluster.round()
    server = cluster.node(0)
    assert any("x" in batch for _, batch in cluster.executed[0])
    server.compact(b"state", server.executed_slots)
    snapshot = server._catchup.snapshot
    assert snapshot is not None
    follower = cluster.node(1)
    follower.step(SnapshotChunk(0, 0, snapshot.meta, 0, len(snapshot.state),
                                state_digest(snapshot.state), snapshot.state))
    cluster.process(1)
    assert follower.executed_slots == snapshot.meta.slot
    cluster.blocked = set()
    forwards = 0
    for _ in range(400):
        cluster.tick()
        cluster.process_all()
        forwards += sum(1 for s, t, m in cluster.queue if s == 1 and isinstance(m, Forward))
        cluster.deliver()
        cluster.process_all()
    dropped = dict(server.status().counters).get("executor.duplicate_dropped", 0)
    assert forwards <= 1 and dropped <= 1, (forwards, dropped, follower._leader._forwarded)


def test_a_sequencer_whose_execution_lags_is_not_deposed_by_its_own_views_snapshot() -> None:
    """A sequencer left its view on any peer's snapshot install. But when every slot the
    snapshot covers is already committed at the sequencer (its commit prefix reaches the
    snapshot's slot), no newer view can have chosen otherwise there: the install only supplies
    C-values its execution lacked (lost C-commits). Deposing then cost a view change (reads
    and proposals stall for an election) each time its execution fell behind a peer's
    compaction point."""
    cluster = Stepper(3)
    for _ in range(20):
        cluster.round()
    sequencer = cluster.node(0)
    assert sequencer.inspect.is_sequencer
    view = sequencer.status().view

    def lost(source: int, target: int, message: object) -> bool:
        return target == 0 and (isinstance(message, FetchReply) or (
            source == 1 and isinstance(message, CAccept | CCommit)))

    for text in (b"x", b"y", b"z"):
        cluster.node(1).propose(text)
    for _ in range(300):
        cluster.tick()
        cluster.process_all()
        cluster.drop(lost)
        cluster.deliver()
        cluster.process_all()
        if min(cluster.node(r).executed_slots for r in (1, 2)) >= 1 and \
                sequencer._ctx.olog.commit_prefix >= 1:
            break
    assert sequencer.executed_slots == 0  # it lacks leader 1's C-value
    for replica in (1, 2):
        node = cluster.node(replica)
        node.compact(b"state", node.executed_slots)
        cluster.process(replica)
    snapshot_slot = cluster.node(2)._ctx.olog.base
    assert 1 <= snapshot_slot <= sequencer._ctx.olog.commit_prefix  # nothing it did not know
    for _ in range(200):
        cluster.round()
        if sequencer.executed_slots >= 1:
            break
    assert sequencer._ctx.stats.get("catchup.snapshot_installed") == 1
    assert sequencer.status().view == view, "deposed by a snapshot of its own view"
