"""The request server, on asyncio and on trio: what it answers when it cannot answer as asked.

Goal: an answer larger than the connection's frame cap (a query's result, a command's reply) is
never queued, which failed the connection's writer and, through the listener, stopped the whole
replica; the request gets TOO_LARGE instead, which the client raises as ReplyTooLarge at once
(saying that a command was applied all the same), and the connection and the replica go on.
A request that does not decode is answered BAD_REQUEST under its own id wherever that can be
read: under id 0 no caller matched it, and the client waited out every try on every replica,
then said a command nobody proposed "may still be applied"."""

from __future__ import annotations

import anyio
import pytest

from consensus.codec import decode_envelope, pack
from consensus.config import ReplicaConfig
from consensus.envelope import BODY_BYTES_MAX, Principal
from consensus.errors import InvalidMessage, QueryRefused
from consensus.prng import Prng
from consensus.replica import Replica
from consensus.runtime import server as server_module
from consensus.runtime.client import (
    CellarClient,
    ClientConfig,
    Forbidden,
    Rejected,
    ReplyTooLarge,
)
from consensus.runtime.client_codec import (
    TIMEOUT_MS_MAX,
    Cancel,
    Code,
    Status,
    Watch,
    decode_response,
    encode_request,
)
from consensus.runtime.connect import connector
from consensus.runtime.driver import Driver, DriverConfig
from consensus.runtime.framing import FramedConnection
from consensus.runtime.listener import ClientListener
from consensus.runtime.metrics import Metrics
from consensus.runtime.server import ClientServer
from consensus.runtime.tls import Identity
from consensus.runtime.watch_budget import WATCHES_PER_PRINCIPAL_MAX
from jepsen.sim.kv_codec import decode_reply, encode_get, encode_put
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.local import (
    NODE_N1,
    MemoryFrames,
    MemoryStore,
    local_cluster,
    serving,
)

pytestmark = pytest.mark.anyio
FRAME_CAP = 64 << 10
BIG = b"big"  # a query or command body whose answer is over the cap


class BigAnswers(SessionKv):
    """SessionKv, except that `BIG` is answered with more than a frame can carry."""

    def __init__(self) -> None:
        super().__init__()
        self.big_applied = 0

    def apply(self, command: bytes) -> bytes:
        try:
            if decode_envelope(command).body == BIG:
                self.big_applied += 1
                return b"x" * (FRAME_CAP + 1)
        except InvalidMessage:
            pass
        return super().apply(command)

    def query(self, query: bytes) -> bytes:
        return b"x" * (FRAME_CAP + 1) if query == BIG else super().query(query)


async def test_an_answer_over_the_cap_is_refused_and_the_replica_goes_on() -> None:
    """Over a real listener, as a replica serves: its task group used to end with the
    writer's ValueError."""
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(1))
    driver = Driver(replica, MemoryStore(), BigAnswers(), lambda peer, frame: True, Metrics(),
                    config=DriverConfig(tick_ms=5))
    server = ClientServer(driver)

    async def serve(identity: Identity, connection: FramedConnection) -> None:
        await server.serve(identity.principal(), connection)

    listener = ClientListener(("127.0.0.1", 0), None, insecure=True,
                              frame_bytes_max=FRAME_CAP, handle=serve)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as node:
            await node.start(driver.run)
            host, port = await node.start(listener.run)
            endpoint = f"{host}:{port}"
            async with CellarClient([endpoint], connector(None, insecure=True),
                                    ClientConfig(attempt_timeout_s=1, deadline_s=5)) as client:
                started = anyio.current_time()
                with pytest.raises(ReplyTooLarge, match="ask for less"):
                    await client.watch(BIG, -1, wait_s=0)
                assert anyio.current_time() - started < 1  # at once, not at a deadline
                connection = client._connections[endpoint]
                status = await client.status(endpoint)  # the same connection, still served
                assert client._connections[endpoint] is connection and not connection.broken
            assert status["metrics"]["server.answers_too_large"] == 1
            node.cancel_scope.cancel()


async def test_a_command_whose_reply_is_over_the_cap_is_applied_and_said_so() -> None:
    with anyio.fail_after(30):
        async with local_cluster(BigAnswers, frame_bytes_max=FRAME_CAP) as (cluster, client):
            with pytest.raises(ReplyTooLarge, match="the command was applied"):
                await client.propose(BIG)
            with pytest.raises(ReplyTooLarge, match="ask for less"):
                await client.read(BIG)
            await client.propose(encode_put("k", 7))  # the same client goes on
            assert decode_reply(await client.read(encode_get("k"))) == (True, 7)
            await anyio.sleep(0.3)
            # Applied once, and not retried: the client knew the outcome at once.
            assert [machine.big_applied for machine in cluster.machines
                    if isinstance(machine, BigAnswers)] == [1, 1, 1]
            assert sum(driver.metrics.counter("server.answers_too_large")
                       for driver in cluster.drivers) == 2


async def test_a_request_that_does_not_decode_is_answered_under_its_own_id() -> None:
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(1))
    driver = Driver(replica, MemoryStore(), SessionKv(), lambda peer, frame: True, Metrics(),
                    config=DriverConfig(tick_ms=5))
    with anyio.fail_after(10):
        async with serving(driver) as (to_server, from_server):
            await to_server.send(pack([1, 42, "s", 1, b"x" * (BODY_BYTES_MAX + 1), 1000]))
            await to_server.send(b"\xc1 not a request")
            answers = [decode_response(await from_server.receive()) for _ in range(2)]
    assert [(answer.request_id, answer.code) for answer in answers] == [
        (42, Code.BAD_REQUEST), (0, Code.BAD_REQUEST)]
    assert "propose.body" in answers[0].message
    assert driver.metrics.counter("server.bad_requests") == 2


async def test_a_request_every_replica_refuses_is_rejected_at_once() -> None:
    """A watch that asks to wait longer than the protocol allows (made by hand: the client's
    watch refuses one unsent): each replica answers BAD_REQUEST, which the client matches and
    raises, instead of waiting out its tries."""
    too_long_ms = TIMEOUT_MS_MAX + 1000
    with anyio.fail_after(30):
        async with local_cluster(SessionKv) as (_, client):
            started = anyio.current_time()
            with pytest.raises(Rejected, match=r"watch\.wait_ms"):
                await client._ask_around(lambda request_id: encode_request(Watch(
                    request_id, b"q", -1, too_long_ms)), started + 15.0, "watch")
            assert anyio.current_time() - started < 5  # not the 15 s deadline plus the wait
            with pytest.raises(Rejected, match="not sent"):
                await client.propose(b"x" * (BODY_BYTES_MAX + 1))
            assert anyio.current_time() - started < 5


async def test_a_query_the_gate_refuses_is_answered_refused_and_raised_forbidden() -> None:
    """The state machine's gate is asked before a read or a watch goes to the driver; the
    client raises Forbidden at once, and the connection goes on. A query the gate finds is
    not one at all is answered BAD_REQUEST (the client raises Rejected) at once, however
    long a watch of it asked to wait: it had waited out the wait holding its bytes."""
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(1))
    driver = Driver(replica, MemoryStore(), SessionKv(), lambda peer, frame: True, Metrics(),
                    config=DriverConfig(tick_ms=5))
    asked: list[tuple[str, bytes]] = []

    def gate(principal: Principal, query: bytes) -> bytes:
        asked.append((str(principal), query))
        if query == b"junk":
            raise InvalidMessage("not a query: junk")
        if query == b"secret":
            raise QueryRefused("not for you")
        return query

    server = ClientServer(driver, admit_query=gate)

    async def serve(identity: Identity, connection: FramedConnection) -> None:
        await server.serve(identity.principal(), connection)

    listener = ClientListener(("127.0.0.1", 0), None, insecure=True, handle=serve)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as node:
            await node.start(driver.run)
            host, port = await node.start(listener.run)
            async with CellarClient([f"{host}:{port}"], connector(None, insecure=True),
                                    ClientConfig(attempt_timeout_s=1, deadline_s=5)) as client:
                with pytest.raises(Forbidden, match="not for you"):
                    await client.read(b"secret")
                with pytest.raises(Forbidden, match="not for you"):
                    await client.watch(b"secret", -1, wait_s=0)
                with anyio.fail_after(2), pytest.raises(Rejected, match="not a query: junk"):
                    await client.watch(b"junk", 1 << 40, wait_s=60)
                answer, _ = await client.watch(encode_get("k"), -1, wait_s=0)  # let through
                assert decode_reply(answer) == (True, None)  # no such key yet
            node.cancel_scope.cancel()
    assert driver.metrics.counter("server.queries_refused") == 2
    assert driver.metrics.counter("server.bad_requests") == 1
    assert asked[0] == ("admin:insecure-dev", b"secret") and len(asked) == 4


async def test_a_client_that_stops_reading_is_dropped_once_its_answers_pile_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Permits bound how many answers wait for a client, not their bytes: over
    ANSWERS_QUEUED_BYTES_MAX unwritten, with no write for ANSWERS_STALL_S, it is dropped."""
    monkeypatch.setattr(server_module, "ANSWERS_QUEUED_BYTES_MAX", 200_000)
    monkeypatch.setattr(server_module, "ANSWERS_STALL_S", 0.3)
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(1))
    driver = Driver(replica, MemoryStore(), BigAnswers(), lambda peer, frame: True, Metrics(),
                    config=DriverConfig(tick_ms=5))
    with anyio.fail_after(10):
        async with serving(driver) as (to_server, _never_read):
            for request_id in range(1, 21):  # each answered with 64 KiB at once
                await to_server.send(encode_request(Watch(request_id, BIG, -1, 0)))
            while not driver.metrics.counter("server.slow_clients_dropped"):
                await anyio.sleep(0.01)
            await anyio.sleep(0.1)
    assert driver.metrics.counter("server.slow_clients_dropped") == 1


class MegabyteAnswers(SessionKv):
    def query(self, query: bytes) -> bytes:
        return b"x" * (1 << 20) if query == BIG else super().query(query)


async def test_a_burst_of_answers_over_the_bound_a_reader_drains_is_not_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ready answers all its reads in a row, before the writer runs: ten 1-MiB answers
    queued at once pass a 4-MiB bound however promptly the client reads. The server pauses
    taking requests until they are written; it does not drop the client."""
    monkeypatch.setattr(server_module, "ANSWERS_QUEUED_BYTES_MAX", 4 << 20)
    with anyio.fail_after(30):
        async with local_cluster(MegabyteAnswers) as (cluster, client):
            answers: list[bytes] = []

            async def read() -> None:
                answers.append(await client.read(BIG))

            async with anyio.create_task_group() as tasks:
                for _ in range(10):
                    tasks.start_soon(read)
            assert [len(answer) for answer in answers] == [1 << 20] * 10
            assert sum(driver.metrics.counter("server.slow_clients_dropped")
                       for driver in cluster.drivers) == 0


async def test_a_client_that_hangs_up_with_every_permit_taken_is_let_go() -> None:
    """Permits come back as answers are written, and the reader waits for one before it reads
    the next frame: a client that sent more watches than its permits and hung up left the
    reader waiting for ever once their answers could not be written, holding one of the
    listener's places (and its task group) for the replica's lifetime."""
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(1))
    driver = Driver(replica, MemoryStore(), SessionKv(), lambda peer, frame: True, Metrics(),
                    config=DriverConfig(tick_ms=5))
    to_server, from_client = anyio.create_memory_object_stream[bytes](10)
    to_client, from_server = anyio.create_memory_object_stream[bytes](10)
    served = anyio.Event()

    async def serve() -> None:
        await ClientServer(driver, inflight_max=2).serve(
            NODE_N1, MemoryFrames(to_client, from_client))
        served.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)
            tasks.start_soon(serve)
            for request_id in (1, 2, 3):  # two permits: the third waits for one
                await to_server.send(encode_request(Watch(request_id, b"q", 1 << 40, 300)))
            await anyio.sleep(0.05)
            await to_server.aclose()  # the client hangs up
            await from_server.aclose()
            with anyio.move_on_after(2.0):  # the watches end 0.3 s after they came
                await served.wait()
            tasks.cancel_scope.cancel()
    assert served.is_set(), "the server still holds the connection of a client that hung up"


async def test_watches_their_callers_gave_up_on_are_called_off_at_the_replica() -> None:
    """A watch its caller cancels is called off at the replica while the connection stays up:
    each had held its place in the watch budget for its whole wait (up to ten minutes), and
    16 given up on locked the client's identity out of watches at that replica (OVERLOADED)."""
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(1))
    driver = Driver(replica, MemoryStore(), SessionKv(), lambda peer, frame: True, Metrics(),
                    config=DriverConfig(tick_ms=5))
    server = ClientServer(driver)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)

            async def connect(endpoint: str) -> MemoryFrames:
                to_server, from_client = anyio.create_memory_object_stream[bytes](100)
                to_client, from_server = anyio.create_memory_object_stream[bytes](100)
                tasks.start_soon(server.serve, NODE_N1, MemoryFrames(to_client, from_client))
                return MemoryFrames(to_server, from_server)

            config = ClientConfig(attempt_timeout_s=0.5, deadline_s=2.0)
            async with CellarClient(["0"], connect, config) as client:
                for _ in range(WATCHES_PER_PRINCIPAL_MAX):
                    with anyio.move_on_after(0.05):  # the caller gives up
                        await client.watch(encode_get("k"), 1 << 40, wait_s=600)
                connection = client._connections["0"]
                await anyio.sleep(0.1)
                assert driver.watch_bytes == 0
                # one more is taken and answered on the same connection (not OVERLOADED)
                answer, _ = await client.watch(encode_get("k"), -1, wait_s=0.1)
                assert decode_reply(answer) == (True, None)  # "k": no value
                assert client._connections["0"] is connection and not connection.broken
            tasks.cancel_scope.cancel()
    assert driver.metrics.counter("driver.watches_refused_principal") == 0
    assert driver.metrics.counter("server.bad_requests") == 0


async def test_a_cancel_ends_its_watch_unanswered_and_is_ignored_for_any_other_id() -> None:
    """A Cancel and the watch it calls off are never answered, and give back their permits
    (two here: one kept would stall the reader); an unknown or answered id is ignored."""
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(1))
    driver = Driver(replica, MemoryStore(), SessionKv(), lambda peer, frame: True, Metrics(),
                    config=DriverConfig(tick_ms=5))
    to_server, from_client = anyio.create_memory_object_stream[bytes](20)
    to_client, from_server = anyio.create_memory_object_stream[bytes](20)
    query = encode_get("k")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)
            tasks.start_soon(ClientServer(driver, inflight_max=2).serve, NODE_N1,
                             MemoryFrames(to_client, from_client))
            await to_server.send(encode_request(Watch(1, query, 1 << 40, TIMEOUT_MS_MAX)))
            await to_server.send(encode_request(Watch(2, query, -1, 0)))  # answered at once
            assert decode_response(await from_server.receive()).request_id == 2
            assert driver.watch_bytes == len(query)  # watch 1 waits
            for request in (Cancel(99), Cancel(2), Cancel(1), Cancel(1), Status(3), Status(4)):
                await to_server.send(encode_request(request))
            answers = [decode_response(await from_server.receive()) for _ in range(2)]
            assert sorted(answer.request_id for answer in answers) == [3, 4]
            assert driver.watch_bytes == 0
            with anyio.move_on_after(0.2):
                extra = await from_server.receive()
                pytest.fail(f"answered more: {decode_response(extra)}")
            tasks.cancel_scope.cancel()
    assert driver.metrics.counter("server.bad_requests") == 0
