"""Straggler detection must end with another sequencer, and only when a majority finds it
slow at once: once a majority suspects the sequencer and lets its lease run out, the election
they start must not hand the role straight back to it (it did: the sequencer, seeing a vote
request for a newer view, re-elected itself above it, as it does to keep a healthy view, and
the voters, no longer suspecting anyone once they had adopted the candidate's view, voted for
it); and suspicions heard far apart are no majority (they had counted however old)."""

from __future__ import annotations

from consensus.messages import Suspect
from tests.consensus.stepper import Stepper

ROUNDS_MAX = 1500


def test_a_sequencer_a_majority_suspects_is_not_re_elected() -> None:
    cluster = Stepper(3)
    for _ in range(20):
        cluster.round()
    assert cluster.node(0).inspect.is_sequencer
    for replica in (1, 2):  # white-box: each follower's own straggler window fired
        cluster.node(replica)._election._suspicions[replica] = 0  # heard at tick 0
    for sender, target in ((1, 2), (2, 1), (1, 0), (2, 0)):  # and they told each other
        cluster.node(target).step(Suspect(sender, 0))
    assert all(cluster.node(replica)._election._suspecting for replica in (1, 2))
    for _ in range(ROUNDS_MAX):
        cluster.round()
        serving = [replica for replica in cluster.live()
                   if cluster.node(replica).inspect.is_sequencer]
        if serving and cluster.node(serving[0]).inspect.view > 0:
            break
    else:
        raise AssertionError("no new view was established")
    views = {replica: cluster.node(replica).inspect.view for replica in cluster.live()}
    assert serving != [0], f"the suspected sequencer won again: views {views}"


def _replacing(cluster: Stepper) -> int:
    return sum(dict(cluster.node(replica).status().counters).get(
        "election.straggler_replacing", 0) for replica in cluster.live())


def test_suspicions_far_apart_make_no_majority() -> None:
    """A replica finding the sequencer slow says so again while it lasts; one slow patch
    long ago and another now are not a majority agreeing now."""
    cluster = Stepper(3)
    for _ in range(20):
        cluster.round()
    config = cluster.configs[1]
    fresh_ticks = 2 * config.straggler_rounds * config.straggler_window_ticks
    cluster.node(1)._election._suspicions[1] = 0  # replica 1's own window fired, at tick 0
    cluster.node(1).step(Suspect(2, 0))  # and replica 2 says so at once: a majority
    assert _replacing(cluster) == 1

    cluster = Stepper(3)
    for _ in range(20):
        cluster.round()
    cluster.node(1)._election._suspicions[1] = 0
    for _ in range(fresh_ticks + 1):
        cluster.round()
    cluster.node(1).step(Suspect(2, 0))  # replica 2's, heard too late to agree with it
    assert _replacing(cluster) == 0
    assert cluster.node(0).inspect.is_sequencer
