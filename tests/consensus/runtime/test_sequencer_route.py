"""Finding the sequencer's replica for a client that prefers it: from the statuses replicas
give (malformed ones ignored), looked for at most once a LOOK_EVERY_S, trusted for RECHECK_S,
forgotten when the replica fails."""

from __future__ import annotations

from typing import Any

import pytest

from consensus.runtime.sequencer_route import (
    LOOK_EVERY_S,
    RECHECK_S,
    AskStatus,
    SequencerRoute,
)

pytestmark = pytest.mark.anyio
ENDPOINTS = ["a:1", "b:1", "c:1"]


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def serving(replica_id: int, sequencer: int) -> dict[str, Any]:
    """The status of a replica serving a view."""
    return {"replica_id": replica_id, "sequencer": sequencer, "status": "normal"}


def asker(statuses: dict[str, dict[str, Any] | None], asked: list[str]) -> AskStatus:
    async def ask(endpoint: str) -> dict[str, Any] | None:
        asked.append(endpoint)
        return statuses.get(endpoint)
    return ask


async def test_the_sequencer_is_found_from_what_replicas_say_of_themselves() -> None:
    clock, asked = Clock(), list[str]()
    route = SequencerRoute(ENDPOINTS)
    statuses = {"a:1": serving(0, 2),
                "b:1": None,  # no answer
                "c:1": serving(2, 2)}
    assert route.claim_look(clock())
    await route.look(asker(statuses, asked), clock)
    assert route.endpoint == "c:1" and asked == ENDPOINTS and not route.looking


async def test_one_claim_starts_one_look_whoever_asks_before_it_runs() -> None:
    """Every command asks before its try; only the first may start a look, even though the
    look's task has not run yet when the others ask."""
    clock, asked = Clock(), list[str]()
    route = SequencerRoute(ENDPOINTS)
    claims = [route.claim_look(clock()) for _ in range(100)]
    assert claims == [True] + [False] * 99
    await route.look(asker({"a:1": serving(0, 0)}, asked), clock)
    assert asked == ENDPOINTS and not route.claim_look(clock())


async def test_a_majority_naming_one_sequencer_ends_the_look_early() -> None:
    clock, asked = Clock(), list[str]()
    route = SequencerRoute(ENDPOINTS)
    await route.look(asker({"a:1": serving(0, 0), "b:1": serving(1, 0)}, asked), clock)
    assert route.endpoint == "a:1" and asked == ["a:1", "b:1"]


async def test_malformed_statuses_find_nothing() -> None:
    clock, asked = Clock(), list[str]()
    route = SequencerRoute(ENDPOINTS)
    statuses: dict[str, dict[str, Any] | None] = {
        "a:1": {"replica_id": "0", "sequencer": 0, "status": "normal"},
        "b:1": {"replica_id": 1, "sequencer": -1, "status": "normal"},
        "c:1": {"replica_id": True, "sequencer": True, "status": "normal"}}
    await route.look(asker(statuses, asked), clock)
    assert route.endpoint is None and asked == ENDPOINTS


async def test_a_replica_between_views_names_no_sequencer() -> None:
    clock, asked = Clock(), list[str]()
    route = SequencerRoute(ENDPOINTS)
    statuses: dict[str, dict[str, Any] | None] = {
        endpoint: {"replica_id": index, "sequencer": 0, "status": "awaiting"}
        for index, endpoint in enumerate(ENDPOINTS)}
    await route.look(asker(statuses, asked), clock)
    assert route.endpoint is None and asked == ENDPOINTS


async def test_looks_are_spaced_and_a_found_sequencer_is_rechecked() -> None:
    clock, asked = Clock(), list[str]()
    route = SequencerRoute(ENDPOINTS)
    await route.look(asker({}, asked), clock)  # nobody answers
    assert not route.claim_look(clock())
    clock.now_s += LOOK_EVERY_S
    assert route.claim_look(clock())
    assert not route.claim_look(clock())  # claimed: the look is under way
    await route.look(asker({"b:1": serving(1, 1)}, asked), clock)
    assert route.endpoint == "b:1"
    clock.now_s += LOOK_EVERY_S
    assert not route.claim_look(clock()) and route.endpoint == "b:1"
    clock.now_s += RECHECK_S
    assert route.claim_look(clock())  # a view may have changed ...
    assert route.endpoint == "b:1"  # ... but until the look says so, commands still go there
    await route.look(asker({"a:1": serving(0, 2), "c:1": serving(2, 2)}, asked), clock)
    assert route.endpoint == "c:1"


async def test_a_recheck_that_finds_no_sequencer_forgets_the_one_found_before() -> None:
    clock, asked = Clock(), list[str]()
    route = SequencerRoute(ENDPOINTS)
    await route.look(asker({"a:1": serving(0, 0)}, asked), clock)
    clock.now_s += RECHECK_S
    assert route.claim_look(clock()) and route.endpoint == "a:1"
    await route.look(asker({}, asked), clock)  # nobody answers
    assert route.endpoint is None


async def test_a_failed_replica_is_forgotten_until_the_next_look() -> None:
    clock, asked = Clock(), list[str]()
    route = SequencerRoute(ENDPOINTS)
    await route.look(asker({"a:1": serving(0, 0)}, asked), clock)
    route.forget()
    assert route.endpoint is None and not route.claim_look(clock())
    clock.now_s += LOOK_EVERY_S
    assert route.claim_look(clock())
