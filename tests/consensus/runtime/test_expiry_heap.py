"""The expiry heap behind every deadline: in-order deadlines queue, earlier ones go to a heap,
and `due` takes exactly the passed ones from both, earliest first."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from consensus.runtime.deadlines import ExpiryHeap


@given(st.lists(st.integers(0, 50), max_size=60), st.integers(0, 50))
def test_due_takes_exactly_the_passed_deadlines_earliest_first(deadlines: list[int],
                                                               now: int) -> None:
    heap: ExpiryHeap[int] = ExpiryHeap(lambda item: True)
    for number, deadline in enumerate(deadlines):  # in order, out of order: queue and heap
        heap.push(float(deadline), number)
    found = heap.due(float(now))
    assert sorted(found) == [number for number, deadline in enumerate(deadlines)
                             if deadline <= now]
    assert [deadlines[number] for number in found] == sorted(
        deadline for deadline in deadlines if deadline <= now)
    assert len(heap) == len(deadlines) - len(found)
    assert heap.earliest == min((deadline for deadline in deadlines if deadline > now),
                                default=math.inf)
