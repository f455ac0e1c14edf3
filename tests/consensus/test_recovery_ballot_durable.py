"""A recoverer's ballot must be on its disk before its phase 2 leaves.

Paxos needs one value per ballot. A recoverer normally promises its own ballot (its CPrepare
to itself, persisted as a CPromiseRecord) before it counts to a majority, so a restart picks a
higher ballot. A replica that is not serving (AWAITING: it voted in a view whose rebuilt log it
has not had yet) drops its own CPrepare and C-accept, yet counted its peers' promises and sent
phase 2 at a ballot it never wrote down: after a crash it picks the very same ballot again, and
may propose another value with it.
"""

from __future__ import annotations

from consensus.config import ReplicaConfig
from consensus.context import Status
from consensus.messages import NO_INDEX, NOOP, CAccept, CPrepare, CPromise, VoteRequest
from consensus.prng import Prng
from consensus.records import CAcceptRecord, CPromiseRecord, Record
from consensus.replica import Replica


def drain(replica: Replica, records: list[Record]) -> list[object]:
    ready = replica.ready()
    records.extend(ready.records)
    replica.advance()
    return [message for _, message in ready.messages + ready.messages_after_persist]


def test_phase_2_never_leaves_at_a_ballot_not_on_disk() -> None:
    config = ReplicaConfig(replica_id=3, replica_count=5)
    replica = Replica(config, Prng(3))
    records: list[Record] = []
    replica.step(VoteRequest(1, 1, 0))  # votes for replica 1 in view 1: AWAITING its log
    drain(replica, records)
    assert replica._ctx.status is Status.AWAITING and replica._ctx.view == 1
    replica._recovery.start(0, 0)  # its execution stalled on C(0, 0): recover space 0
    prepares = [message for message in drain(replica, records) if isinstance(message, CPrepare)]
    assert prepares, "the round started"
    ballot = prepares[0].ballot
    for peer in (0, 1, 2):  # serving in view 1, they promise
        replica.step(CPromise(peer, 1, 0, 0, ballot, 0, (), NO_INDEX, NO_INDEX))
    sent = drain(replica, records)
    phase_2 = [message for message in sent if isinstance(message, CAccept)]
    on_disk = max([record.ballot for record in records
                   if isinstance(record, CPromiseRecord | CAcceptRecord) and record.space == 0],
                  default=-1)
    if phase_2:
        assert phase_2[0].batch == NOOP
        # What a crash now would leave: the restarted replica must not reuse the ballot.
        assert on_disk >= ballot, (
            f"C-accept at ballot {ballot} sent; the log holds ballot {on_disk} at most for "
            "space 0, so a restart may pick this ballot again")


def test_a_restarted_recoverer_does_not_pick_a_ballot_it_already_sent() -> None:
    """The consequence: restarted from what it persisted, the replica starts its next round
    at the ballot it had already sent C-accepts with."""
    config = ReplicaConfig(replica_id=3, replica_count=5)
    replica = Replica(config, Prng(3))
    records: list[Record] = []
    replica.step(VoteRequest(1, 1, 0))
    drain(replica, records)
    replica._recovery.start(0, 0)
    ballot = next(message for message in drain(replica, records)
                  if isinstance(message, CPrepare)).ballot
    for peer in (0, 1, 2):
        replica.step(CPromise(peer, 1, 0, 0, ballot, 0, (), NO_INDEX, NO_INDEX))
    sent_at = {message.ballot for message in drain(replica, records)
               if isinstance(message, CAccept)}
    restarted = Replica.restore(config, Prng(4), records)  # kill -9 here
    drain(restarted, [])
    restarted._recovery.start(0, 0)
    new = {message.ballot for message in drain(restarted, []) if isinstance(message, CPrepare)}
    assert not (sent_at and new & sent_at), f"ballot {sorted(new & sent_at)} used in two lives"
