"""A replica cut off from its peers in an old view still says it is serving, and names the
sequencer of that view: often itself, the sequencer that lost its peers. The route took the
first replica that named a sequencer it could place, so with that replica first it sent every
command there, each waiting out its try (the old sequencer commits nothing) before moving on,
and found it again a LOOK_EVERY_S later. The route takes the sequencer of the latest view
any replica serves."""

from __future__ import annotations

from typing import Any

import pytest

from consensus.runtime.sequencer_route import SequencerRoute
from tests.consensus.runtime.test_sequencer_route import ENDPOINTS, Clock, asker

pytestmark = pytest.mark.anyio


def serving(replica_id: int, sequencer: int, view: int) -> dict[str, Any]:
    return {"replica_id": replica_id, "sequencer": sequencer, "status": "normal", "view": view}


async def test_the_sequencer_of_the_latest_view_is_taken_over_a_stale_one() -> None:
    clock, asked = Clock(), list[str]()
    route = SequencerRoute(ENDPOINTS)
    statuses: dict[str, dict[str, Any] | None] = {
        "a:1": serving(0, 0, view=3),  # the old sequencer, cut off
        "b:1": serving(1, 1, view=4),
        "c:1": serving(2, 1, view=4)}
    await route.look(asker(statuses, asked), clock)
    assert route.endpoint == "b:1"


async def test_a_majority_naming_a_sequencer_not_yet_asked_asks_on_until_it_is_placed() -> None:
    """The first two replicas name the third as sequencer: its endpoint is known only once it
    answers, so the look asks it too rather than stopping at the majority and finding none."""
    clock, asked = Clock(), list[str]()
    route = SequencerRoute(ENDPOINTS)
    statuses: dict[str, dict[str, Any] | None] = {
        "a:1": serving(0, 2, view=4), "b:1": serving(1, 2, view=4),
        "c:1": serving(2, 2, view=4)}
    await route.look(asker(statuses, asked), clock)
    assert route.endpoint == "c:1"
    assert asked == ["a:1", "b:1", "c:1"]
