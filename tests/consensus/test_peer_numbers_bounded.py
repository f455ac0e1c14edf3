"""Slots, indexes and counts a peer's message names are claims: none may bound a loop or a list
beyond what this replica holds or the protocol can carry. (A message contradicting a value
chosen here still stops the replica at its agreement assert: no honest peer sends one, and
fail-stop is the safe answer to a protocol bug.) Each test here hangs or crashes without its
guard; hangs are cut by a bounded counter or an alarm.

An O-ack's range first: one 20-byte OAck naming [0, 2**62) had the learner loop over every slot
of that range, holding the replica's task for ever (with TLS a certified peer's bug; without
TLS anyone who reaches the peer port)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from consensus.codec import ITEMS_MAX, encode_messages
from consensus.config import ReplicaConfig
from consensus.learner import Learner
from consensus.messages import (
    OAck,
    OCommit,
    OEntry,
    Vote,
)
from consensus.prng import Prng
from consensus.replica import Replica
from consensus.view_change import rebuild_log

COUNTS_MAX = 10_000
FAR = 1 << 62


def _replica(replica_id: int = 0, count: int = 3) -> Replica:
    return Replica(ReplicaConfig(replica_id=replica_id, replica_count=count).validate(), Prng(1))


@contextmanager
def _within(seconds: float) -> Iterator[None]:
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s: a peer's number bounds the loop")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The learner's vote counts so far, in a one-item list; past COUNTS_MAX it raises (the
    learner loops over a peer's claimed range)."""
    counted = [0]
    count = Learner._count

    def bounded(self: Learner, slot: int, voter: int) -> None:
        counted[0] += 1
        assert counted[0] <= COUNTS_MAX, "the learner loops over a peer's whole claimed range"
        count(self, slot, voter)

    monkeypatch.setattr(Learner, "_count", bounded)
    return counted


def test_an_ack_of_a_huge_range_counts_only_the_slots_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    replica = _replica()
    ctx = replica._ctx
    sender = next(peer for peer in (1, 2) if peer != ctx.sequencer)
    counted = _counted(monkeypatch)
    replica.receive(encode_messages([OAck(sender, ctx.view, 0, FAR)]), sender)
    assert counted[0] <= max(ctx.olog.end, 1)


def test_an_ack_over_a_log_a_far_commit_stretched_counts_only_the_slots_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    replica = _replica()
    ctx = replica._ctx
    sender = next(peer for peer in (1, 2) if peer != ctx.sequencer)
    counted = _counted(monkeypatch)
    replica.receive(encode_messages([OCommit(sender, ctx.view, (FAR,), (1,))]), sender)
    assert ctx.olog.end == FAR + 1  # a commit is a fact from any view: held
    replica.receive(encode_messages([OAck(sender, ctx.view, 0, FAR)]), sender)
    sequencer = ctx.sequencer
    if sequencer != ctx.id:
        replica.receive(encode_messages([OAck(sequencer, ctx.view, 0, FAR)]), sequencer)
    assert counted[0] <= len(ctx.olog.slots) * 2


def _vote(sender: int, entries: tuple[OEntry, ...], c_max_index: tuple[int, ...],
          from_index: int = 0) -> Vote:
    return Vote(sender, 1, from_index, 0, entries, c_max_index, 0, 0)


def test_a_rebuild_longer_than_a_new_view_can_carry_is_refused() -> None:
    votes = [_vote(0, (OEntry(ITEMS_MAX, 0, 0, False),), (-1,) * 3),
             _vote(1, (), (-1,) * 3)]
    assert rebuild_log(votes, 0, 3, (0,) * 3) is None


def test_a_vote_naming_a_far_slot_builds_no_list_of_holes() -> None:
    votes = [_vote(0, (OEntry(FAR, 0, 0, False),), (-1,) * 3), _vote(1, (), (-1,) * 3)]
    with _within(2.0):
        assert rebuild_log(votes, 0, 3, (0,) * 3) is None


def test_a_far_c_index_of_a_silent_replica_fills_no_endless_surplus() -> None:
    # 5 replicas, replica 4 silent: its surplus slots are filled up to the C-index voters hold.
    far = (-1, -1, -1, -1, FAR)
    votes = [_vote(sender, (), far) for sender in (0, 1, 2)]
    with _within(2.0):
        assert rebuild_log(votes, 0, 5, (0,) * 5) is None


def test_a_vote_with_another_from_index_is_refused() -> None:
    replica = _replica(replica_id=2)
    ctx = replica._ctx
    replica._election.start_candidacy()
    view = ctx.view
    for sender in (0, 1):
        replica.receive(encode_messages([Vote(sender, view, FAR, 0, (), (-1,) * 3, 0, 0)]),
                        sender)
    assert ctx.stats["election.vote_from_mismatch"] == 2


@pytest.mark.parametrize("count", [3, 5])
def test_honest_rebuilds_are_unchanged(count: int) -> None:
    entries = (OEntry(0, 1, 0, True), OEntry(1, 0, 0, False), OEntry(3, 2, 0, False))
    votes = [_vote(sender, entries, (5,) * count) for sender in range(count // 2 + 1)]
    assert rebuild_log(votes, 0, count, (0,) * count) is not None
