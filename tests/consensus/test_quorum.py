"""Quorum arithmetic against brute force."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from consensus.quorum import is_majority, majority, majority_floor


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
