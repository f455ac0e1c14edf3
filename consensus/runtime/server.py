"""Serving clients: requests from one authenticated connection in, responses out.

The principal comes from the client's certificate, never from the request: the server stamps
it onto each command's envelope with its own clock (`now_ms`), so the state machine can refuse
a node agent acting for another node or a non-admin issuing admin commands. Requests on one
connection are answered concurrently (bounded), each response tagged with its request id. A
request that does not decode is answered BAD_REQUEST and counted; the connection goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio

from consensus.codec import encode_envelope
from consensus.envelope import Envelope, Principal
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
    encode_response,
    encode_status,
)
from consensus.runtime.driver import Driver, OutcomeUnknown, Overloaded
from consensus.runtime.framing import TransportError
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
        metrics = self._driver.metrics
        metrics.count("server.connections")
        limiter = anyio.Semaphore(self._inflight_max)
        send_lock = anyio.Lock()
        ended: TransportError | None = None
        async with anyio.create_task_group() as tasks:
            while True:
                try:
                    frame = await connection.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    break
                except TransportError as error:  # an oversized or truncated frame
                    ended = error
                    break
                try:
                    request = decode_request(frame)
                except InvalidMessage as error:
                    metrics.count("server.bad_requests")
                    await _send(connection, send_lock,
                                Response(0, Code.BAD_REQUEST, message=error.reason))
                    continue
                await limiter.acquire()
                tasks.start_soon(self._answer, principal, request, connection, send_lock,
                                 limiter)
            tasks.cancel_scope.cancel()
        if ended is not None:
            raise ended  # outside the task group: the listener counts it and drops the client

    async def _answer(self, principal: Principal, request: Request, connection: FrameStream,
                      send_lock: anyio.Lock, limiter: anyio.Semaphore) -> None:
        try:
            response = await self._respond(principal, request)
            await _send(connection, send_lock, response)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        finally:
            limiter.release()

    async def _respond(self, principal: Principal, request: Request) -> Response:
        driver, request_id = self._driver, request.request_id
        if not driver.running:
            return Response(request_id, Code.UNAVAILABLE, message="the replica is not running")
        try:
            if isinstance(request, Propose):
                envelope = Envelope(principal=principal, session=request.session,
                                    sequence=request.sequence, now_ms=self._now_ms(),
                                    body=request.body)
                reply = await driver.propose(encode_envelope(envelope),
                                             request.timeout_ms / 1000)
                return Response(request_id, Code.OK, reply)
            if isinstance(request, Read):
                return Response(request_id, Code.OK,
                                await driver.read(request.query, request.timeout_ms / 1000))
            if isinstance(request, Watch):
                result, slot = await driver.local_read(request.query, request.after_slot,
                                                       request.wait_ms / 1000)
                return Response(request_id, Code.OK, result, slot)
            assert isinstance(request, Status)
            return Response(request_id, Code.OK, encode_status(self._status()))
        except OutcomeUnknown as error:
            return Response(request_id, Code.UNKNOWN, message=str(error))
        except Overloaded as error:
            return Response(request_id, Code.OVERLOADED, message=str(error))


async def _send(connection: FrameStream, lock: anyio.Lock, response: Response) -> None:
    async with lock:
        await connection.send(encode_response(response))
