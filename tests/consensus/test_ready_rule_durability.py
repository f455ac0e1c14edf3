"""The 5-replica ready rule holds a command back until the sequencer's acceptance of its slot
is on disk: the sequencer's O-accepts leave before its own sync, and a leader that accepted
one (durably) and committed its C-instance must not report ready while nothing vouches for
the sequencer's vote (it may crash before its sync, and a new view may give the slot away)."""

from __future__ import annotations

from consensus.messages import OAccept
from tests.consensus.stepper import Stepper


def test_five_replicas_no_ready_while_the_sequencer_holds_the_slot_only_in_memory() -> None:
    """The sequencer's O-accept leaves before its sync; the leader accepts it
    durably and its C-instance commits, but the sequencer never persists the slot (it
    crashes). The leader must not report ready: nothing vouches for the sequencer's vote."""
    cluster = Stepper(5)
    for _ in range(20):
        cluster.round()
    seq = cluster.node(0)
    assert seq.inspect.is_sequencer
    cluster.node(4).propose(b"a")
    cluster.process(4)
    to_seq = cluster.drop(lambda s, t, m: t == 0)
    cluster.deliver()
    for _, _, message in to_seq:
        seq.step(message)
    ready = seq.ready()  # drained, never persisted, never advanced
    early = [(0, t, m) for t, m in ready.messages]
    assert any(isinstance(m, OAccept) and t == 4 for _, t, m in early), ready.messages
    cluster.queue.extend(early)
    cluster.replicas[0] = None  # crashed before the sync
    for _ in range(30):  # 4 resends its C-accept to every peer; 1, 2, 3 accept it
        cluster.round()
    assert cluster.node(4).inspect.committed_c(4, 0) is not None
    assert cluster.node(4).inspect.o_value(0) == 4  # accepted, durably, at 4
    assert cluster.readied[4] == [], cluster.readied[4]
