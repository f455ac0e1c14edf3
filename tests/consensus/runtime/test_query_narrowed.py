"""A query the gate narrows is run narrowed, by reads and by watches, on asyncio and on trio.

Goal: a node agent of a build before gang shares (28a4430) asks for a gang's whole status,
naming no node; a replica of that build refused it (REFUSED), and the agent's StoreLink
retried for ever, so during a rolling upgrade (replicas first, then agents) the old agents
could not learn whether a pod's gang still stood. The gang store's gate now hands back the
query as the agent may ask it, its own node's share, and the server runs that: the agent gets
exactly what a new agent gets by naming its node. Naming another node is still refused;
administrators and schedulers still get the whole gang.

Method: a lone replica over a machine holding a gang with a pod on n0 and one on n1 (n1's GPU
failed under it); clients on in-memory connections, each with its own principal. A watch runs
through the driver's real `local_read`; a lone replica serves no linearizable read, so the
driver's `submit_read` here answers at once from the machine, with the bytes it was given."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from consensus.codec import unpack
from consensus.envelope import Principal, Role
from consensus.runtime.client_codec import Code, Read, Response, Watch, encode_request
from consensus.runtime.driver import Done
from statemachine import Machine
from statemachine.queries import (
    ClusterQuery,
    EffectsQuery,
    GroupQuery,
    GroupsQuery,
    NodeQuery,
    NodesQuery,
    Query,
    StatsQuery,
)
from statemachine.query_codec import decode_query, encode_query, encode_typed_query
from tests.consensus.runtime.test_watch_budget import ADMIN, Connection, lone_driver, serving
from tests.statemachine.builders import SCHEDULER
from tests.statemachine.test_node_agent_scope import machine_of, two_node_gang

pytestmark = pytest.mark.anyio
N0 = Principal(Role.NODE, "n0")
WHOLE = encode_query("group", group="wide")  # as an agent before gang shares asks it
MINE = encode_query("group", group="wide", node="n0")  # as an agent of this build asks it
THEIRS = encode_query("group", group="wide", node="n1")


def answer_of(response: Response) -> dict[str, Any]:
    assert response.code is Code.OK, response.message
    plain: dict[str, Any] = unpack(response.payload, bytes_max=1 << 24, what="answer")
    return plain


async def watched(connection: Connection, query: bytes) -> Response:
    """`query` watched from slot -1: answered at once, through the driver's `local_read`."""
    await connection.to_server.send(encode_request(Watch(1, query, -1, 1000)))
    return await connection.answer()


async def test_a_watch_runs_the_query_the_gate_narrowed() -> None:
    machine = machine_of(two_node_gang())
    driver = lone_driver(machine)
    with anyio.fail_after(20):
        async with serving(driver, N0, ADMIN, SCHEDULER, admit_query=machine.admit_query) as (
                agent, admin, scheduler):
            old = answer_of(await watched(agent, WHOLE))
            new = answer_of(await watched(agent, MINE))
            refused = await watched(agent, THEIRS)
            wholes = [answer_of(await watched(client, WHOLE)) for client in (admin, scheduler)]
    assert old == new
    assert [pod["node"] for pod in old["pods"]] == ["n0"]
    assert old["failures"] == [] and old["victims"] == [] and old["doomed"] == {}
    assert refused.code is Code.REFUSED
    assert refused.message == "node:n0 may ask only about node 'n0': not GroupQuery for 'n1'"
    for whole in wholes:
        assert {pod["node"] for pod in whole["pods"]} == {"n0", "n1"}
        assert whole["failures"] == ["GPU-n1-3: failed: xid 79"]
    assert driver.metrics.counter("server.queries_refused") == 1
    assert driver.watch_bytes == 0


async def test_a_read_runs_the_query_the_gate_narrowed() -> None:
    machine = machine_of(two_node_gang())
    driver = lone_driver(machine)
    ran: list[bytes] = []

    def submit_read(query: bytes, timeout_s: float, done: Done) -> None:
        ran.append(query)
        done(machine.query(query), None)

    driver.submit_read = submit_read  # type: ignore[method-assign]
    with anyio.fail_after(20):
        async with serving(driver, N0, ADMIN, admit_query=machine.admit_query) as (
                agent, admin):
            answers = []
            for request_id, (client, query) in enumerate(
                    ((agent, WHOLE), (agent, MINE), (agent, THEIRS), (admin, WHOLE)), 1):
                await client.to_server.send(encode_request(Read(request_id, query, 1000)))
                answers.append(await client.answer())
    old, new, refused, whole = answers
    assert ran == [MINE, MINE, WHOLE]  # the agent's whole-gang query ran as its node's share
    assert answer_of(old) == answer_of(new)
    assert [pod["node"] for pod in answer_of(old)["pods"]] == ["n0"]
    assert refused.code is Code.REFUSED
    assert {pod["node"] for pod in answer_of(whole)["pods"]} == {"n0", "n1"}


def test_the_gate_hands_back_the_bytes_it_was_given_unless_it_narrows() -> None:
    """Only a node agent's whole-gang query is re-encoded; everything it admits otherwise
    runs as asked, byte for byte."""
    machine = Machine()
    assert machine.admit_query(N0, WHOLE) == MINE
    assert machine.admit_query(N0, MINE) is MINE
    assert machine.admit_query(ADMIN, WHOLE) is WHOLE
    assert machine.admit_query(ADMIN, THEIRS) is THEIRS
    effects = encode_query("effects", after=0, node="n0", limit=10)
    assert machine.admit_query(N0, effects) is effects


@pytest.mark.parametrize("query", [
    GroupQuery(group="wide"), GroupQuery(group="wide", node="n0"),
    GroupsQuery(vc="b", phase="", after="", limit=10), NodesQuery(after="n0", limit=5),
    NodeQuery(node="n0"), ClusterQuery(), StatsQuery(),
    EffectsQuery(after=3, node=None, limit=10), EffectsQuery(after=0, node="", limit=1),
], ids=repr)
def test_a_narrowed_query_is_encoded_as_it_decodes(query: Query) -> None:
    assert decode_query(encode_typed_query(query)) == query
