"""A minimal HTTP endpoint serving `GET /metrics` in Prometheus text format.

Just enough HTTP/1.1 for a scraper: one request per connection, a bounded request head, a
response with Content-Length, then close. Anything else gets 404 or 400. Metrics are rendered
fresh for each scrape by the `render` callable (a string, or bytes already encoded).

At most `connections_max` connections are served at once (a scraper needs one; a few more cover
overlapping scrapes and a curl): one more is closed at once and counted, and each is given
`REQUEST_TIMEOUT_S` to send its request head and `REPLY_TIMEOUT_S` to take the answer (a
scraper that stops reading held its place for good once the page outgrew the socket buffers).
A failed accept() is retried (`accept.py`), so nobody who can reach the port can run the
process out of descriptors or end it. A page whose rendering raises is answered 500, logged and
counted (`RENDER_FAILURES`): the error would otherwise end the endpoint's task group, and with
it the replica or node agent that embeds it, at every scrape.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable

import anyio
from anyio.abc import SocketStream

from consensus.runtime.accept import Slots, accept_forever, listen_tcp
from consensus.runtime.framing import CONNECTIONS_REFUSED_LIMIT, Metrics

REQUEST_HEAD_BYTES_MAX = 8192
REQUEST_TIMEOUT_S = 5.0
REPLY_TIMEOUT_S = 5.0
CONNECTIONS_MAX = 16
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
RENDER_FAILURES = "transport.metrics_render_failures"  # counter: scrapes answered 500

logger = logging.getLogger("cellar.metrics")


async def serve_metrics(host: str, port: int, render: Callable[[], str | bytes], *,
                        connections_max: int = CONNECTIONS_MAX, metrics: Metrics | None = None,
                        task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
                        ) -> None:
    """Serve until cancelled; reports the bound port through task_status (port 0: any).
    `metrics` counts the connections refused, the accept() calls retried and the pages whose
    rendering raised."""
    slots = Slots(connections_max)
    counters = Metrics() if metrics is None else metrics

    async def serve(stream: SocketStream) -> None:
        if not slots.take():
            counters[CONNECTIONS_REFUSED_LIMIT] += 1
            await anyio.aclose_forcefully(stream)
            return
        try:
            await _answer(stream, render, counters)
        finally:
            slots.release()

    listener = await listen_tcp(host, port)
    async with listener, anyio.create_task_group() as group:
        bound = listener.extra(anyio.abc.SocketAttribute.local_port)
        group.start_soon(functools.partial(accept_forever, listener, serve, group,
                                           what="metrics endpoint", metrics=counters))
        task_status.started(bound)


async def _answer(stream: SocketStream, render: Callable[[], str | bytes],
                  counters: Metrics) -> None:
    async with stream:
        head = b""
        with anyio.move_on_after(REQUEST_TIMEOUT_S):
            while b"\r\n\r\n" not in head and len(head) < REQUEST_HEAD_BYTES_MAX:
                try:
                    head += await stream.receive(4096)
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return
        request_line = head.split(b"\r\n", 1)[0].split()
        if len(request_line) != 3 or not request_line[2].startswith(b"HTTP/"):
            await _reply(stream, 400, "Bad Request", "bad request\n")
        elif request_line[0] != b"GET" or request_line[1].split(b"?")[0] != b"/metrics":
            await _reply(stream, 404, "Not Found", "try GET /metrics\n")
        else:
            try:
                page = render()
            except Exception:  # a bug in the page: this scrape fails, the process goes on
                counters[RENDER_FAILURES] += 1
                logger.exception("the metrics page could not be rendered")
                await _reply(stream, 500, "Internal Server Error", "the page failed\n")
                return
            await _reply(stream, 200, "OK", page)


async def _reply(stream: SocketStream, status: int, reason: str, body: str | bytes) -> None:
    payload = body if isinstance(body, bytes) else body.encode()  # bytes: encoded already
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {CONTENT_TYPE}\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    with anyio.move_on_after(REPLY_TIMEOUT_S), contextlib.suppress(
            anyio.BrokenResourceError, anyio.ClosedResourceError):
        await stream.send(head + payload)
