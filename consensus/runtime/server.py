"""Serving clients: requests from one authenticated connection in, responses out.

The principal comes from the client's certificate, never from the request: the server stamps
it onto each command's envelope with its own clock (`now_ms`), so the state machine can refuse
a node agent acting for another node or a non-admin issuing admin commands. Requests on one
connection are answered concurrently (bounded: a permit per request until its answer is
written), each response tagged with its request id; commands and reads are handed to the driver
with a callback, and their responses leave through the connection's `Outbox`, many per write.
A request that does not decode is answered BAD_REQUEST and counted; the connection goes on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import anyio

from consensus.codec import encode_envelope_of
from consensus.envelope import Principal
from consensus.errors import InvalidMessage
from consensus.runtime.client_codec import (
    Code,
    Propose,
    Read,
    Request,
    Response,
    Status,
    Watch,
    decode_request,
    encode_ok,
    encode_response,
    encode_status,
)
from consensus.runtime.driver import Done, Driver, Overloaded
from consensus.runtime.framing import TransportError
from consensus.runtime.outbox import Outbox
from consensus.runtime.streams import FrameStream

INFLIGHT_PER_CONNECTION_MAX = 1024


class ClientServer:
    def __init__(self, driver: Driver, *, now_ms: Callable[[], int] = lambda: int(
                     time.time() * 1000),
                 inflight_max: int = INFLIGHT_PER_CONNECTION_MAX,
                 status: Callable[[], dict[str, Any]] | None = None) -> None:
        self._driver = driver
        self._now_ms = now_ms
        self._inflight_max = inflight_max
        self._status = status or driver.status

    async def serve(self, principal: Principal, connection: FrameStream) -> None:
        """Answer requests until the client hangs up."""
        self._driver.metrics.count("server.connections")
        limiter = anyio.Semaphore(self._inflight_max)  # a permit per request until answered
        outbox = Outbox(connection, on_written=lambda frames: _release(limiter, frames))
        ended: TransportError | None = None
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_write_until_broken, outbox)
            while not outbox.broken:
                try:
                    frame = await connection.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    break
                except TransportError as error:  # an oversized or truncated frame
                    ended = error
                    break
                await _acquire(limiter)
                self._dispatch(principal, frame, outbox, tasks)
            tasks.cancel_scope.cancel()
        if ended is not None:
            raise ended  # outside the task group: the listener counts it and drops the client

    def _dispatch(self, principal: Principal, frame: bytes, outbox: Outbox,
                  tasks: anyio.abc.TaskGroup) -> None:
        """Commands and reads go to the driver with a callback (no task each); the rare
        watches and status requests get a task."""
        try:
            request = decode_request(frame)
        except InvalidMessage as error:
            self._driver.metrics.count("server.bad_requests")
            _answer(outbox, Response(0, Code.BAD_REQUEST, message=error.reason))
            return
        if not self._driver.running:
            _answer(outbox, Response(request.request_id, Code.UNAVAILABLE,
                                     message="the replica is not running"))
        elif isinstance(request, Propose):
            command = encode_envelope_of(principal, request.session, request.sequence,
                                         self._now_ms(), request.body)
            self._driver.submit(command, request.timeout_ms / 1000,
                                _responder(outbox, request.request_id))
        elif isinstance(request, Read):
            self._driver.submit_read(request.query, request.timeout_ms / 1000,
                                     _responder(outbox, request.request_id))
        else:
            tasks.start_soon(self._answer_slowly, request, outbox)

    async def _answer_slowly(self, request: Request, outbox: Outbox) -> None:
        request_id = request.request_id
        if isinstance(request, Watch):
            result, slot = await self._driver.local_read(request.query, request.after_slot,
                                                         request.wait_ms / 1000)
            response = Response(request_id, Code.OK, result, slot)
        else:
            assert isinstance(request, Status)
            response = Response(request_id, Code.OK, encode_status(self._status()))
        _answer(outbox, response)


async def _write_until_broken(outbox: Outbox) -> None:
    """The client hanging up ends the writer quietly; the reader then sees the end too."""
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await outbox.run()


def _responder(outbox: Outbox, request_id: int) -> Done:
    def done(reply: bytes | None, error: Exception | None) -> None:
        if reply is not None:
            _put(outbox, encode_ok(request_id, reply))
        elif isinstance(error, Overloaded):
            _answer(outbox, Response(request_id, Code.OVERLOADED, message=str(error)))
        else:  # OutcomeUnknown: timed out, or the replica stopped
            _answer(outbox, Response(request_id, Code.UNKNOWN, message=str(error)))
    return done


def _answer(outbox: Outbox, response: Response) -> None:
    _put(outbox, encode_response(response))


def _put(outbox: Outbox, frame: bytes) -> None:
    if not outbox.broken:  # broken: the client is gone (put would raise)
        outbox.put(frame)


async def _acquire(limiter: anyio.Semaphore) -> None:
    """A permit; yields to the loop only when none is free (anyio's `acquire` always yields,
    which under load cost a loop pass per request)."""
    try:
        limiter.acquire_nowait()
    except anyio.WouldBlock:
        await limiter.acquire()


def _release(limiter: anyio.Semaphore, permits: int) -> None:
    for _ in range(permits):
        limiter.release()
