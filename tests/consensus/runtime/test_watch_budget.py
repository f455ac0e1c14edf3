"""The watches a replica holds while they wait, on asyncio and on trio.

Goal: watches, which may wait ten minutes, never take what commands and reads need, and no one
client identity takes every watch's place. A node agent's watches had counted against the
budget commands share, so a few dozen connections of valid watches (or one connection of
megabyte-sized junk, which the query gate let through) had every other client's commands
refused OVERLOADED for as long as they waited. Now watches have a budget of their own, each
principal a share of it (WATCHES_PER_PRINCIPAL_MAX watches, an eighth of the bytes), and a
watch of junk is refused at once (the gate: tests/statemachine/test_authorization.py).

Method: a lone replica (its peers absent: nothing commits), so watches wait until their time
is up; clients on in-memory connections, each with its own principal."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

from consensus.config import ReplicaConfig
from consensus.envelope import BODY_BYTES_MAX, Principal, Role
from consensus.prng import Prng
from consensus.replica import Replica
from consensus.runtime.client_codec import (
    TIMEOUT_MS_MAX,
    Code,
    Propose,
    Response,
    Watch,
    decode_response,
    encode_request,
)
from consensus.runtime.driver import PROPOSAL_BYTES_MAX, Driver, DriverConfig, Overloaded
from consensus.runtime.metrics import Metrics
from consensus.runtime.server import ClientServer
from consensus.runtime.watch_budget import (
    WATCH_BYTES_MAX,
    WATCHES_PER_PRINCIPAL_MAX,
    WatchBudget,
)
from consensus.state_machine import StateMachine
from statemachine import Machine
from statemachine.codec import encode_command
from statemachine.commands import Cordon
from statemachine.query_codec import encode_query
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.local import MemoryFrames, MemoryStore

pytestmark = pytest.mark.anyio
NODE_N1 = Principal(Role.NODE, "n1")
NODE_N2 = Principal(Role.NODE, "n2")
ADMIN = Principal(Role.ADMIN, "ops")
FOREVER = 1 << 40  # a slot a lone replica never reaches: the watch waits out its time


def lone_driver(machine: StateMachine, *, proposal_bytes_max: int = PROPOSAL_BYTES_MAX,
                watch_bytes_max: int = WATCH_BYTES_MAX) -> Driver:
    replica = Replica(ReplicaConfig(replica_id=1, replica_count=3), Prng(1))
    return Driver(replica, MemoryStore(), machine, lambda target, frame: True, Metrics(),
                  config=DriverConfig(tick_ms=5, proposal_bytes_max=proposal_bytes_max,
                                      watch_bytes_max=watch_bytes_max))


class Connection:
    """One client connection: requests in, answers out."""

    def __init__(self, to_server: anyio.abc.ObjectSendStream[bytes],
                 from_server: anyio.abc.ObjectReceiveStream[bytes]) -> None:
        self.to_server = to_server
        self.from_server = from_server

    async def watch(self, request_id: int, query: bytes, wait_ms: int = TIMEOUT_MS_MAX) -> None:
        await self.to_server.send(encode_request(Watch(request_id, query, FOREVER, wait_ms)))

    async def answer(self) -> Response:
        return decode_response(await self.from_server.receive())


@asynccontextmanager
async def serving(driver: Driver, *principals: Principal,
                  admit_query: Callable[[Principal, bytes], bytes] | None = None
                  ) -> AsyncIterator[list[Connection]]:
    """`driver` running, with a connection to its server for each of `principals`."""
    server = ClientServer(driver, admit_query=admit_query)
    connections = []
    async with anyio.create_task_group() as tasks:
        await tasks.start(driver.run)
        for principal in principals:
            to_server, from_client = anyio.create_memory_object_stream[bytes](100)
            to_client, from_server = anyio.create_memory_object_stream[bytes](100)
            tasks.start_soon(server.serve, principal, MemoryFrames(to_client, from_client))
            connections.append(Connection(to_server, from_server))
        yield connections
        tasks.cancel_scope.cancel()


async def settled(driver: Driver, watch_bytes: int) -> None:
    """Until the watches sent are all waiting (or answered)."""
    while driver.watch_bytes != watch_bytes:
        await anyio.sleep(0.01)


async def test_a_node_agents_watches_do_not_starve_the_administrators_commands() -> None:
    """The review's case: a node agent sends watches of junk a megabyte each, then of valid
    queries, all asking to wait ten minutes, on a replica whose command budget their bytes
    would fill. The junk is answered BAD_REQUEST at once; the valid ones wait in the watches'
    own budget; the administrator's command is taken (it waits for a commit that never
    comes here: UNKNOWN, not OVERLOADED)."""
    query = encode_query("effects", after=0, node="n1", limit=256)
    machine = Machine()
    driver = lone_driver(machine, proposal_bytes_max=WATCHES_PER_PRINCIPAL_MAX * len(query))
    with anyio.fail_after(20):
        async with serving(driver, NODE_N1, ADMIN, admit_query=machine.admit_query) as (
                agent, admin):
            for request_id in range(1, 5):
                await agent.watch(request_id, b"\xc0" * BODY_BYTES_MAX)
            assert [(await agent.answer()).code for _ in range(4)] == [Code.BAD_REQUEST] * 4
            for request_id in range(5, 5 + WATCHES_PER_PRINCIPAL_MAX):
                await agent.watch(request_id, query)
            await settled(driver, WATCHES_PER_PRINCIPAL_MAX * len(query))
            assert driver.proposal_bytes == 0
            await admin.to_server.send(encode_request(Propose(
                7, "ops", 1, encode_command(Cordon(node="n1")), 200)))
            answer = await admin.answer()
    assert answer.code is Code.UNKNOWN, answer.message


async def test_watches_fill_a_budget_of_their_own_and_commands_still_get_theirs() -> None:
    """Eight principals' watches fill the watches' budget (each its share of it): the next
    watch is refused, a command still takes the whole budget for commands, and once the
    watches are answered their bytes are free again."""
    query = b"q" * 10_000
    driver = lone_driver(SessionKv(), proposal_bytes_max=len(query) + 1000,
                         watch_bytes_max=8 * len(query))
    principals = [Principal(Role.NODE, f"n{number}") for number in range(9)]
    with anyio.fail_after(10):
        async with serving(driver, *principals) as connections:
            for connection in connections[:8]:
                await connection.watch(1, query, wait_ms=500)
            await settled(driver, 8 * len(query))
            await connections[8].watch(1, query, wait_ms=500)
            refused = await connections[8].answer()
            assert refused.code is Code.OVERLOADED
            assert "bytes of waiting watches" in refused.message
            assert driver.proposal_bytes == 0
            answers: list[str] = []
            driver.submit(query, 0.0, lambda reply, error: answers.append(type(error).__name__))
            await anyio.sleep(0.05)
            assert answers == ["OutcomeUnknown"]  # taken (and left in the core), not refused
            assert [(await connection.answer()).code for connection in connections[:8]] == [
                Code.OK] * 8
            assert driver.watch_bytes == 0
    assert driver.metrics.counter("driver.watches_refused_bytes") == 1


async def test_one_principal_cannot_take_every_watchs_place() -> None:
    """A principal with WATCHES_PER_PRINCIPAL_MAX watches waiting is refused one more, and
    one whose watches hold its share of the bytes (an eighth) is refused a larger one, while
    another principal's watch is still taken; the places come back as the watches end."""
    small, large = b"q", b"q" * 20_000
    driver = lone_driver(SessionKv(), watch_bytes_max=8 * 20_000)
    with anyio.fail_after(10):
        async with serving(driver, NODE_N1, NODE_N2) as (greedy, other):
            for request_id in range(1, WATCHES_PER_PRINCIPAL_MAX + 1):
                await greedy.watch(request_id, small, wait_ms=300)
            await settled(driver, WATCHES_PER_PRINCIPAL_MAX)
            await greedy.watch(100, small)
            refused = await greedy.answer()
            assert (refused.request_id, refused.code) == (100, Code.OVERLOADED)
            assert f"{NODE_N1} has {WATCHES_PER_PRINCIPAL_MAX} watches waiting" in \
                refused.message
            await other.watch(1, large, wait_ms=300)  # its whole share
            await settled(driver, WATCHES_PER_PRINCIPAL_MAX + len(large))
            await other.watch(2, small)
            refused = await other.answer()
            assert (refused.request_id, refused.code) == (2, Code.OVERLOADED)
            assert f"{NODE_N2}'s watches would hold" in refused.message
            answered = [await greedy.answer() for _ in range(WATCHES_PER_PRINCIPAL_MAX)]
            assert {answer.code for answer in answered} == {Code.OK}
            assert (await other.answer()).code is Code.OK
            await settled(driver, 0)
            await greedy.watch(101, small, wait_ms=0)  # room again
            assert (await greedy.answer()).code is Code.OK
    assert driver.metrics.counter("driver.watches_refused_principal") == 2


async def test_a_watch_refused_or_cancelled_gives_its_place_back() -> None:
    driver = lone_driver(SessionKv(), watch_bytes_max=8)
    async with anyio.create_task_group() as tasks:
        await tasks.start(driver.run)
        with pytest.raises(Overloaded, match="more than one client identity may"):
            await driver.local_read(b"q" * 2, FOREVER, 1.0, NODE_N1)  # over its share, 1
        with anyio.move_on_after(0.05):
            await driver.local_read(b"q", FOREVER, 10.0, NODE_N1)
        assert driver.watch_bytes == 0
        tasks.cancel_scope.cancel()


def test_the_budget_counts_each_owners_watches_and_bytes() -> None:
    budget = WatchBudget(100, owner_watches_max=2, owner_bytes_max=50)
    assert budget.admit("a", 30) is None and budget.admit("a", 10) is None
    assert budget.admit("a", 1) == ("principal", "a has 2 watches waiting at this replica, "
                                                 "the most one client identity may")
    refused = budget.admit("b", 51)
    assert refused is not None and refused[0] == "principal"
    assert budget.admit("b", 50) is None
    refused = budget.admit("c", 11)
    assert refused is not None and refused[0] == "bytes"
    assert budget.held_bytes == 90 and len(budget) == 2
    budget.release("a", 30)
    budget.release("a", 10)
    budget.release("b", 50)
    assert budget.held_bytes == 0 and len(budget) == 0
    assert WatchBudget(800).owner_bytes_max == 100  # an eighth by default
    with pytest.raises(ValueError):
        WatchBudget(0)


def test_the_watch_budget_is_refused_below_one() -> None:
    with pytest.raises(ValueError, match="watch_bytes_max"):
        DriverConfig(watch_bytes_max=0)
