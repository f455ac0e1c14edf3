"""Serving clients: requests from one authenticated connection in, responses out.

The principal comes from the client's certificate, never from the request: the server stamps
it onto each command's envelope with the replica's stamp clock (`now_ms`: the driver's, which
slews a step of the wall clock in, consensus/runtime/stamp_clock.py), so the state machine can
refuse a node agent acting for another node or a non-admin issuing admin commands. The stamp is no
later than the client's send time allows (`SENT_MS_SLACK_MS`): a copy that arrives minutes
late cannot pass for a fresh command and reopen a session forgotten meanwhile. Requests on one
connection are answered concurrently (bounded: a permit per request until its answer is
written), each response tagged with its request id; commands and reads are handed to the driver
with a callback, and their responses leave through the connection's `Outbox`, many per write.
A request that does not decode is answered BAD_REQUEST and counted, with its request id when
that much of it can be read (else the client could not match the answer and would wait out its
deadline); the connection goes on.
A command or read is waited for at least WAIT_MS_MIN, whatever timeout it asks: with none, its
answer (and its permit) came back at once while the command stayed queued in the core, so one
connection could queue commands without bound (the driver's byte budget now bounds that too).
A node agent's commands (a node-role principal's, no other) may use the reserve the driver keeps
for them past that budget (consensus/runtime/proposal_budget.py): its heartbeats go through a
flood of other clients' commands. Each agent has a share of that reserve, so that one agent
cannot hold all of it (consensus/runtime/node_reserve.py), held until the driver lets go of the
command's bytes (its `released` callback), not only until its answer.

A state machine that gates queries (`consensus.state_machine.QueryGate`) is asked before a read
or watch goes to the driver: one it refuses is answered REFUSED with its reason, and counted;
one that does not decode is answered BAD_REQUEST, and counted as a bad request. What the driver
runs, for a read and for every answer of a watch, is the query the gate hands back, which may
be narrower than the one asked (a node agent's whole-gang query becomes its node's share).

A watch waits in a task of its own, under a cancel scope the connection keeps by request id
(`_Answers.watches`) while it waits: a Cancel naming that id (the client gave up on the watch,
its connection still up) ends the wait at once, which gives back its place in the watch budget,
and nothing is answered for either; its permit and the Cancel's come back at once. Unknown or
already answered ids are ignored. Without it, a watch given up on held its place for its whole
wait (up to ten minutes), and 16 of them locked its client identity out of watches here.

Permits bound how many answers wait for a client, not their bytes. While more than
ANSWERS_QUEUED_BYTES_MAX of them wait unwritten, the server takes no new request from it; a
client whose answers stay over that bound with no write going through for ANSWERS_STALL_S (it
stopped reading) is dropped and counted, so a thousand large answers do not stay in the
replica's memory for as long as it idles. A burst over the bound that a reader drains is only
paused, never dropped. That stall is also looked for once every ANSWERS_STALL_S by a task of
its own: a client silent after one burst leaves the reader waiting in `receive` for good, and
its answers (those being written included) held the server's budget for as long as its kernel
kept the connection. The bound is checked between requests, while the answers come later: a
client that sends a thousand requests in one burst has them all taken before the first is
answered. So no connection holds more than ANSWERS_HELD_FACTOR times the bound: an answer past
that is replaced by a short error (OVERLOADED for a query, UNKNOWN for a command's reply, which
a retry under the same session gets again), counted in `server.answers_shed`.
An answer that cannot be written (the client hung up) ends the
connection at once: with every permit taken the reader waits for one and would never see the
end of the stream, holding the listener's place for good.

ANSWERS_QUEUED_BYTES_MAX is per connection, and one client identity may hold an eighth of the
listener's places (listener.py): 128 silent connections held ANSWERS_HELD_FACTOR times the
bound each, 32 GiB at the defaults (and all 1024 places, 256 GiB). So the server also counts
the answer bytes all its connections hold unwritten (queued, or in a write not yet through)
against one budget, `answers_bytes_max` (ANSWERS_SERVER_BYTES_MAX). While they are over it, a
connection holding more than its fair share, ANSWERS_FAIR_BYTES, takes no new request, as one
over its own bound (and is dropped the same way, after ANSWERS_STALL_S with no write); one
holding less goes on, so a client that reads its answers is still served, pausing at most until
its own are written. An answer that would take the total past ANSWERS_HELD_FACTOR times the
budget is shed as above, unless its connection stays within its fair share: all together hold
at most that plus a fair share each (and the short errors). A connection that ends gives back
what it held.

No frame over the connection's cap is ever queued (the writer would fail, and with it the
connection's task group and the listener): an answer too large to send (a query's result, a
command's reply, the status) is answered TOO_LARGE instead, counted, and the connection goes
on. Error messages are cut to what the client's decoder takes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio

from consensus.codec import encode_envelope_of
from consensus.envelope import Principal, Role
from consensus.errors import InvalidMessage, QueryRefused
from consensus.runtime.client_codec import (
    RESPONSE_MESSAGE_LENGTH_MAX,
    Cancel,
    Code,
    Propose,
    Read,
    Response,
    Status,
    Watch,
    decode_request_fields,
    encode_ok,
    encode_response,
    encode_status,
    request_id_of,
)
from consensus.runtime.deadlines import Doorbell, running_asyncio_loop
from consensus.runtime.driver import Done, Driver, Overloaded, QueryFailed
from consensus.runtime.framing import FramedConnection, TransportError
from consensus.runtime.metrics import Metrics
from consensus.runtime.node_reserve import NodeReserve
from consensus.runtime.outbox import Outbox
from consensus.runtime.streams import FrameStream

INFLIGHT_PER_CONNECTION_MAX = 1024
WAIT_MS_MIN = 100  # the least a command or read is waited for (module docstring)
# A command is stamped no later than its client's send time plus this (clocks differ): a copy
# delivered long after its client moved on (a partition TCP rode out, a replica stopped for
# minutes) is stamped old, so a session forgotten meanwhile is not opened again by it (the
# session layer opens one only for a command stamped within its window). Smaller than that
# window (statemachine/sessions.py, checked in tests), or a late copy could still open it.
SENT_MS_SLACK_MS = 60_000
ANSWERS_QUEUED_BYTES_MAX = 64 << 20  # per connection; past it no request is taken (docstring)
ANSWERS_HELD_FACTOR = 4  # times ANSWERS_QUEUED_BYTES_MAX: answers past it are shed (docstring)
ANSWERS_STALL_S = 30.0  # over that bound with no write for this long: the client is dropped
ANSWERS_SERVER_BYTES_MAX = 256 << 20  # of all connections together; shed past 4 times it
ANSWERS_FAIR_BYTES = 1 << 20  # a connection holding less is never held up by that (docstring)


class ClientServer:
    def __init__(self, driver: Driver, *, now_ms: Callable[[], int] | None = None,
                 inflight_max: int = INFLIGHT_PER_CONNECTION_MAX,
                 status: Callable[[], dict[str, Any]] | None = None,
                 admit_query: Callable[[Principal, bytes], bytes] | None = None,
                 answers_bytes_max: int = ANSWERS_SERVER_BYTES_MAX) -> None:
        self._driver = driver
        # the replica's one stamp clock, the driver's (consensus/runtime/stamp_clock.py), read
        # once per turn of the loop
        self._stamp = _TurnStamp(now_ms if now_ms is not None else driver.stamp_ms)
        self._inflight_max = inflight_max
        self._status = status or driver.status
        self._admit_query = admit_query
        self._budget = _AnswerBudget(answers_bytes_max)  # shared by every connection
        self._node_reserve = NodeReserve(driver.metrics)  # each node agent's share

    @property
    def answers_held_bytes(self) -> int:
        """The bytes of answers every connection holds unwritten."""
        return self._budget.held_bytes

    async def serve(self, principal: Principal, connection: FrameStream) -> None:
        """Answer requests until the client hangs up."""
        self._driver.metrics.count("server.connections")
        limiter = anyio.Semaphore(self._inflight_max)  # a permit per request until answered
        ended: TransportError | None = None
        answers = _Answers(connection, limiter, self._driver.metrics, self._budget)
        outbox = answers.outbox
        waiting = connection if isinstance(connection, FramedConnection) else None
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(answers.write_until_broken, tasks.cancel_scope)
                tasks.start_soon(answers.drop_when_stalled, tasks.cancel_scope)
                while not outbox.broken:
                    if answers.over() and \
                            not await answers.drained():  # (no coroutine per request otherwise)
                        self._driver.metrics.count("server.slow_clients_dropped")
                        break
                    try:
                        frame = await connection.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError,
                            anyio.ClosedResourceError):
                        break
                    except TransportError as error:  # an oversized or truncated frame
                        ended = error
                        break
                    try:  # a permit; no yield to the loop unless none is free (anyio's
                        limiter.acquire_nowait()  # `acquire` always yields: a loop pass per
                    except anyio.WouldBlock:      # request under load)
                        await limiter.acquire()
                    # The turn is taken here only after the last request already read: each
                    # before it would have its own (reads are answered within theirs)
                    claimed = not (waiting is not None and waiting.frames_waiting) and \
                        self._driver.claim_turn()
                    try:  # claimed: this task runs the turn that takes it (driver.py)
                        self._dispatch(principal, frame, answers, tasks)
                    finally:
                        if claimed:
                            await self._driver.turn_here()
                tasks.cancel_scope.cancel()
        finally:
            answers.end()
        if ended is not None:
            raise ended  # outside the task group: the listener counts it and drops the client

    def _dispatch(self, principal: Principal, frame: bytes, answers: _Answers,
                  tasks: anyio.abc.TaskGroup) -> None:
        """Commands and reads go to the driver with a callback (no task each); the rare
        watches and status requests get a task."""
        try:
            request = decode_request_fields(frame)
        except InvalidMessage as error:
            self._driver.metrics.count("server.bad_requests")
            answers.error(request_id_of(frame), Code.BAD_REQUEST, error.reason)
            return
        if not isinstance(request, list):  # not the fields of a propose
            if not isinstance(request, Propose):
                self._dispatch_other(principal, request, answers, tasks)
                return
            request = [0, request.request_id, request.session, request.sequence, request.body,
                       request.timeout_ms, request.sent_ms]  # from a client of an earlier build
        # a propose's fields, as decoded (one per command)
        _, request_id, session, sequence, body, timeout_ms, sent_ms = request
        if not self._driver.running:
            answers.error(request_id, Code.UNAVAILABLE, "the replica is not running")
            return
        command = encode_envelope_of(principal, session, sequence, self._stamp_ms(sent_ms),
                                     body)
        done = partial(answers.done, request_id, _REPLY)  # `responder`, inline
        timeout_s = (timeout_ms if timeout_ms > WAIT_MS_MIN else WAIT_MS_MIN) / 1000
        if principal.role is Role.NODE:
            # a node agent's share, held until the driver lets go of the bytes
            # (node_reserve.py)
            released = self._node_reserve.claim(principal.name, len(command))
            self._driver.submit(command, timeout_s, done, reserved=released is not None,
                                released=released)
        else:
            self._driver.submit(command, timeout_s, done)

    def _dispatch_other(self, principal: Principal, request: Read | Watch | Status | Cancel,
                        answers: _Answers, tasks: anyio.abc.TaskGroup) -> None:
        """`_dispatch` of a request other than a command."""
        if not self._driver.running and not isinstance(request, Cancel):
            answers.error(request.request_id, Code.UNAVAILABLE, "the replica is not running")
        elif isinstance(request, Cancel):
            answers.call_off(request.request_id)
        elif isinstance(request, Status):
            tasks.start_soon(self._answer_status, request, answers)
        else:
            query = self._admitted(principal, request, answers)
            if query is None:  # refused, and answered so
                return
            if isinstance(request, Read):
                self._driver.submit_read(query, max(request.timeout_ms, WAIT_MS_MIN) / 1000,
                                         answers.responder(request.request_id, _ANSWER))
            else:  # a watch: its scope kept before its task ever runs
                tasks.start_soon(self._watch, principal, request, query, answers,
                                 answers.waiting(request.request_id))

    def _stamp_ms(self, sent_ms: int) -> int:
        """This replica's stamp (read once per turn of the loop: `_TurnStamp`), but no later
        than the client's send time allows (0: the client did not say)."""
        now_ms = self._stamp.now_ms()
        return min(now_ms, sent_ms + SENT_MS_SLACK_MS) if sent_ms else now_ms

    def _admitted(self, principal: Principal, request: Read | Watch,
                  answers: _Answers) -> bytes | None:
        """The query to run for `principal`, as the state machine's gate hands it back
        (possibly narrowed); None, answered so, if the gate refuses it."""
        if self._admit_query is None:
            return request.query
        try:
            return self._admit_query(principal, request.query)
        except InvalidMessage as error:  # not a query at all
            self._driver.metrics.count("server.bad_requests")
            answers.error(request.request_id, Code.BAD_REQUEST, error.reason)
        except QueryRefused as refused:
            self._driver.metrics.count("server.queries_refused")
            answers.error(request.request_id, Code.REFUSED, refused.reason)
        return None

    async def _answer_status(self, request: Status, answers: _Answers) -> None:
        answers.put(request.request_id,
                    encode_ok(request.request_id, encode_status(self._status())), "the status")

    async def _watch(self, principal: Principal, request: Watch, query: bytes,
                     answers: _Answers, waiting: anyio.CancelScope) -> None:
        """Answer `request`, running `query` (its query as the gate admitted it), once there
        is news or its wait passed; nothing once `waiting` is cancelled (called off: the
        module docstring)."""
        request_id = request.request_id
        try:
            with waiting:
                result, slot = await self._driver.local_read(
                    query, request.after_slot, request.wait_ms / 1000, principal)
                answers.put(request_id,
                            encode_response(Response(request_id, Code.OK, result, slot)), _ANSWER)
                return
        except Overloaded as error:  # past the watches' budget or the principal's share
            answers.error(request_id, Code.OVERLOADED, str(error))
            return
        except QueryFailed as error:
            answers.error(request_id, Code.BAD_REQUEST, str(error))
            return
        finally:
            answers.waited(request_id, waiting)
        answers.unanswered()  # called off


class _TurnStamp:
    """The replica's stamp clock (`now_ms`), read once per turn of the event loop: the
    commands the server takes in one turn (those one read of a connection brought, and every
    other connection's taken in that turn) carry one stamp, as if read together. A reading
    costs a dozen calls, most of the server's own work for a small command; a stamp is at most
    one turn old, and stamps still never go back. Under a backend without an asyncio loop
    (trio), every command reads the clock."""

    __slots__ = ("_loop", "_loop_known", "_now_ms", "_stamp_ms")

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self._now_ms = now_ms
        self._stamp_ms: int | None = None  # this turn's, once read
        self._loop: Any = None  # asyncio.AbstractEventLoop, once looked up
        self._loop_known = False

    def now_ms(self) -> int:
        stamp_ms = self._stamp_ms
        if stamp_ms is not None:
            return stamp_ms
        stamp_ms = self._now_ms()
        if not self._loop_known:
            self._loop, self._loop_known = running_asyncio_loop(), True
        if self._loop is not None:
            self._stamp_ms = stamp_ms
            self._loop.call_soon(self._turn_over)
        return stamp_ms

    def _turn_over(self) -> None:
        self._stamp_ms = None


# What an answer too large to send was, for the client's error message:
_REPLY = "the command's reply; the command was applied, its result is lost"
_ANSWER = "the query's answer; ask for less"


class _AnswerBudget:
    """The bytes of answers all of one server's connections hold unwritten, and its budget
    for them (module docstring)."""

    __slots__ = ("bytes_max", "held_bytes", "held_max")

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max  # past it, a connection over its fair share waits
        self.held_max = ANSWERS_HELD_FACTOR * bytes_max  # past it, answers are shed
        self.held_bytes = 0


class _Answers:
    """One connection's way out: each answer queued on its outbox within the connection's
    frame cap (TOO_LARGE in its place when it is over), each returning its request's permit
    once written, its bytes counted in the server's budget until then."""

    __slots__ = ("_budget", "_limiter", "_metrics", "_writes", "_written", "held_bytes",
                 "outbox", "watches")

    def __init__(self, connection: FrameStream, limiter: anyio.Semaphore, metrics: Metrics,
                 budget: _AnswerBudget) -> None:
        self._limiter = limiter
        self._metrics = metrics
        self._budget = budget
        self._written = Doorbell()  # rung after each write
        self._writes = 0  # writes gone through, for `drop_when_stalled`
        self.held_bytes = 0  # of the answers queued or being written, all in `budget` too
        self.outbox = Outbox(connection, on_written=self._wrote)
        self.watches: dict[int, anyio.CancelScope] = {}  # waiting, by request id (a Cancel's)

    def over(self) -> bool:
        """Whether to take no request now: over this connection's own bound, or over its fair
        share while the server is over its budget (module docstring)."""
        budget = self._budget
        return self.held_bytes > ANSWERS_QUEUED_BYTES_MAX or (
            budget.held_bytes > budget.bytes_max and self.held_bytes > ANSWERS_FAIR_BYTES)

    def end(self) -> None:
        """The connection is over: no more answers, and what it held goes back to the
        budget (its writer may have been cancelled before it ever ran, leaving it open)."""
        self.outbox.close()
        self._hold(-self.held_bytes)

    def _wrote(self, permits: int, size: int) -> None:
        self._writes += 1
        self._hold(-size)
        self._release(permits)

    def _release(self, permits: int) -> None:
        for _ in range(permits):
            self._limiter.release()
        self._written.ring()

    async def write_until_broken(self, connection: anyio.CancelScope) -> None:
        """The client hanging up ends the writer quietly, and with it the `connection`'s
        scope: its reader may be waiting for a permit, which only a written answer gives
        back (or in `drained`, for a write), and would wait for ever."""
        try:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await self.outbox.run()
        finally:
            connection.cancel()

    async def drop_when_stalled(self, connection: anyio.CancelScope) -> None:
        """End the `connection` (counted) once its answers stayed over the bound through a
        whole ANSWERS_STALL_S with no write going through, whatever its reader waits for: a
        client silent after one burst leaves the reader in `receive` (or waiting for a
        permit) for ever, so the reader's own check (`drained`) never runs, and its answers
        held their place in the server's budget for as long as its kernel kept the
        connection open. One look per ANSWERS_STALL_S: a timer, not a task per answer."""
        writes, was_over = self._writes, False
        while True:
            await anyio.sleep(ANSWERS_STALL_S)
            over = self.over()
            if over and was_over and self._writes == writes:
                self._metrics.count("server.slow_clients_dropped")
                connection.cancel()
                return
            writes, was_over = self._writes, over

    async def drained(self) -> bool:
        """Once this connection may take requests again (`over` no longer; at once if so);
        False if a whole ANSWERS_STALL_S passed over it without a write going through."""
        while self.over() and not self.outbox.broken:
            if not await self._written.sleep(ANSWERS_STALL_S):
                return False
        return True

    def responder(self, request_id: int, what: str) -> Done:
        """The driver's callback for one command or read (made with no call of ours: the
        server makes one per command)."""
        return partial(self.done, request_id, what)

    def done(self, request_id: int, what: str, reply: bytes | None,
             error: Exception | None) -> None:
        """The answer to `request_id`, from the driver (through `responder`)."""
        if reply is not None:
            self.put(request_id, encode_ok(request_id, reply), what)
        elif isinstance(error, Overloaded):
            self.error(request_id, Code.OVERLOADED, str(error))
        elif isinstance(error, QueryFailed):
            self.error(request_id, Code.BAD_REQUEST, str(error))
        else:  # OutcomeUnknown: timed out, or the replica stopped
            self.error(request_id, Code.UNKNOWN, str(error))

    def error(self, request_id: int, code: Code, message: str) -> None:
        self.put(request_id, encode_response(Response(
            request_id, code, message=message[:RESPONSE_MESSAGE_LENGTH_MAX])), "an error",
                 unknown=code is Code.UNKNOWN)

    def put(self, request_id: int, frame: bytes, what: str, *, unknown: bool = False) -> None:
        """Queue `frame`, the answer to `request_id`; TOO_LARGE in its place when it is over
        the cap. Never raises: the driver calls this from its own task. `unknown`: the frame
        says UNKNOWN (a command that may still be applied), which a shed must keep saying:
        OVERLOADED would tell the client that nothing was proposed."""
        outbox = self.outbox
        if outbox.broken:  # the client is gone (put would raise)
            return
        budget = self._budget
        size = len(frame)
        if self.held_bytes + size > ANSWERS_HELD_FACTOR * ANSWERS_QUEUED_BYTES_MAX or (
                budget.held_bytes + size > budget.held_max and
                self.held_bytes + size > ANSWERS_FAIR_BYTES):
            self._metrics.count("server.answers_shed")
            code = Code.UNKNOWN if unknown or what == _REPLY else Code.OVERLOADED
            frame = encode_response(Response(request_id, code, message=(
                f"{what}: not sent, the answers not read hold {self.held_bytes} bytes on "
                f"this connection, {budget.held_bytes} on this replica"
            )[:RESPONSE_MESSAGE_LENGTH_MAX]))
        if self._queued(frame):
            return
        self._metrics.count("server.answers_too_large")
        too_large = encode_response(Response(request_id, Code.TOO_LARGE, message=(
            f"{what}: {len(frame)} bytes, more than this connection's frame cap of "
            f"{outbox.frame_bytes_max}")[:RESPONSE_MESSAGE_LENGTH_MAX]))
        if not self._queued(too_large):  # a cap too small for any answer: dropped, the
            self._release(1)             # client's try times out

    def _queued(self, frame: bytes) -> bool:
        """Whether the outbox took `frame` (False: over the cap), its bytes held until
        written. Held first: the outbox may write it at once and report it written."""
        self._hold(len(frame))
        try:
            self.outbox.put(frame)
        except ValueError:
            self._hold(-len(frame))
            return False
        return True

    def waiting(self, request_id: int) -> anyio.CancelScope:
        """The scope a watch waits in, which a Cancel of `request_id` cancels."""
        scope = self.watches[request_id] = anyio.CancelScope()
        return scope

    def waited(self, request_id: int, scope: anyio.CancelScope) -> None:
        """The watch waiting in `scope` is over (answered, refused or called off)."""
        if self.watches.get(request_id) is scope:  # not a later watch under the same id
            del self.watches[request_id]

    def call_off(self, request_id: int) -> None:
        """A Cancel: end the wait of the watch `request_id` if it is waiting (ignored if
        not); neither is answered, so the Cancel's permit comes back now."""
        scope = self.watches.get(request_id)
        if scope is not None:
            scope.cancel()
        self.unanswered()

    def unanswered(self) -> None:
        """A request that gets no answer (a Cancel, a watch called off): its permit back."""
        self._release(1)

    def _hold(self, size: int) -> None:
        """`size` more bytes held unwritten (fewer, when negative), here and server-wide."""
        self.held_bytes += size
        self._budget.held_bytes += size


