"""Metrics: histograms, the Prometheus text, and the HTTP endpoint, on both backends."""

from __future__ import annotations

import functools
from collections import Counter

import anyio
import pytest

from consensus.runtime import metrics_http
from consensus.runtime.framing import CONNECTIONS_REFUSED_LIMIT
from consensus.runtime.metrics import Histogram, Metrics
from consensus.runtime.metrics_http import serve_metrics


def test_histogram_quantiles_are_bucket_bounds() -> None:
    histogram = Histogram((0.001, 0.01, 0.1))
    for value in (0.0005, 0.002, 0.003, 0.05, 5.0):
        histogram.observe(value)
    assert histogram.count == 5
    assert histogram.quantile(0.2) == 0.001
    assert histogram.quantile(0.6) == 0.01
    assert histogram.quantile(1.0) == float("inf")


def test_prometheus_text() -> None:
    metrics = Metrics()
    metrics.describe("commits", "commands committed")
    metrics.count("commits", 3)
    metrics.set("view", 2)
    metrics.observe("latency.seconds", 0.003)
    text = metrics.render()
    assert "# HELP cellar_commits commands committed\n# TYPE cellar_commits counter\n" \
           "cellar_commits 3\n" in text
    assert "cellar_view 2\n" in text
    assert 'cellar_latency_seconds_bucket{le="0.005"} 1\n' in text
    assert "cellar_latency_seconds_count 1\n" in text


async def _get(port: int, request: bytes) -> bytes:
    """The whole answer; what came before a reset, when the endpoint resets the connection."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        data = b""
        try:
            await stream.send(request)
            while True:
                data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return data


@pytest.mark.anyio
async def test_the_endpoint_serves_metrics() -> None:
    metrics = Metrics()
    metrics.count("commits", 7)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            port = await tasks.start(serve_metrics, "127.0.0.1", 0, metrics.render)
            answer = await _get(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 200 OK") and b"cellar_commits 7" in answer
            assert (await _get(port, b"GET / HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
            assert (await _get(port, b"garbage\r\n\r\n")).startswith(b"HTTP/1.1 400")
            tasks.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_page_rendered_as_bytes_is_served_as_they_are() -> None:
    """`render` may hand over a page already encoded (the module says so): served unchanged."""
    page = "cellar_temperature_celsius{gpu=\"0\"} 71 # \u00b0C\n".encode()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            port = await tasks.start(serve_metrics, "127.0.0.1", 0, lambda: page)
            answer = await _get(port, b"GET /metrics HTTP/1.1\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 200 OK")
            assert answer.endswith(b"\r\n\r\n" + page)
            assert f"Content-Length: {len(page)}\r\n".encode() in answer
            tasks.cancel_scope.cancel()


@pytest.mark.anyio
async def test_the_endpoint_sheds_connections_beyond_its_bound() -> None:
    """Connections that send nothing hold the endpoint's places (for REQUEST_TIMEOUT_S each):
    one more is closed at once, unanswered and counted; once they go, scrapes are served."""
    metrics = Metrics()
    counters: Counter[str] = Counter()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            port = await tasks.start(functools.partial(
                serve_metrics, "127.0.0.1", 0, metrics.render, connections_max=2,
                metrics=counters))
            silent = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(2)]
            assert await _get(port, b"GET /metrics HTTP/1.1\r\n\r\n") == b""
            assert counters[CONNECTIONS_REFUSED_LIMIT] == 1
            for stream in silent:
                await stream.aclose()
            for _ in range(1000):  # until the endpoint noticed
                answer = await _get(port, b"GET /metrics HTTP/1.1\r\n\r\n")
                if answer:
                    break
            assert answer.startswith(b"HTTP/1.1 200 OK")
            tasks.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_scraper_that_stops_reading_gives_its_place_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A page larger than the socket buffers, asked for and never read: the endpoint gives up
    on the answer after REPLY_TIMEOUT_S, so its one place serves the next scrape."""
    monkeypatch.setattr(metrics_http, "REPLY_TIMEOUT_S", 0.3)
    page = "cellar_padding 1\n" * 500_000  # about 8 MB
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            port = await tasks.start(functools.partial(
                serve_metrics, "127.0.0.1", 0, lambda: page, connections_max=1))
            async with await anyio.connect_tcp("127.0.0.1", port) as stuck:
                await stuck.send(b"GET /metrics HTTP/1.1\r\n\r\n")  # and never reads
                await anyio.sleep(1.0)
                # The next scrape reads the whole page: on a loaded machine 0.3 s may not do
                monkeypatch.setattr(metrics_http, "REPLY_TIMEOUT_S", 10.0)
                answer = await _get(port, b"GET /metrics HTTP/1.1\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(page.encode())
            tasks.cancel_scope.cancel()
