"""Guards for protocol rules that no other test and no simulator sweep pinned down: each test
here failed with one deliberate single-line bug (manual mutation testing) and passes without.

- an acceptor refuses a C-accept at any ballot below the one it promised, however close;
- a recoverer proposes, for an index nobody reports committed, the value of the highest ballot
  reported (Paxos phase 1), not the first one it reads;
- the sequencer counts its read lease as ending `lease_drift_ticks` before its followers'
  promise does, never after.
"""

from __future__ import annotations

from consensus.command_log import Space, next_ballot
from consensus.config import ReplicaConfig
from consensus.messages import (
    NO_INDEX,
    CAccept,
    CAck,
    CEntry,
    CNack,
    Command,
    CPrepare,
    CPromise,
)
from consensus.prng import Prng
from consensus.quorum import majority_floor
from consensus.records import Record
from consensus.replica import Replica
from tests.consensus.test_election_edges import warmed_up

OLD = (Command(0, 1, b"old"),)
NEW = (Command(0, 2, b"new"),)


def drain(replica: Replica) -> list[object]:
    records: list[Record] = []
    ready = replica.ready()
    records.extend(ready.records)
    replica.advance()
    return [message for _, message in ready.messages + ready.messages_after_persist]


def test_a_space_refuses_a_ballot_just_below_its_promise() -> None:
    space = Space(0)
    promised = next_ballot(0, 2)
    assert space.promise(promised)
    assert not space.accept(0, promised - 1, OLD), "accepted below the promised ballot"
    assert space.accept(0, promised, OLD)


def test_an_acceptor_nacks_the_owners_retake_below_a_recoverers_promise() -> None:
    """Replica 2 promised recoverer 1's ballot for space 0; the owner's retake at its own
    ballot of the same round (one lower) must be refused, or both could choose."""
    acceptor = Replica(ReplicaConfig(replica_id=2, replica_count=3), Prng(2))
    drain(acceptor)
    recoverer_ballot = next_ballot(0, 1)
    acceptor.step(CPrepare(1, 0, 0, 0, recoverer_ballot))
    drain(acceptor)
    acceptor.step(CAccept(0, 0, 0, 0, next_ballot(0, 0), OLD))
    sent = drain(acceptor)
    assert not any(isinstance(message, CAck) for message in sent), sent
    assert any(isinstance(message, CNack) for message in sent), sent


def test_a_recoverer_proposes_the_value_of_the_highest_ballot_reported() -> None:
    replica = Replica(ReplicaConfig(replica_id=3, replica_count=5), Prng(3))
    drain(replica)
    replica._recovery.start(0, 0)  # its execution stalled on C(0, 0)
    ballot = next(message for message in drain(replica) if isinstance(message, CPrepare)).ballot
    low, high = 0, next_ballot(0, 2)  # the owner's first ballot; a recoverer's, later
    assert high < ballot
    replica.step(CPromise(1, 0, 0, 0, ballot, 0, (CEntry(0, low, OLD, False),), 0, NO_INDEX))
    replica.step(CPromise(2, 0, 0, 0, ballot, 0, (CEntry(0, high, NEW, False),), 0, NO_INDEX))
    proposed = [message for message in drain(replica)
                if isinstance(message, CAccept) and message.index == 0]
    assert proposed, "the round did not reach phase 2"
    assert all(message.batch == NEW for message in proposed), proposed


def test_the_sequencers_lease_ends_a_drift_margin_before_its_followers_promise() -> None:
    cluster = warmed_up({})
    node = cluster.node(0)
    sequencer, config = node._sequencer, cluster.configs[0]
    assert sequencer.lease_valid()
    sent_at = sequencer._round_sent_at[majority_floor(sequencer._grants)]
    ends_at = sent_at + config.lease_ticks - config.lease_drift_ticks
    while node._ctx.now < ends_at - 1:  # nothing delivered: no grant renews the lease
        node.tick()
        cluster.process(0)
    assert sequencer.lease_valid()
    node.tick()
    assert node._ctx.now == ends_at
    assert not sequencer.lease_valid(), "the lease outlives the followers' margin"

