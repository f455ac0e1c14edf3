"""A command leader taking its own space back (after another replica recovered part of it, or
after a restart): the round must see to the end of what acceptors hold before the leader
proposes or fills anything, commands known to have lost their index are proposed again
(those whose fate is unknown never are), and acceptors that truncated past the leader's
unfinished indexes neither stop the round nor the leader. Found by review; each scenario
stepped by hand with the stepper."""

from __future__ import annotations

import dataclasses

from consensus.messages import CAccept
from consensus.prng import Prng
from consensus.replica import Replica
from tests.consensus.stepper import Stepper


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
