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


@given(st.lists(st.tuples(st.integers(0, 50), st.booleans()), max_size=60))
def test_earliest_open_is_the_first_deadline_of_an_item_still_open(
        items: list[tuple[int, bool]]) -> None:
    open_items = {number for number, (_, still_open) in enumerate(items) if still_open}
    heap: ExpiryHeap[int] = ExpiryHeap(open_items.__contains__)
    for number, (deadline, _) in enumerate(items):
        heap.push(float(deadline), number)
    first = min((float(deadline) for deadline, still_open in items if still_open),
                default=math.inf)
    assert heap.earliest_open() == first
    assert heap.earliest == first  # the ended entries before it are gone
    assert open_items <= set(heap.due(math.inf))  # no open item dropped
