"""The budget of command bytes a replica holds, on asyncio and on trio.

Goal: commands are bounded in bytes from submit until they execute, whatever their clients'
deadlines: a client asking for no wait at all (timeout 0) got its answer, and its permit, back
at once while its command stayed queued in the core, so one client could queue gigabytes.
Past the budget a submit is Overloaded at once (nothing proposed); executed commands free
their bytes; the server waits at least WAIT_MS_MIN for any command or read.

Method: a lone replica (its peers absent: nothing commits) takes commands that never execute;
a three-replica cluster executes them; the budget's own bookkeeping is checked directly."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from consensus.codec import encode_envelope_of
from consensus.config import ReplicaConfig
from consensus.envelope import Principal, Role
from consensus.prng import Prng
from consensus.replica import Replica
from consensus.runtime.client_codec import (
    Code,
    Propose,
    Read,
    decode_response,
    encode_request,
)
from consensus.runtime.driver import Done, Driver, DriverConfig
from consensus.runtime.metrics import Metrics
from consensus.runtime.proposal_budget import (
    NODE_RESERVED_BYTES,
    NODE_RESERVED_COMMANDS,
    ProposalBudget,
    shared_places,
)
from consensus.runtime.server import WAIT_MS_MIN, ClientServer
from jepsen.sim.kv_codec import encode_put
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.local import (
    NODE_N1,
    SCHEDULER,
    MemoryFrames,
    MemoryStore,
    local_cluster,
    serving,
)

pytestmark = pytest.mark.anyio
COMMAND = encode_envelope_of(Principal(Role.NODE, "n1"), "s", 1, 0, b"x" * 10_000)


def lone_driver(proposal_bytes_max: int) -> Driver:
    replica = Replica(ReplicaConfig(replica_id=1, replica_count=3), Prng(1))
    return Driver(replica, MemoryStore(), SessionKv(), lambda target, frame: True, Metrics(),
                  config=DriverConfig(tick_ms=5, proposal_bytes_max=proposal_bytes_max))


def recorder(into: list[str]) -> Done:
    def done(reply: bytes | None, error: Exception | None) -> None:
        into.append(type(error).__name__)
    return done


async def test_commands_whose_clients_stopped_waiting_still_count() -> None:
    driver = lone_driver(proposal_bytes_max=10 * len(COMMAND))
    answers: list[str] = []
    async with anyio.create_task_group() as tasks:
        await tasks.start(driver.run)
        for _ in range(10):
            driver.submit(COMMAND, 0.0, recorder(answers))  # no wait: answered at once
        await anyio.sleep(0.1)
        assert answers == ["OutcomeUnknown"] * 10  # queued in the core all the same
        driver.submit(COMMAND, 0.0, recorder(answers))
        assert answers[10:] == ["Overloaded"]  # at once: never reaches the core
        await anyio.sleep(0.1)
        tasks.cancel_scope.cancel()
    assert driver.metrics.counter("driver.proposals") == 10  # all in the core, none executed
    assert driver.status()["proposal_bytes"] == 10 * len(COMMAND)
    assert driver.metrics.counter("driver.proposals_refused_bytes") == 1


async def test_reads_count_until_answered_and_then_free_their_bytes() -> None:
    """A lone replica has no lease: its reads wait until their deadline. Until then their
    bytes count, and a read past the budget is Overloaded at once; once they expire, the
    bytes are free again."""
    query = b"q" * 10_000
    driver = lone_driver(proposal_bytes_max=3 * len(query))
    answers: list[str] = []
    async with anyio.create_task_group() as tasks:
        await tasks.start(driver.run)
        for _ in range(3):
            driver.submit_read(query, 0.2, recorder(answers))
        driver.submit_read(query, 0.2, recorder(answers))
        assert answers == ["Overloaded"]
        assert driver.status()["proposal_bytes"] == 3 * len(query)
        await anyio.sleep(0.5)
        assert answers == ["Overloaded"] + ["OutcomeUnknown"] * 3
        assert driver.status()["proposal_bytes"] == 0
        tasks.cancel_scope.cancel()
    assert driver.metrics.counter("driver.reads_refused_bytes") == 1


async def test_executed_commands_free_their_bytes() -> None:
    """A budget of three commands serves any number of them, one after another."""
    body = encode_put("k", 1)
    with anyio.fail_after(30):
        async with local_cluster(SessionKv, proposal_bytes_max=3 * (len(body) + 200)) as (
                cluster, client):
            for value in range(20):
                await client.propose(encode_put("k", value))
            await anyio.sleep(0.3)
            assert [driver.status()["proposal_bytes"] for driver in cluster.drivers] == [0, 0, 0]


async def test_the_server_waits_at_least_its_minimum_for_a_command_or_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    driver = lone_driver(proposal_bytes_max=1 << 20)
    waited_s: list[float] = []

    def recording(submit: Callable[..., None]) -> Callable[..., None]:
        def record(payload: bytes, timeout_s: float, done: Done, **reserved: bool) -> None:
            waited_s.append(timeout_s)
            submit(payload, timeout_s, done, **reserved)
        return record

    monkeypatch.setattr(driver, "submit", recording(driver.submit))
    monkeypatch.setattr(driver, "submit_read", recording(driver.submit_read))
    with anyio.fail_after(10):
        async with serving(driver) as (to_server, from_server):
            await to_server.send(encode_request(Propose(1, "s", 1, b"put", 0)))
            await to_server.send(encode_request(Read(2, b"get", 0)))
            await to_server.send(encode_request(Propose(3, "s", 2, b"put", 5000)))
            answered = {decode_response(await from_server.receive()).request_id
                        for _ in range(2)}
            assert answered == {1, 2}
    assert waited_s == [WAIT_MS_MIN / 1000, WAIT_MS_MIN / 1000, 5.0]


def test_the_budget_holds_until_execution_and_forgets_after_a_snapshot() -> None:
    budget = ProposalBudget(100)
    assert budget.admit(60) and not budget.admit(41) and budget.admit(40)
    budget.refund(40)  # the core refused it
    budget.hold(7, 60)
    assert budget.held_bytes == 60 and len(budget) == 1
    assert budget.admit(30)
    budget.hold(8, 30)
    budget.deadline_passed(7)  # its client stopped waiting: still held
    assert budget.held_bytes == 90
    budget.forget_after_snapshot(lambda tag: tag == 8)  # 7's client is gone, 8's waits
    assert budget.held_bytes == 30
    budget.release(9)  # not held: ignored
    budget.deadline_passed(8)
    assert budget.held_bytes == 0 and len(budget) == 0
    with pytest.raises(ValueError):
        ProposalBudget(0)


def test_the_budget_is_refused_below_one() -> None:
    with pytest.raises(ValueError, match="proposal_bytes_max"):
        DriverConfig(proposal_bytes_max=0)


async def test_a_node_agents_command_gets_through_when_other_clients_fill_the_budget() -> None:
    """A scheduler fills the budget with commands that never execute; a node agent's command
    (a heartbeat) is still taken: refused, its node would be judged down by the sequencer's
    own ticks, which never pass through the budget."""
    driver = lone_driver(proposal_bytes_max=4096)
    scheduler_up, scheduler_in = anyio.create_memory_object_stream[bytes](200)
    scheduler_out, scheduler_down = anyio.create_memory_object_stream[bytes](200)
    node_up, node_in = anyio.create_memory_object_stream[bytes](10)
    node_out, node_down = anyio.create_memory_object_stream[bytes](10)
    server = ClientServer(driver)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)
            tasks.start_soon(server.serve, SCHEDULER, MemoryFrames(scheduler_out, scheduler_in))
            tasks.start_soon(server.serve, NODE_N1, MemoryFrames(node_out, node_in))
            for sequence in range(1, 201):  # small commands: the budget is full to the byte
                await scheduler_up.send(encode_request(Propose(sequence, "s", sequence, b"f",
                                                               5000)))
            answer = decode_response(await scheduler_down.receive())
            assert answer.code is Code.OVERLOADED
            await node_up.send(encode_request(Propose(1, "n", 1, b"h" * 100, 0)))
            assert decode_response(await node_down.receive()).code is Code.UNKNOWN  # taken
            tasks.cancel_scope.cancel()


async def test_node_agents_keep_places_in_the_queues_other_clients_fill() -> None:
    """Other clients' commands stop short of the last places of the driver's input queue (for
    clients) and of the core's queue of proposals; a node agent's command takes one."""
    replica = Replica(ReplicaConfig(replica_id=1, replica_count=3, pending_proposals_max=16),
                      Prng(1))
    driver = Driver(replica, MemoryStore(), SessionKv(), lambda target, frame: True, Metrics(),
                    config=DriverConfig(tick_ms=5, inputs_max=64))
    command = encode_envelope_of(SCHEDULER, "s", 1, 0, b"x")
    queued: list[str] = []
    for _ in range(20):  # the driver is not running yet: they wait in its input queue
        driver.submit(command, 0.1, recorder(queued))
    assert queued == ["Overloaded"] * 4  # 32 places for clients, the last 16 for node agents
    taken: list[str] = []
    for _ in range(8):
        driver.submit(command, 0.1, recorder(taken), reserved=True)
    assert taken == []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)
            await anyio.sleep(0.5)
            tasks.cancel_scope.cancel()
    # The core's queue takes 16, the last 8 for node agents: of the 16 others, 8 are refused.
    assert queued[4:].count("Overloaded") == 8 and taken == ["OutcomeUnknown"] * 8


def test_the_reserve_admits_only_reserved_commands_and_stays_bounded() -> None:
    budget = ProposalBudget(100)
    assert budget.admit(100) and not budget.admit(1)
    assert budget.admit(NODE_RESERVED_BYTES, reserved=True)
    assert not budget.admit(1, reserved=True)
    assert budget.held_bytes == 100 + NODE_RESERVED_BYTES
    assert shared_places(100_000) == 100_000 - NODE_RESERVED_COMMANDS
    assert shared_places(64) == 32 and shared_places(1) == 1
