"""A page whose rendering raises answers that scrape with 500 and serves the next one: the error
had left the connection's handler, ended the endpoint's task group, and with it the process
that embeds the endpoint (a replica's `Node.run`, a node agent's task group), so one bug in a
metrics page, or in the state it reads, stopped a replica or an agent at every scrape."""

from __future__ import annotations

import functools
from collections import Counter

import anyio
import pytest

from consensus.runtime.metrics_http import RENDER_FAILURES, serve_metrics

pytestmark = pytest.mark.anyio


async def _get(port: int) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        data = b""
        try:
            await stream.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            while True:
                data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return data


async def test_a_page_that_raises_answers_500_and_the_endpoint_serves_on() -> None:
    calls = [0]

    def render() -> str:
        calls[0] += 1
        if calls[0] == 1:
            raise KeyError("a bug in the page")
        return "cellar_up 1\n"

    counters: Counter[str] = Counter()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            port = await tasks.start(functools.partial(
                serve_metrics, "127.0.0.1", 0, render, metrics=counters))
            first = await _get(port)
            assert first.startswith(b"HTTP/1.1 500 ")
            assert counters[RENDER_FAILURES] == 1
            second = await _get(port)
            assert second.startswith(b"HTTP/1.1 200 OK") and second.endswith(b"cellar_up 1\n")
            tasks.cancel_scope.cancel()
