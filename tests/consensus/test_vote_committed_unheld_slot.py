"""A replica that learns an O-slot committed without ever accepting it (an O-commit or a
catch-up for a slot the thrifty sequencer never sent it) holds the slot with no view (-1). Its
vote reported that -1 as the entry's view, and the codec takes an entry's view for a
non-negative field: the candidate dropped the whole frame as invalid, every time the vote was
sent. With 7 replicas, three of them rejoining after lost disks (they may not vote), the
other four must all vote: the election never completed and the cluster stalled (simulator
seed 9107, once leaders committed their slots sooner and announced them to replicas that did
not hold them). The vote now reports such a slot in view 0: a committed entry wins a rebuild
whatever its view."""

from __future__ import annotations

from consensus.codec import decode_messages, encode_messages
from consensus.messages import OCommit, Vote, VoteRequest
from tests.consensus.stepper import Stepper

ROUNDS_WARM = 20


def test_a_vote_reporting_a_slot_known_only_as_committed_crosses_the_wire() -> None:
    cluster = Stepper(3)
    for _ in range(ROUNDS_WARM):
        cluster.round()
    voter = cluster.node(2)
    slot = voter.inspect.log_end  # not held here: the O-commit is all it hears of it
    voter.step(OCommit(1, 0, (slot,), (1,)))
    assert voter.inspect.committed_o(slot) == 1
    voter.pass_ticks(cluster.configs[2].lease_ticks)  # the lease it granted 0 ran out
    voter.step(VoteRequest(1, 1, 0))
    cluster.process(2)
    votes = [message for source, target, message in cluster.queue
             if source == 2 and target == 1 and isinstance(message, Vote)]
    assert len(votes) == 1, cluster.queue
    (decoded,) = decode_messages(encode_messages([votes[0]]))
    assert isinstance(decoded, Vote)
    assert any(entry.index == slot and entry.committed and entry.value == 1
               for entry in decoded.entries), decoded.entries


def test_the_candidate_counts_that_vote() -> None:
    cluster = Stepper(3)
    for _ in range(ROUNDS_WARM):
        cluster.round()
    voter, candidate = cluster.node(2), cluster.node(1)
    slot = voter.inspect.log_end
    voter.step(OCommit(1, 0, (slot,), (1,)))
    candidate.step(OCommit(0, 0, (slot,), (1,)))
    voter.pass_ticks(cluster.configs[2].lease_ticks)  # the lease it granted 0 ran out
    voter.step(VoteRequest(1, 1, 0))
    cluster.process(2)
    frames = [encode_messages([message]) for source, target, message in cluster.queue
              if source == 2 and target == 1 and isinstance(message, Vote)]
    assert frames
    for frame in frames:
        candidate.receive(frame, sender=2)
    counters = dict(candidate.status().counters)
    assert counters.get("dropped.invalid_frame", 0) == 0, counters
