"""A failover that cannot be timed (the sequencer lookup unavailable) costs cellar-3 the figure,
not its round."""

from __future__ import annotations

from typing import Any

import anyio

from cellar.bench.peers import failover
from cellar.bench.peers.cellar_peer import CellarCluster
from consensus.runtime.client import Unavailable


class _Admin:
    async def __aenter__(self) -> _Admin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class _Client:
    async def put(self, key: bytes, value: bytes) -> None:
        return None


class _Layout:
    def client(self, *args: Any, **kwargs: Any) -> _Admin:
        return _Admin()


def test_a_status_query_that_fails_leaves_the_round_without_a_failover_figure(
        monkeypatch: Any) -> None:
    """`cellar_failover` promises "{failover_ms: ...}, or nothing (with a message on stderr)
    if it could not be timed", but only FailoverError was caught: a replica not answering the
    sequencer lookup (Unavailable, a ClientError) raised out of `measure`, and the whole
    cellar-3 round -- every figure of its workload -- was abandoned."""

    async def unavailable(*args: Any, **kwargs: Any) -> float:
        raise Unavailable("127.0.0.1:1 did not answer")

    monkeypatch.setattr(failover, "failover_ms", unavailable)
    cluster = CellarCluster.__new__(CellarCluster)
    cluster.layout = _Layout()  # type: ignore[assignment]
    cluster.processes = None  # type: ignore[assignment]
    cluster.name = "cellar-3"

    async def timed() -> dict[str, float]:
        return await failover.cellar_failover(cluster, [_Client()])  # type: ignore[list-item]

    assert anyio.run(timed) == {}
