"""Each replica takes its snapshots at boundaries of its own, shifted by its share of the
period, so that the replicas of a cluster do not all encode and write their state at once."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from consensus.runtime.driver import snapshot_due


def snapshot_slots(replica_id: int, replica_count: int, period: int, steps: list[int],
                   last: int = 0) -> list[int]:
    """The executed counts at which a replica snapshots, executing `steps` slots a Ready."""
    executed, taken = last, []
    for step in steps:
        executed += step
        if snapshot_due(executed, last, period, replica_id, replica_count):
            taken.append(executed)
            last = executed
    return taken


@given(period=st.integers(3, 500), replica_count=st.sampled_from([3, 5]),
       periods=st.integers(1, 6))
def test_one_slot_a_ready_snapshots_once_a_period_at_the_replicas_own_boundary(
        period: int, replica_count: int, periods: int) -> None:
    slots = {replica: snapshot_slots(replica, replica_count, period, [1] * (period * periods))
             for replica in range(replica_count)}
    for replica, taken in slots.items():
        shift = period * replica // replica_count
        assert taken == [slot for slot in range(1, period * periods + 1)
                         if (slot + shift) % period == 0]
    if period >= replica_count:  # every replica's boundary its own
        every = [slot for taken in slots.values() for slot in taken]
        assert len(every) == len(set(every))


@given(period=st.integers(2, 300), replica=st.integers(0, 4),
       steps=st.lists(st.integers(1, 700), max_size=40))
def test_at_most_one_snapshot_a_ready_and_one_for_each_boundary_passed(
        period: int, replica: int, steps: list[int]) -> None:
    taken = snapshot_slots(replica, 5, period, steps)
    shift = period * replica // 5
    assert len(taken) == len(set(taken))
    boundaries = (sum(steps) + shift) // period - shift // period
    assert len(taken) <= boundaries
    # Never two snapshots without a boundary between them, and none missed at the end
    assert all((later + shift) // period > (earlier + shift) // period
               for earlier, later in itertools.pairwise(taken))
    if boundaries:
        assert taken and (taken[-1] + shift) // period == (sum(steps) + shift) // period


def test_the_first_replica_keeps_the_plain_period() -> None:
    assert snapshot_slots(0, 3, 100, [1] * 300) == [100, 200, 300]
    assert snapshot_slots(1, 3, 100, [1] * 300) == [67, 167, 267]
    assert snapshot_slots(2, 3, 100, [1] * 300) == [34, 134, 234]


def test_a_restored_snapshot_keeps_the_replicas_own_boundaries() -> None:
    """After installing a peer's snapshot at slot 150, replica 1 still snapshots at its own
    boundaries (67 past each hundred), not 100 slots after the peer's."""
    assert snapshot_slots(1, 3, 100, [1] * 150, last=150) == [167, 267]
