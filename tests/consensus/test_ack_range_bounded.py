"""An O-ack's range is a peer's claim: the learner counts its votes only over the slots its own
O-log holds. One 20-byte OAck naming [0, 2**62) had the learner loop over every slot of that
range, holding the replica's task for ever (with TLS a certified peer's bug; without TLS
anyone who reaches the peer port)."""

from __future__ import annotations

from consensus.codec import encode_messages
from consensus.config import ReplicaConfig
from consensus.learner import Learner
from consensus.messages import OAck
from consensus.prng import Prng
from consensus.replica import Replica

COUNTS_MAX = 10_000


def test_an_ack_of_a_huge_range_counts_only_the_slots_held(monkeypatch) -> None:
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3).validate(), Prng(1))
    ctx = replica._ctx
    sender = next(peer for peer in (1, 2) if peer != ctx.sequencer)
    counted = 0
    count = Learner._count

    def bounded(self: Learner, slot: int, voter: int) -> None:
        nonlocal counted
        counted += 1
        assert counted <= COUNTS_MAX, "the learner loops over a peer's whole claimed range"
        count(self, slot, voter)

    monkeypatch.setattr(Learner, "_count", bounded)
    replica.receive(encode_messages([OAck(sender, ctx.view, 0, 1 << 62)]), sender)
    assert counted <= max(ctx.olog.end, 1)
