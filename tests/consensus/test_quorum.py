"""Quorum arithmetic against brute force."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from consensus.config import ReplicaConfig
from consensus.messages import CRequest, OAccept
from consensus.prng import Prng
from consensus.quorum import is_majority, majority, majority_floor
from consensus.replica import Replica


@given(st.integers(1, 15))
def test_any_two_majorities_intersect(replica_count: int) -> None:
    replicas = range(replica_count)
    size = majority(replica_count)
    for first in itertools.combinations(replicas, size):
        for second in itertools.combinations(replicas, size):
            assert set(first) & set(second)
        break  # one side fixed is enough: all majorities are alike up to renaming


@given(st.integers(1, 15))
def test_majority_is_the_smallest_intersecting_size(replica_count: int) -> None:
    size = majority(replica_count)
    assert 2 * size > replica_count
    assert 2 * (size - 1) <= replica_count


@given(st.sets(st.integers(0, 8)), st.integers(1, 9))
def test_is_majority_matches_counting(members: set[int], replica_count: int) -> None:
    members = {member for member in members if member < replica_count}
    assert is_majority(members, replica_count) == (len(members) * 2 > replica_count)


@given(st.lists(st.integers(-1, 50), min_size=1, max_size=9))
def test_majority_floor_is_what_a_majority_reached(values: list[int]) -> None:
    floor = majority_floor(values)
    reached = [value for value in values if value >= floor]
    assert len(reached) * 2 > len(values)
    assert all(sum(value >= higher for value in values) * 2 <= len(values)
               for higher in range(floor + 1, max(values) + 2))


@given(st.sampled_from([3, 5, 7]))
def test_the_ready_rules_acknowledgement_counts(replica_count: int) -> None:
    """The paper's §2.2: the sequencer and the command leader alone are a majority only with
    3 replicas (one round trip); with 5 one more acceptor makes it (the 5-replica rule stands
    in for it); with 7, two more (1.5 round trips)."""
    sequencer_and_leader = {0, 1}
    assert is_majority(sequencer_and_leader, replica_count) == (replica_count == 3)
    more_needed = majority(replica_count) - len(sequencer_and_leader)
    assert more_needed == {3: 0, 5: 1, 7: 2}[replica_count]
    assert is_majority(sequencer_and_leader | set(range(2, 2 + more_needed)), replica_count)


@given(st.sampled_from([3, 5, 7]), st.lists(st.integers(0, 6), min_size=1, max_size=6))
def test_o_accepts_reach_a_majority_with_every_leader_they_name(
        replica_count: int, spaces: list[int]) -> None:
    """Thrifty O-accepts: the sequencer and the replicas a run goes to are a majority, and
    every command leader the run names is among them (it is the learner of its slots)."""
    sequencer = Replica(ReplicaConfig(replica_id=0, replica_count=replica_count), Prng(0))
    named = {space % replica_count for space in spaces}
    for space in sorted(named):
        if space == 0:
            sequencer.propose(b"own")  # the sequencer orders its own commands itself
        else:
            sequencer.step(CRequest(space, 0, space, 0, space))
    reached = {peer for peer, message in sequencer.ready().messages
               if isinstance(message, OAccept)}
    assert named - {0} <= reached
    assert is_majority(reached | {0}, replica_count)
