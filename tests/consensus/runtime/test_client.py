"""The client's own timers, on asyncio and on trio: against replicas that take requests and
never answer, a command ends as OutcomeUnknown and a read as Unavailable at the deadline, each
try moving on to the next replica; nothing is left waiting on a connection afterwards."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import anyio
import pytest

from consensus.envelope import BODY_BYTES_MAX
from consensus.runtime.client import (
    DEADLINE_S_MAX,
    WAIT_S_MAX,
    CellarClient,
    ClientConfig,
    OutcomeUnknown,
    Rejected,
    Unavailable,
)
from consensus.runtime.client_codec import (
    Cancel,
    Code,
    Request,
    Response,
    Status,
    Watch,
    encode_ok,
    encode_response,
    encode_status,
    request_id_of,
)
from tests.consensus.runtime.fake_replicas import (
    AnsweringReplica,
    NeverDialled,
    ScriptedReplica,
    SilentReplica,
)
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.local import MemoryFrames, local_cluster

pytestmark = pytest.mark.anyio


async def test_unanswered_commands_and_reads_end_at_their_deadline() -> None:
    heard: list[str] = []

    async def connect(endpoint: str) -> SilentReplica:
        return SilentReplica(endpoint, heard)

    config = ClientConfig(attempt_timeout_s=0.05, deadline_s=10.0, retry_backoff_s=0.01)
    with anyio.fail_after(10):  # a timer that never fires would hang here
        async with CellarClient(["a", "b"], connect, config, first=0) as client:
            started = anyio.current_time()
            with pytest.raises(OutcomeUnknown):
                await client.propose(b"put", deadline_s=0.4)
            assert 0.4 <= anyio.current_time() - started < 2.0
            with pytest.raises(Unavailable):
                await client.read(b"get", deadline_s=0.2)
            connections = list(client._connections.values())
    assert set(heard) == {"a", "b"}  # no answer from one replica: the next one is tried
    assert all(not connection.answers.waiting for connection in connections)


class Dialer:
    """A `Connect` that counts its dials, each taking a while (or failing) and keeping the
    streams it made, against the in-process replica of a local cluster."""

    def __init__(self, connect: Callable[[str], Awaitable[MemoryFrames]], *,
                 fail: bool = False) -> None:
        self._connect, self.fail = connect, fail
        self.dials = 0
        self.streams: list[MemoryFrames] = []

    async def __call__(self, endpoint: str) -> MemoryFrames:
        self.dials += 1
        await anyio.sleep(0.05)  # every caller arrives while the dial is in progress
        if self.fail:
            raise ConnectionRefusedError(f"{endpoint} refused")
        stream = await self._connect(endpoint)
        self.streams.append(stream)
        return stream


async def test_concurrent_callers_share_one_dial_per_endpoint() -> None:
    """Twenty status requests at once used to dial twenty connections; all but the last stayed
    open, with their tasks, for the client's lifetime."""
    with anyio.fail_after(20):
        async with local_cluster(SessionKv) as (cluster, _):
            assert cluster.connect is not None
            dialer = Dialer(cluster.connect)
            async with CellarClient(["0"], dialer, ClientConfig(deadline_s=5)) as client:
                async with anyio.create_task_group() as callers:
                    for _ in range(20):
                        callers.start_soon(client.status, "0")
                assert dialer.dials == 1 and len(dialer.streams) == 1
                assert client._connections["0"]._stream is dialer.streams[0]
                dialer.fail = True
                failures: list[BaseException] = []
                client._connections["0"].broken = True  # dial again, and fail

                async def status() -> None:
                    try:
                        await client.status("0")
                    except Unavailable as error:
                        failures.append(error)

                async with anyio.create_task_group() as callers:
                    for _ in range(5):
                        callers.start_soon(status)
                assert dialer.dials == 2  # one failed dial answered all five
                assert len(failures) == 5


async def test_a_dial_whose_caller_gave_up_is_made_again_by_one_waiting() -> None:
    with anyio.fail_after(20):
        async with local_cluster(SessionKv) as (cluster, _):
            assert cluster.connect is not None
            dialer = Dialer(cluster.connect)
            async with CellarClient(["0"], dialer, ClientConfig(deadline_s=5)) as client:
                async with anyio.create_task_group() as callers:
                    callers.start_soon(client.status, "0")  # runs once this task dials
                    with anyio.move_on_after(0.01):  # the dialer gives up mid-dial
                        await client._connection("0")
                    assert dialer.dials == 1
                assert dialer.dials == 2 and len(dialer.streams) == 1
                assert client._dials == {}


async def test_a_body_over_the_protocols_limit_is_rejected_unsent() -> None:
    """Every replica would refuse it as malformed; sending it cost the whole deadline and
    ended as OutcomeUnknown for a command no replica proposed."""
    heard: list[str] = []

    async def connect(endpoint: str) -> SilentReplica:
        return SilentReplica(endpoint, heard)

    too_big = b"x" * (BODY_BYTES_MAX + 1)
    with anyio.fail_after(10):
        async with CellarClient(["a"], connect, ClientConfig(deadline_s=5)) as client:
            with pytest.raises(Rejected, match="more than the protocol's"):
                await client.propose(too_big)
            with pytest.raises(Rejected):
                await client.read(too_big)
            with pytest.raises(Rejected):
                await client.watch(too_big, -1)
    assert heard == []


async def test_a_request_over_the_connections_frame_cap_is_rejected_unsent() -> None:
    heard: list[str] = []

    async def connect(endpoint: str) -> SilentReplica:
        replica = SilentReplica(endpoint, heard)
        replica.frame_bytes_max = 1000
        return replica

    with anyio.fail_after(10):
        async with CellarClient(["a"], connect, ClientConfig(deadline_s=5)) as client:
            with pytest.raises(Rejected, match="not sent"):
                await client.propose(b"x" * 2000)
            await anyio.sleep(0.05)  # the writer is still there: a small one goes out
            with pytest.raises(OutcomeUnknown):
                await client.propose(b"small", deadline_s=0.2)
    assert heard == ["a"]


class HangingUpReplica:
    """A connection whose replica hangs up at once; it records whether the client closed its
    side."""

    frame_bytes_max = 1 << 20

    def __init__(self) -> None:
        self.closed = False

    async def send(self, frame: bytes) -> None:
        await self.send_many([frame])

    async def send_many(self, frames: Sequence[bytes]) -> None:
        if self.closed:
            raise anyio.ClosedResourceError

    async def receive(self) -> bytes:
        await anyio.sleep(0.01)
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        self.closed = True


async def test_a_connection_the_replica_hung_up_is_closed_and_its_writer_ends() -> None:
    """A broken connection was only marked so: its stream stayed open and its writer slept on
    its doorbell for ever, a socket (in CLOSE_WAIT, or a place of the replica's) and a task
    leaked at every reconnect of a long-lived client."""
    streams: list[HangingUpReplica] = []

    async def connect(endpoint: str) -> HangingUpReplica:
        streams.append(HangingUpReplica())
        return streams[-1]

    config = ClientConfig(attempt_timeout_s=0.05, deadline_s=0.5, retry_backoff_s=0.01)
    with anyio.fail_after(10):
        async with CellarClient(["a"], connect, config, first=0) as client:
            tasks = len(anyio.get_running_tasks())
            for _ in range(5):
                with pytest.raises(Unavailable):
                    await client.status("a")
            await anyio.sleep(0.1)
            assert len(anyio.get_running_tasks()) == tasks  # no reader, writer nor timer left
    assert len(streams) >= 2  # a new connection each time
    assert [stream for stream in streams if not stream.closed] == []


async def test_a_command_waiting_for_a_free_session_honours_its_deadline() -> None:
    """With every session in use a command waited for one with no deadline, and its own
    deadline began only once it had one: a caller asking for 0.3 s waited for the command
    ahead of it first (here 1.2 s; a thousand callers on 64 sessions, minutes)."""
    heard: list[str] = []

    async def connect(endpoint: str) -> SilentReplica:
        return SilentReplica(endpoint, heard)

    async def hog(client: CellarClient) -> None:
        with pytest.raises(OutcomeUnknown):
            await client.propose(b"first", deadline_s=1.2)

    config = ClientConfig(attempt_timeout_s=0.05, deadline_s=10.0, retry_backoff_s=0.01,
                          sessions=1)
    with anyio.fail_after(10):
        async with CellarClient(["a"], connect, config, first=0) as client, \
                anyio.create_task_group() as tasks:
            tasks.start_soon(hog, client)
            await anyio.sleep(0.05)  # the only session is taken
            started = anyio.current_time()
            with pytest.raises(Unavailable, match="the command was not sent"):
                await client.propose(b"second", deadline_s=0.3)
            waited = anyio.current_time() - started
    assert 0.3 <= waited < 0.8


async def test_a_session_refusal_after_a_retry_is_an_unknown_outcome() -> None:
    """A session's refusal (a full table, say) is not remembered: it says the copy answered
    was not applied, not that a copy sent before it, unanswered, will not be. Reported as
    "not applied" only when the command was sent once."""
    def not_applied(reply: bytes) -> str | None:
        return "SESSIONS_FULL" if reply == b"full" else None

    async def connect(endpoint: str) -> SilentReplica | AnsweringReplica:
        return SilentReplica(endpoint, []) if endpoint == "a" else AnsweringReplica(b"full")

    config = ClientConfig(attempt_timeout_s=0.05, deadline_s=5.0, retry_backoff_s=0.01)
    with anyio.fail_after(10):
        async with CellarClient(["a", "b"], connect, config, first=0) as client:
            with pytest.raises(OutcomeUnknown, match=r"SESSIONS_FULL.*sent more than once"):
                await client.propose(b"put", not_applied=not_applied)  # "a" times out
        async with CellarClient(["a", "b"], connect, config, first=1) as client:
            assert await client.propose(b"put", not_applied=not_applied) == b"full"


@pytest.mark.parametrize("options", [{"deadline_s": 0.0}, {"deadline_s": 46.0},
                                     {"attempt_timeout_s": 0.0}, {"sessions": 0},
                                     {"retry_backoff_s": -1.0}])
def test_a_client_configuration_out_of_bounds_is_refused(options: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ClientConfig(**options)  # type: ignore[arg-type]


async def test_a_command_deadline_past_the_bound_is_refused_before_anything_is_sent() -> None:
    """Copies of a command retried for longer than DEADLINE_S_MAX could outlive the session
    guard that keeps a late copy from being applied twice."""
    connect = NeverDialled()
    async with CellarClient(["a"], connect, ClientConfig()) as client:
        with pytest.raises(ValueError, match="deadline_s must lie in"):
            await client.propose(b"put", deadline_s=DEADLINE_S_MAX + 1)
    assert connect.dialled == []


@pytest.mark.parametrize("deadline_s", [0.0, -1.0])
async def test_a_read_deadline_not_positive_is_refused_before_anything_is_sent(
        deadline_s: float) -> None:
    """A deadline of 0 had meant the default one (15 s), a negative one no try at all."""
    connect = NeverDialled()
    async with CellarClient(["a"], connect, ClientConfig()) as client:
        with pytest.raises(ValueError, match="deadline_s must be positive"):
            await client.read(b"get", deadline_s=deadline_s)
    assert connect.dialled == []


async def test_a_watch_rides_out_a_moment_with_no_replica_up_as_a_read_does() -> None:
    """Both replicas refuse connections for a moment (a restart, a failover): a watch, as a
    read, tries again until its deadline; it raised Unavailable at once, which ended the node
    agent watching its effects."""
    up_at = 0.0

    async def connect(endpoint: str) -> AnsweringReplica:
        if anyio.current_time() < up_at:
            raise ConnectionRefusedError(endpoint)
        return AnsweringReplica(b"answer")

    config = ClientConfig(attempt_timeout_s=0.5, deadline_s=5.0, retry_backoff_s=0.05)
    with anyio.fail_after(10):
        up_at = anyio.current_time() + 0.3
        async with CellarClient(["a", "b"], connect, config, first=0) as client:
            assert await client.read(b"query") == b"answer"
        up_at = anyio.current_time() + 0.3
        async with CellarClient(["a", "b"], connect, config, first=0) as client:
            result, _ = await client.watch(b"query", -1, wait_s=0.1)
            assert anyio.current_time() >= up_at
    assert result == b"answer"


async def test_a_watch_longer_than_a_replica_holds_one_is_refused_unsent() -> None:
    connect = NeverDialled()
    async with CellarClient(["a"], connect, ClientConfig()) as client:
        with pytest.raises(ValueError, match="wait_s must lie in"):
            await client.watch(b"query", -1, wait_s=WAIT_S_MAX + 1)
    assert connect.dialled == []


class HoldingWatches(ScriptedReplica):
    """A replica that holds every watch unanswered (and every read) and answers a status;
    `earlier`: one of a build before Cancel, whose decoder refuses it as an unknown kind,
    answered BAD_REQUEST under the id it names. `heard`: every request, decoded."""

    def __init__(self, *, earlier: bool = False) -> None:
        super().__init__()
        self.heard: list[Request] = []
        self._earlier = earlier

    def hear(self, request: Request, frame: bytes) -> None:
        self.heard.append(request)
        if isinstance(request, Status):
            self.answer(encode_ok(request.request_id, encode_status({})))
        elif isinstance(request, Cancel) and self._earlier:
            self.answer(encode_response(Response(
                request_id_of(frame), Code.BAD_REQUEST, message="request.kind: 5 > 4")))

    def ids(self, kind: type[Watch] | type[Cancel]) -> list[int]:
        return [request.request_id for request in self.heard if isinstance(request, kind)]


async def test_a_watch_given_up_on_is_called_off_while_its_connection_stays_up() -> None:
    """Its caller cancelled, or its try's deadline passed: the client sends a Cancel naming
    it, or the replica held it, with its place in the watch budget, for its whole wait.
    Commands and reads are never called off."""
    replica = HoldingWatches()

    async def connect(endpoint: str) -> HoldingWatches:
        return replica

    config = ClientConfig(attempt_timeout_s=0.05, deadline_s=0.3, retry_backoff_s=0.01)
    with anyio.fail_after(10):
        async with CellarClient(["a"], connect, config) as client:
            with anyio.move_on_after(0.05):  # the caller gives up
                await client.watch(b"query", 7, wait_s=600)
            with pytest.raises(Unavailable):  # the try's deadline passes
                await client.watch(b"query", 7, wait_s=0.1)
            with pytest.raises(Unavailable):
                await client.read(b"query")
            await client.status("a")  # sent after the Cancels: they went out before it
            connection = client._connections["a"]
            assert not connection.broken and not connection.answers.waiting
    assert len(replica.ids(Watch)) == 2
    assert replica.ids(Cancel) == replica.ids(Watch)


async def test_a_replica_of_an_earlier_build_refuses_a_cancel_and_the_connection_goes_on(
        ) -> None:
    """Mixed versions: its BAD_REQUEST comes under the id of the watch given up on, which no
    caller waits for any more (ids are never reused on a connection): ignored, and the next
    request on the same connection is answered. (Such a replica holds the watch for its wait,
    as before Cancel.)"""
    replica = HoldingWatches(earlier=True)

    async def connect(endpoint: str) -> HoldingWatches:
        return replica

    with anyio.fail_after(10):
        async with CellarClient(["a"], connect, ClientConfig(deadline_s=2.0)) as client:
            with anyio.move_on_after(0.05):
                await client.watch(b"query", 7, wait_s=600)
            connection = client._connections["a"]
            assert await client.status("a") == {}
            assert client._connections["a"] is connection and not connection.broken
    assert replica.ids(Cancel) == replica.ids(Watch)
