"""Quorum arithmetic, kept in one place and tested against brute force.

A majority of N is N // 2 + 1: any two majorities share a replica, which is what every
"a voter has seen it" argument of the protocol rests on.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def majority(replica_count: int) -> int:
    assert replica_count >= 1, replica_count
    return replica_count // 2 + 1


def is_majority(members: Collection[int], replica_count: int) -> bool:
    return len(members) >= majority(replica_count)


def majority_floor(values: Sequence[int]) -> int:
    """The largest v such that a majority of `values` (one per replica) are >= v: what a
    majority has reached, e.g. the lease round a majority granted."""
    assert values, "no replicas"
    return sorted(values, reverse=True)[majority(len(values)) - 1]
