"""The client library: talk to any replica, survive replica failures, never lie about outcomes.

Every command travels in an exactly-once session: (session id, sequence number). A command is
retried, with the same session and sequence, on the next replica when the connection breaks or
the replica answers "unknown"; the state machine applies a sequence once and answers repeats
from its reply cache, so a retry never applies a command twice. A session carries one command
at a time, so the client keeps a pool of sessions for concurrent commands; with every one in
use a command waits its turn, within its deadline (consensus/runtime/session_pool.py). When
the deadline passes with the outcome still open the client raises `OutcomeUnknown` (the
command may yet be applied) rather than guess; `Unavailable` means no replica ever took it.

A session's refusal (a full session table, a command stamped too long ago to open a session)
is not remembered, so it says only that the copy answered was not applied: a copy sent before
it to a replica that did not answer may still be applied later (once an idle session expires,
or on a replica whose clock is behind). The caller names those replies (`not_applied`); one
that answers a command sent more than once is `OutcomeUnknown`, never "not applied".

Reads are linearizable (the replica runs them at the sequencer's read index) and are simply
retried. Watches long-poll a query on one replica's state and resume from the executed slot
after a reconnect; they are retried as reads are, so a moment with no replica up is ridden
out, and a replica behind the slot asked (cut off from its peers) is passed over as one that
did not answer: a watch never answers older than what its caller has seen. A watch try given up
on unanswered (its caller cancelled, or the try's deadline passed) while its connection stays up
is called off at the replica with a Cancel, which answers nothing: else the replica held it, and
its place in the watch budget, for its whole wait, and 16 given up on locked this identity out
of watches there (OVERLOADED). A replica of an earlier build answers the Cancel BAD_REQUEST
under the watch's id, which nobody waits for any more; the connection goes on. Async on anyio.

A request refused (OVERLOADED, UNKNOWN, UNAVAILABLE) or unanswered round the replicas pauses
before its next try, each pause twice the last (from `retry_backoff_s` up to
`retry_backoff_max_s`), drawn in [half, whole] from the client's generator (`rng`, seedable),
and never past the caller's deadline. It paused a fixed 50 ms: a crowd of clients a busy
replica shed came back together twenty times a second, for their whole deadlines.
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup

from consensus.envelope import BODY_BYTES_MAX
from consensus.errors import ConsensusError, InvalidMessage
from consensus.runtime.backoff import Backoff
from consensus.runtime.client_codec import (
    TIMEOUT_MS_MAX,
    Cancel,
    Code,
    Read,
    Response,
    Status,
    Watch,
    decode_response,
    decode_status,
    encode_propose,
    encode_request,
)
from consensus.runtime.connect import ConnectRefused
from consensus.runtime.deadlines import Awaited, loop_clock
from consensus.runtime.framing import TransportError
from consensus.runtime.outbox import Outbox
from consensus.runtime.sequencer_route import SequencerRoute
from consensus.runtime.session_pool import Session, SessionPool
from consensus.runtime.streams import FrameStream

Connect = Callable[[str], Awaitable[FrameStream]]
Encode = Callable[[int], bytes]  # a request's bytes, given its id
# Why a command's reply says its session refused it (nothing applied, nothing remembered), or
# None: the state machine's to tell, as the client sees only bytes.
NotApplied = Callable[[bytes], str | None]
CLOSE_TIMEOUT_S = 1.0
# The longest a command may be retried for: well under half the shortest session lifetime a
# state machine keeps (the 600 s floor, SESSION_TTL_MS_MIN), the rest a margin for the clocks.
DEADLINE_S_MAX = 45.0
WAIT_S_MAX = TIMEOUT_MS_MAX / 1000  # the longest a replica holds a watch; it refuses more
# A connection is over (an answer over the frame cap or cut short is a TransportError)
_BROKEN = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError,
           InvalidMessage, TransportError)


class _NotSent(Exception):
    """A request that never left this process."""


class _Expired(Exception):
    """The deadline passed before the request could be sent: stop trying."""


class ClientError(ConsensusError):
    """Base of the client's errors."""


class OutcomeUnknown(ClientError):
    """The deadline passed while the command may have been applied, or a copy of it was
    refused while another may yet be: it may yet take effect."""


class Unavailable(ClientError):
    """No replica took the request before the deadline; a command was certainly not applied."""


class Rejected(ClientError):
    """The replica refused the request as malformed."""


class Forbidden(ClientError):
    """The replica refused the query: the client's principal may not ask it (a node agent
    asking about another node)."""


class ReplyTooLarge(ClientError):
    """The answer would not fit in a frame of the connection. A command was applied all the
    same (its result is lost; asking again in the same session gets the same answer); a query
    should ask for less."""


def _check_body(body: bytes, what: str) -> None:
    """Refuse at once what every replica would refuse as malformed (never sent)."""
    if len(body) > BODY_BYTES_MAX:
        raise Rejected(f"{what} of {len(body)} bytes, more than the protocol's "
                       f"{BODY_BYTES_MAX}; not sent")


def _refusal(response: Response) -> ClientError | None:
    """The error a response settles the request with, whichever replica is asked: None when
    it does not (OK, or a code that sends the next try elsewhere)."""
    if response.code is Code.BAD_REQUEST:
        return Rejected(response.message)
    if response.code is Code.TOO_LARGE:
        return ReplyTooLarge(response.message)
    if response.code is Code.REFUSED:
        return Forbidden(response.message)
    return None


_MOVE_ON = (Code.UNAVAILABLE, Code.UNKNOWN)  # answers that send the next try elsewhere
_ANSWER_MARGIN_S = 1.0  # what a try waits for its answer beyond attempt_timeout_s


def _behind(response: Response | None, after_slot: int) -> Response | None:
    """`response`, or None (no answer: the next try goes elsewhere) when it is an OK answer
    from a replica that has executed less than `after_slot`: older than what the caller of a
    watch has seen, and a caller that takes each answer as current would go back in time."""
    if response is not None and response.code is Code.OK and response.slot < after_slot:
        return None
    return response


def _encode_status(request_id: int) -> bytes:
    return encode_request(Status(request_id))


def _no_result(handed_over: bool, deadline_s: float, session: str, sequence: int,
               unreached: _NotSent | None = None, *, refused: str = "") -> ClientError:
    """The error for a command whose deadline passed without a result."""
    if handed_over:
        return OutcomeUnknown(f"no result within {deadline_s:.1f} s; the command (session "
                              f"{session}, sequence {sequence}) may still be applied")
    return Unavailable(f"no replica took the command within {deadline_s:.1f} s"
                       f"{_last_failure(unreached)}{_last_refusal(refused)}")


def _last_refusal(refused: str) -> str:
    """What the last replica that refused the request (OVERLOADED) said, for an Unavailable:
    a budget too small for the request refuses it at every try, and only the replica says
    why."""
    return f" (last refused: {refused})" if refused else ""


def _last_failure(unreached: _NotSent | None) -> str:
    """Why the last connection failed, for an Unavailable: a TLS handshake refused (another
    cluster's CA, an expired certificate) is not a replica down, and should not read as one."""
    if unreached is None:
        return ""
    cause = unreached.__cause__
    why = "timed out" if isinstance(cause, TimeoutError) else str(cause) or type(cause).__name__
    return f" (connecting: {why})"


def _unreached(earlier: _NotSent | None, error: _NotSent) -> _NotSent:
    """The failure worth telling: a replica that refused this client's certificate (or showed
    one not of the cluster) over one down, and that over a dial the deadline cut short."""
    def rank(failure: _NotSent) -> int:
        cause = failure.__cause__
        return 2 if isinstance(cause, ConnectRefused) else 0 if isinstance(
            cause, TimeoutError) else 1

    return error if earlier is None or rank(error) >= rank(earlier) else earlier


def _refused_after_retry(why: str, session: str, sequence: int) -> ClientError:
    """The error for a command its session refused after it was sent more than once."""
    return OutcomeUnknown(f"the command (session {session}, sequence {sequence}) was refused "
                          f"({why}), but it was sent more than once: a copy sent earlier, "
                          f"unanswered, may still be applied")


@dataclass(frozen=True, slots=True)
class ClientConfig:
    attempt_timeout_s: float = 2.0  # one try at one replica
    connect_timeout_s: float = 2.0  # one dial to one replica: TCP, TLS and the hello
    deadline_s: float = 15.0  # the whole command, across replicas; at most DEADLINE_S_MAX
    sessions: int = 64  # commands in flight at once
    retry_backoff_s: float = 0.05  # the first pause before a retry (module docstring)
    retry_backoff_max_s: float = 1.0  # the longest pause, however many retries
    # Send to the sequencer's replica when known (fewest hops on a LAN), instead of staying
    # with one replica (`first`, or one at random): see consensus/runtime/sequencer_route.py.
    prefer_sequencer: bool = False

    def __post_init__(self) -> None:
        _check_deadline(self.deadline_s)
        if not (self.attempt_timeout_s > 0 and self.connect_timeout_s > 0
                and self.retry_backoff_s >= 0 and self.sessions >= 1):
            raise ValueError(f"attempt_timeout_s and connect_timeout_s must be positive, "
                             f"retry_backoff_s at least 0 and sessions at least 1, got "
                             f"{self.attempt_timeout_s}, {self.connect_timeout_s}, "
                             f"{self.retry_backoff_s} and {self.sessions}")
        if not self.retry_backoff_max_s >= self.retry_backoff_s:
            raise ValueError(f"retry_backoff_max_s must be at least retry_backoff_s "
                             f"({self.retry_backoff_s}), got {self.retry_backoff_max_s}")


def _check_deadline(deadline_s: float) -> None:
    """A command's deadline: its copies are all stamped within it, and a state machine tells
    a late copy of a command whose session it forgot by its stamp only if the deadline is
    well under half the session lifetime (statemachine/sessions.py: SESSION_TTL_MS_MIN)."""
    if not 0 < deadline_s <= DEADLINE_S_MAX:
        raise ValueError(f"a command's deadline_s must lie in (0, {DEADLINE_S_MAX}], "
                         f"got {deadline_s}")


class _Connection:
    """One connection to one replica: requests multiplexed by id, a reader task dispatching,
    one task expiring the requests that wait too long."""

    def __init__(self, endpoint: str, stream: FrameStream) -> None:
        self.endpoint = endpoint
        self._stream = stream
        self.answers: Awaited[Response] = Awaited()  # by request id; made in the event loop
        self._ids = 0
        self.outbox = Outbox(stream)  # requests of every caller, many per write
        self.broken = False
        self._closed = False  # whether the stream was closed (or is being closed)

    async def read_responses(self) -> None:
        try:
            while True:
                response = decode_response(await self._stream.receive())
                self.answers.answer(response.request_id, response)
        except _BROKEN:
            pass
        finally:
            self._break()
        await self.close()  # not when cancelled: the client leaving closes it

    def _break(self) -> None:
        """The connection is unusable: wake every waiting caller (they find no response), and
        the writer, which ends."""
        self.broken = True
        self.outbox.close()
        self.answers.close()

    async def request(self, encode: Encode, deadline: float) -> Response | None:
        """The response to `encode(request id)`, or None once `deadline` (anyio's clock)
        passes or the connection breaks."""
        if self.broken:
            return None
        self._ids += 1
        request_id = self._ids
        try:  # queued before the answer is awaited: nothing can answer before this yields
            self.outbox.put(encode(request_id))
        except anyio.BrokenResourceError:  # the writer ended
            return None
        except ValueError as error:  # over the frame cap, so never queued
            raise Rejected(f"{error}; not sent") from None
        answer = self.answers.wait(request_id, deadline)
        try:
            return await answer
        finally:
            self.answers.forget(request_id)

    async def request_held(self, encode: Encode, deadline: float) -> Response | None:
        """`request`, for one the replica holds by design (a watch): given up on unanswered
        (the caller cancelled, or `deadline` passed) while the connection stays up, it is
        called off there (module docstring)."""
        sent: list[int] = []  # its id, once encoded

        def tagged(request_id: int) -> bytes:
            sent.append(request_id)
            return encode(request_id)

        response = None
        try:
            response = await self.request(tagged, deadline)
        finally:
            if response is None and sent and not self.outbox.broken:
                self.outbox.put(encode_request(Cancel(sent[0])))  # never waits
        return response

    async def write_requests(self) -> None:
        try:
            await self.outbox.run()
        except (*_BROKEN, ValueError):  # ValueError (a frame over the cap) `put` refuses first
            pass
        finally:
            self._break()
        await self.close()

    async def close(self) -> None:
        """Break the connection and close its stream, once, within CLOSE_TIMEOUT_S: the reader
        ends on the closed stream, the writer on the break. Left open, every reconnect leaked
        a socket and a task."""
        self._break()
        if not self._closed:
            self._closed = True
            with anyio.move_on_after(CLOSE_TIMEOUT_S):
                await self._stream.aclose()


class _Dial:
    """A connection being made to one endpoint, which every caller that needs it awaits."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: Exception | None = None  # set when it failed; None when abandoned


class CellarClient:
    def __init__(self, endpoints: Sequence[str], connect: Connect,
                 config: ClientConfig = ClientConfig(), *, first: int | None = None,
                 wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
                 rng: random.Random | None = None) -> None:
        if not endpoints:
            raise ValueError("a client needs at least one replica endpoint")
        self._endpoints = list(endpoints)
        self._now: Callable[[], float] = anyio.current_time  # the loop's own, once entered
        self._wall_ms = wall_ms  # a command's send time, which bounds its replica's stamp
        self._connect = connect
        self.config = config
        self._rng = rng or random.Random()  # the retry pauses' jitter (module docstring)
        # Clients start at different replicas (`first`, or one at random), so each replica
        # leads its share of the commands: SDPaxos spreads replication over every replica.
        self._preferred = secrets.randbelow(len(self._endpoints)) if first is None else first
        self._connections: dict[str, _Connection] = {}
        self._dials: dict[str, _Dial] = {}  # at most one dial per endpoint at a time
        self._sessions = SessionPool(config.sessions)
        self._route = SequencerRoute(self._endpoints) if config.prefer_sequencer else None
        # The last rotation made (`_rotation`), for the first endpoint and the sequencer's it
        # was made for: the same list until either changes (never changed in place)
        self._rotated: list[str] = []
        self._rotated_for: tuple[int, str | None] = (-1, None)
        self._stack = AsyncExitStack()
        self._tasks: TaskGroup | None = None

    async def __aenter__(self) -> CellarClient:
        self._tasks = await self._stack.enter_async_context(anyio.create_task_group())
        self._now = loop_clock()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> bool:
        assert self._tasks is not None
        try:
            # Shielded and bounded: a client leaving because its caller was cancelled must
            # still close its connections and exit its task group, in that order.
            with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                for connection in list(self._connections.values()):
                    await connection.close()
        finally:
            self._tasks.cancel_scope.cancel()
            suppress = await self._stack.__aexit__(kind, error, traceback)
        return bool(suppress)

    def start_soon(self, function: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Run `function(*args)` as a task of the client's, cancelled when the client closes:
        work a caller hands off, as a batch of puts that outlives any one of its callers
        (cellar/kv/put_batches.py). The task's errors are its own to handle: one that escapes
        closes the client."""
        if self._tasks is None:
            raise RuntimeError("use the client in `async with`")
        self._tasks.start_soon(function, *args)

    async def _connection(self, endpoint: str) -> _Connection:
        """The live connection to `endpoint`, dialed when there is none. One dial per endpoint
        at a time: callers that come meanwhile wait for it and share its outcome (each dialing
        its own left all but the last connection open for the client's lifetime); if its
        dialer was cancelled, one of them dials again."""
        while True:
            connection = self._connections.get(endpoint)
            if connection is not None and not connection.broken:
                return connection
            dial = self._dials.get(endpoint)
            if dial is None:
                return await self._dial(endpoint)
            await dial.done.wait()
            if dial.error is not None:
                raise ConnectionError(f"{endpoint}: {dial.error}") from dial.error

    async def _dial(self, endpoint: str) -> _Connection:
        assert self._tasks is not None, "use the client in `async with`"
        dial = self._dials[endpoint] = _Dial()
        try:
            connection = _Connection(endpoint, await self._connect(endpoint))
        except Exception as error:
            dial.error = error
            raise
        finally:  # the waiters look again: at the connection, or at the error
            del self._dials[endpoint]
            dial.done.set()
        self._connections[endpoint] = connection  # before any waiter runs: no await since
        self._tasks.start_soon(connection.read_responses)
        self._tasks.start_soon(connection.write_requests)
        self._tasks.start_soon(connection.answers.run)
        return connection

    def _rotation(self, now: float) -> list[str]:
        """The endpoints in the order to try them: the preferred one first."""
        first = self._preferred % len(self._endpoints)
        route = self._route
        lead = None
        if route is not None:
            if route.claim_look(now) and self._tasks is not None:
                self._tasks.start_soon(route.look, self._ask_status, self._now)
            lead = route.endpoint
        rotated_for = self._rotated_for
        if rotated_for[0] == first and rotated_for[1] == lead:  # as last time (per command)
            return self._rotated
        rotation = self._endpoints[first:] + self._endpoints[:first]
        if lead is not None:
            rotation.remove(lead)
            rotation.insert(0, lead)
        self._rotated, self._rotated_for = rotation, (first, lead)
        return rotation

    def _move_on(self, endpoint: str) -> None:
        """`endpoint` failed a request: if it is the one tried first, start the next try
        elsewhere. Only then: callers failing together at one replica (its connection broke
        under them, or its one dial failed) stepped on once each, and two of them, with two
        replicas, stepped round to the one that failed."""
        if self._endpoints[self._preferred % len(self._endpoints)] == endpoint:
            self._preferred += 1
        route = self._route
        if route is not None and route.endpoint == endpoint:
            route.forget()

    async def _ask_status(self, endpoint: str) -> dict[str, Any] | None:
        """`endpoint`'s status, or None whatever kept it from answering."""
        try:
            return await self.status(endpoint)
        except (ClientError, InvalidMessage):
            return None

    # --- commands --------------------------------------------------------------------------

    async def propose(self, body: bytes, *, deadline_s: float | None = None,
                      not_applied: NotApplied | None = None) -> bytes:
        """Apply `body` exactly once and return the state machine's reply. `not_applied`
        names the replies that say the command's session refused it, remembering nothing
        (module docstring): one that comes after a copy that may still be applied is
        OutcomeUnknown. (One coroutine from here to the connection's waiter while the first
        replica answers: this runs per command.)"""
        _check_body(body, "a command")
        if deadline_s is None:
            deadline_s = self.config.deadline_s
        else:
            _check_deadline(deadline_s)
        now = self._now()
        deadline = now + deadline_s  # waiting for a session counts against it
        session = self._sessions.take_nowait() or await self._session_by(deadline, deadline_s)
        session.sequence += 1
        name, sequence = session.name, session.sequence
        timeout_ms = int(self.config.attempt_timeout_s * 1000)
        sent_ms = self._wall_ms()  # every try carries the first's: a late copy is stamped old

        def encode(request_id: int) -> bytes:
            return encode_propose(request_id, name, sequence, body, timeout_ms=timeout_ms,
                                  sent_ms=sent_ms)

        handed_over = False  # whether a try may have reached a replica
        unreached: _NotSent | None = None  # the last try that could not connect
        refused = ""  # what the last OVERLOADED answer said
        backoff: Backoff | None = None  # made at the first pause: most commands take none
        try:  # not contextlib.suppress: that costs 0.6 us, and this runs once per command
            while True:
                for endpoint in self._rotation(now):
                    try:
                        response = self._judged(
                            endpoint, await self._attempt(endpoint, encode, deadline))
                    except _NotSent as error:
                        unreached = _unreached(unreached, error)
                        continue
                    if response is None:
                        handed_over = True
                        continue
                    if response.code is Code.OK:
                        if handed_over and not_applied is not None and \
                                (why := not_applied(response.payload)) is not None:
                            raise _refused_after_retry(why, name, sequence)
                        return response.payload
                    if (refusal := _refusal(response)) is not None:
                        raise refusal
                    handed_over |= response.code is Code.UNKNOWN
                    if response.code is Code.OVERLOADED:
                        refused = response.message
                    backoff = await self._pause(deadline, backoff)
                backoff = await self._pause(deadline, backoff)
        except _Expired:  # _attempt raises it once the deadline passed
            raise _no_result(handed_over, deadline_s, name, sequence, unreached,
                             refused=refused) from None
        finally:
            self._sessions.give_back(session)

    async def _session_by(self, deadline: float, deadline_s: float) -> Session:
        """A session, in turn, once every one is in use; Unavailable when none comes free
        before `deadline` (nothing was sent)."""
        session = await self._sessions.take(deadline - self._now())
        if session is None:
            raise Unavailable(f"no session came free within {deadline_s:.1f} s (all "
                              f"{self.config.sessions} in use); the command was not sent")
        return session

    def _backoff(self) -> Backoff:
        """One request's retry pauses (module docstring)."""
        return Backoff(self.config.retry_backoff_s, self.config.retry_backoff_max_s, self._rng)

    async def _pause(self, deadline: float, backoff: Backoff | None) -> Backoff:
        """Sleep the next of a request's pauses (`backoff`, made when None), cut to what is
        left before `deadline`; returns `backoff`."""
        if backoff is None:
            backoff = self._backoff()
        await anyio.sleep(max(0.0, min(backoff.next_delay_s(), deadline - self._now())))
        return backoff

    def _attempt(self, endpoint: str, encode: Encode, deadline: float, held_s: float = 0.0
                 ) -> Awaitable[Response | None]:
        """One try at one replica, within `deadline` (anyio's clock): what to await for the
        response, None when the request went out but no reply came back. Raises _Expired once
        the deadline passed, and the awaitable raises _NotSent when no connection could be
        made. A plain function: on a live connection the caller awaits the request itself,
        and the connection's timer keeps the deadline (no cancel scope per try). `held_s`:
        how long the replica may hold the request by design (a watch's wait)."""
        now = self._now()
        if now >= deadline:
            raise _Expired
        connection = self._connections.get(endpoint)
        if connection is None or connection.broken:
            return self._connect_and_request(endpoint, encode, deadline, held_s)
        if held_s:
            return self._request_on(connection, encode, now, deadline, held_s)
        # `_request_on`, inline (once per command)
        return connection.request(
            encode, min(now + (self.config.attempt_timeout_s + _ANSWER_MARGIN_S), deadline))

    def _request_on(self, connection: _Connection, encode: Encode, now: float, deadline: float,
                    held_s: float) -> Awaitable[Response | None]:
        """The try on `connection`; one the replica holds (a watch) is called off if given up
        on."""
        request = connection.request_held if held_s else connection.request
        return request(encode, min(now + self._try_margin_s() + held_s, deadline))

    def _try_margin_s(self) -> float:
        """What a try waits for its answer beyond the time the replica may hold it."""
        return self.config.attempt_timeout_s + _ANSWER_MARGIN_S

    async def _connect_and_request(self, endpoint: str, encode: Encode, deadline: float,
                                   held_s: float) -> Response | None:
        try:  # a replica whose host drops packets costs connect_timeout_s, not the deadline
            with anyio.fail_after(min(deadline - self._now(), self.config.connect_timeout_s)):
                connection = await self._connection(endpoint)
        except (*_BROKEN, TimeoutError) as error:
            self._move_on(endpoint)
            raise _NotSent from error
        return await self._request_on(connection, encode, self._now(), deadline, held_s)

    def _judged(self, endpoint: str, response: Response | None) -> Response | None:
        """`response`, after moving on from its replica, `endpoint`, if it gave none or
        cannot serve."""
        if response is None or response.code in _MOVE_ON:
            self._move_on(endpoint)
        return response

    async def read(self, query: bytes, *, deadline_s: float | None = None) -> bytes:
        """A linearizable read of `query`."""
        _check_body(query, "a query")
        if deadline_s is None:
            deadline_s = self.config.deadline_s
        elif not deadline_s > 0:  # 0 had meant the default deadline
            raise ValueError(f"a read's deadline_s must be positive, got {deadline_s}")
        timeout_ms = int(self.config.attempt_timeout_s * 1000)
        response = await self._ask_around(
            lambda request_id: encode_request(Read(request_id, query, timeout_ms)),
            self._now() + deadline_s, "read")
        return response.payload

    async def watch(self, query: bytes, after_slot: int, *, wait_s: float = 10.0
                    ) -> tuple[bytes, int]:
        """Run `query` once some replica executed past `after_slot` (or `wait_s` passed):
        returns the result and that replica's executed slot, to resume from, never below
        `after_slot`. Tried across the replicas as a read is, for the client's deadline_s on
        top of `wait_s`; a replica that answers behind `after_slot` (cut off from its peers,
        its state older than what the caller has seen) is moved on from as one that did not
        answer, and Unavailable is raised when none answers at or past it in time."""
        _check_body(query, "a query")
        if not 0 <= wait_s <= WAIT_S_MAX:
            raise ValueError(f"a watch's wait_s must lie in [0, {WAIT_S_MAX}], got {wait_s}")
        deadline = self._now() + self.config.deadline_s + wait_s
        # a try's margin for the answer (the first try waits the whole of wait_s)
        margin_s = min(self._try_margin_s(), self.config.deadline_s)

        def encode(request_id: int) -> bytes:
            # A try asks for no longer a wait than is left before the deadline, less a try's
            # margin: a retry after a replica that hung asked the next for the whole wait
            # again, and the client gave up on it at the deadline while it held the watch.
            left_ms = int((deadline - self._now() - margin_s) * 1000)
            wait_ms = max(0, min(int(wait_s * 1000), left_ms))
            return encode_request(Watch(request_id, query, after_slot, wait_ms))

        response = await self._ask_around(encode, deadline, f"watch at slot {after_slot} "
                                          "or later", held_s=wait_s, after_slot=after_slot)
        return response.payload, response.slot

    async def _ask_around(self, encode: Encode, deadline: float, what: str,
                          held_s: float = 0.0, after_slot: int = -1) -> Response:
        """The first OK response to a query, trying the replicas in turn with a pause after
        each round (a restart or a failover may leave none up for a moment) until `deadline`
        (anyio's clock): a refusal is raised, and Unavailable once the deadline passed. An
        OK answer at a slot below `after_slot` (a watch's) counts as none (`_behind`)."""
        unreached: _NotSent | None = None  # the last try that could not connect
        refused = ""  # what the last OVERLOADED answer said
        backoff: Backoff | None = None
        try:  # not contextlib.suppress, as in propose
            while True:
                for endpoint in self._rotation(self._now()):
                    try:
                        response = self._judged(endpoint, _behind(
                            await self._attempt(endpoint, encode, deadline, held_s),
                            after_slot))
                    except _NotSent as error:
                        unreached = _unreached(unreached, error)
                        continue
                    if response is not None and response.code is Code.OK:
                        return response
                    if response is not None and (refusal := _refusal(response)) is not None:
                        raise refusal
                    if response is not None and response.code is Code.OVERLOADED:
                        refused = response.message
                backoff = await self._pause(deadline, backoff)
        except _Expired:
            pass
        raise Unavailable(f"no replica answered the {what} in time{_last_failure(unreached)}"
                          f"{_last_refusal(refused)}")

    async def status(self, endpoint: str) -> dict[str, Any]:
        deadline = self._now() + self.config.deadline_s
        try:
            response = self._judged(
                endpoint, await self._attempt(endpoint, _encode_status, deadline))
        except _NotSent as error:  # say why (a TLS handshake refused), not only "did not answer"
            why = str(error.__cause__).removeprefix(f"{endpoint}: ") or "no connection"
            raise Unavailable(f"{endpoint} could not be reached: {why}") from error
        except _Expired:
            response = None
        if response is not None and (refusal := _refusal(response)) is not None:
            raise refusal
        if response is None or response.code is not Code.OK:
            raise Unavailable(f"{endpoint} did not answer")
        return decode_status(response.payload)
