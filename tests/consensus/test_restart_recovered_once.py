"""A command of a leader that crashed is recovered by a peer (a no-op where the peer's quorum
did not see it, the command where it did) while the leader's own acceptance of it is on disk;
the restarted leader resumes the instance, retakes its space, and proposes again only what
lost its index. Either way the command runs exactly once, at one slot, on every replica."""

from __future__ import annotations

import pytest

from consensus.messages import CAccept
from tests.consensus.stepper import Stepper

M, A = 1, 2  # the leader that crashes; the peer that may hold its C-accept


@pytest.mark.parametrize("a_accepts", [False, True])
def test_a_resumed_command_recovered_by_a_peer_runs_once(a_accepts: bool) -> None:
    cluster = Stepper(3)
    for _ in range(20):
        cluster.round()
    leader = cluster.node(M)
    leader.propose(b"x")
    cluster.process(M)
    sent = cluster.drop(lambda s, t, msg: s == M and isinstance(msg, CAccept))
    if a_accepts:
        for _, target, message in sent:
            if target == A:
                cluster.node(A).step(message)
        cluster.process(A)
        cluster.drop(lambda s, t, msg: t == M)
    cluster.deliver()  # the C-request: the sequencer orders (M, 0)
    cluster.crash(M)
    for _ in range(600):  # the others stall on C(M, 0) and recover it
        cluster.round()
    cluster.restart(M)
    restarted = cluster.node(M)
    restarted.propose(b"y")
    for _ in range(600):
        cluster.round()
    runs = {replica: [batch for _, batch in cluster.executed[replica]] for replica in range(3)}
    for replica in range(3):
        ran = runs[replica]
        assert sum(batch.count("x") for batch in ran) <= 1, runs
        assert any("y" in batch for batch in ran), runs
    slots = {tuple(cluster.executed[r]) for r in (0, A)}
    assert len(slots) == 1, runs
    # x either ran everywhere once, or nowhere (its outcome is left unknown)
    counts = {sum(batch.count("x") for batch in runs[r]) for r in (0, A)}
    assert len(counts) == 1, runs
