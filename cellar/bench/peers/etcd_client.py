"""The etcd client of `cellar bench peers`: puts and linearizable gets over `grpc.aio`.

One channel holds a subchannel to each of the three members and balances calls round robin,
as the Go client does; followers forward puts to the leader and serve linearizable ranges
after a ReadIndex round trip. One channel serves every concurrent caller of a client: HTTP/2
multiplexes the calls on it. The messages are raw bytes, encoded in `etcd_wire`; grpcio is
imported only when etcd is used, so the rest of the suite runs without it.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
from collections.abc import Sequence
from typing import Any

from cellar.bench.peers import etcd_wire
from cellar.bench.peers.kv import PeerUnavailable

PUT = "/etcdserverpb.KV/Put"
RANGE = "/etcdserverpb.KV/Range"
STATUS = "/etcdserverpb.Maintenance/Status"


def grpc_module(name: str = "grpc") -> Any:
    """grpc (or grpc.aio), imported only when etcd is used: the rest of the suite runs
    without grpcio. Raises PeerUnavailable when grpcio is missing."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise PeerUnavailable(f"grpcio is not installed ({error}); pip install grpcio") from error


class EtcdClient:
    """Put and linearizable get over one grpc.aio channel balanced across `endpoints`."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float = 10.0,
                 channels: int = 1) -> None:
        aio = grpc_module("grpc.aio")
        target = "ipv4:" + ",".join(endpoints)
        # A local subchannel pool gives each channel connections of its own, as separate Go
        # clients would have, instead of gRPC's process-wide sharing of identical targets.
        options = [("grpc.lb_policy_name", "round_robin"), ("grpc.use_local_subchannel_pool", 1)]
        self._channels = [aio.insecure_channel(target, options=options)
                          for _ in range(channels)]
        self._puts = [channel.unary_unary(PUT) for channel in self._channels]
        self._ranges = [channel.unary_unary(RANGE) for channel in self._channels]
        self._next = itertools.count()
        self.timeout_s = timeout_s

    async def ready(self, timeout_s: float) -> None:
        for channel in self._channels:
            await asyncio.wait_for(channel.channel_ready(), timeout_s)

    async def put(self, key: bytes, value: bytes) -> None:
        index = next(self._next) % len(self._puts)
        await self._puts[index](etcd_wire.put_request(key, value), timeout=self.timeout_s)

    async def get(self, key: bytes) -> bytes | None:
        index = next(self._next) % len(self._ranges)
        response = await self._ranges[index](etcd_wire.range_request(key),
                                             timeout=self.timeout_s)
        return etcd_wire.first_value(response)

    async def aclose(self) -> None:
        for channel in self._channels:
            await channel.close()
