"""Multi-Paxos baseline: the executor's dedup window (`dedup_window_per_origin`) assumes one
origin's tags run in tag order. When the window evicts its lowest tag it sets `dedup_low` past
it, so every tag below counts as executed, including a tag that never ran: a command whose
Forward was lost, and which its origin forwards again after 4 resend periods, is then dropped
by every executor as a repeat. It never runs, its origin forwards it again for ever (a
C-instance and an O-slot at the sequencer each time), and its client is never told anything
until its deadline. It must run, or at least the forwarding must stop (the client's wait ends,
outcome unknown, and a retry in the same session runs it once)."""

from __future__ import annotations

from consensus.catchup import state_digest
from consensus.config import Mode, ReplicaConfig
from consensus.messages import CAccept, CCommit, Command, Forward, SnapshotChunk
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


def test_a_peers_snapshot_reports_covered_only_the_forwarded_commands_its_window_ran() -> None:
    """Replica 1's Forward of x (tag 0) is lost; cut off from what its peers send, 1 forwards
    w1, w2, w3 (tags 1 to 3), which run at 0 and 2, and the window (2 tags) evicts tag 1:
    every tag below 2 now counts as a repeat there, x's included, though x never ran. 1 then
    installs 0's snapshot. Its forwarded x had been reported `covered` (taken effect in the
    snapshot, its result not here) because its tag is below the snapshot's window: a client
    told its command took effect when it never ran (the simulator answers a covered put ok).
    Only the tags inside the window are known to have run; below it (x, and w1, which ran)
    the outcome is unknown, and nothing is forwarded again (every executor drops it)."""
    cluster = _multipaxos(3, window=2)
    assert cluster.node(0).inspect.is_sequencer
    origin = cluster.node(1)
    x_tag = origin.propose(b"x")
    cluster.process(1)
    assert cluster.drop(lambda s, t, m: s == 1 and isinstance(m, Forward))
    cluster.blocked = {(0, 1), (2, 1)}  # 1 hears nothing: it executes nothing of this
    tags = []
    for text in (b"w1", b"w2", b"w3"):
        tags.append(origin.propose(text))
        cluster.process(1)
        for _ in range(60):  # thrifty: 0's C-accept goes to 1 first, and is sent again later
            cluster.tick([0, 2])
            cluster.process_all()
            cluster.deliver()
            cluster.process_all()
    ran = [batch for _, batch in cluster.executed[0]]
    assert [any(text in batch for batch in ran) for text in ("w1", "w2", "w3", "x")] == [
        True, True, True, False], ran
    server = cluster.node(0)
    server.compact(b"state", server.executed_slots)
    snapshot = server._catchup.snapshot
    assert snapshot is not None and snapshot.meta.dedup_low[1] == tags[1]
    origin.step(SnapshotChunk(0, 0, snapshot.meta, 0, len(snapshot.state),
                              state_digest(snapshot.state), snapshot.state))
    ready = origin.ready()
    assert ready.snapshot_to_install is not None
    assert x_tag not in ready.covered, ready.covered
    assert ready.covered == tags[1:], ready.covered  # the window's tags: known to have run
    assert not origin._leader._forwarded  # x among them: it would be dropped for ever


def test_a_peers_snapshot_does_not_report_covered_a_committed_command_it_dropped() -> None:
    """Replica 1's Forward of x (tag 0) is lost; w1, w2, w3 (tags 1 to 3) run everywhere and
    the window (2 tags) evicts tag 1. 1 forwards x again; sequencer 0 proposes it and the
    C-instance commits at 1 too, but nothing else reaches 1, which cannot execute it. 0 runs
    the slot and drops x as a repeat (its tag is below the window): x never ran. 1 then
    installs 0's snapshot: x, committed at 1 and inside the snapshot's prefix, had been
    reported `covered` (taken effect); its outcome is unknown."""
    cluster = _multipaxos(3, window=2)
    assert cluster.node(0).inspect.is_sequencer
    origin, server = cluster.node(1), cluster.node(0)
    x_tag = origin.propose(b"x")
    cluster.process(1)
    assert cluster.drop(lambda s, t, m: s == 1 and isinstance(m, Forward))
    for text in (b"w1", b"w2", b"w3"):
        origin.propose(text)
        for _ in range(6):
            cluster.round()

    def lost(source: int, target: int, message: object) -> bool:
        return target == 1 and not isinstance(message, CAccept | CCommit)

    forwarded_again = False
    for _ in range(300):
        cluster.tick()
        cluster.process_all()
        forwarded_again = forwarded_again or any(
            s == 1 and isinstance(m, Forward) for s, t, m in cluster.queue)
        if forwarded_again:
            cluster.drop(lost)
        cluster.deliver()
        cluster.process_all()
        if dict(server.status().counters).get("executor.duplicate_dropped"):
            break
    for _ in range(5):  # the C-commit on its way to 1
        cluster.tick()
        cluster.process_all()
        cluster.drop(lost)
        cluster.deliver()
        cluster.process_all()
    index = origin.inspect.exec_count(0)
    assert origin.inspect.committed_c(0, index) == (Command(1, x_tag, b"x"),)
    assert not any("x" in batch for _, batch in cluster.executed[0])
    server.compact(b"state", server.executed_slots)
    snapshot = server._catchup.snapshot
    assert snapshot is not None and snapshot.meta.exec_counts[0] > index
    origin.step(SnapshotChunk(0, 0, snapshot.meta, 0, len(snapshot.state),
                              state_digest(snapshot.state), snapshot.state))
    ready = origin.ready()
    assert ready.snapshot_to_install is not None
    assert x_tag not in ready.covered, ready.covered
    assert not origin._leader._forwarded
