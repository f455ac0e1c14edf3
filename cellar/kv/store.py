"""The key-value store's client API: typed put and get over a `CellarClient`."""

from __future__ import annotations

from cellar.kv.codec import Code, decode_reply, encode_get, encode_put
from consensus.runtime.client import CellarClient, ClientError


class KvRefused(ClientError):
    """The store answered with an error code (a malformed request, a stale sequence)."""


class KvStore:
    def __init__(self, client: CellarClient) -> None:
        self.client = client

    async def put(self, key: bytes, value: bytes) -> None:
        code, _ = decode_reply(await self.client.propose(encode_put(key, value)))
        if code is not Code.OK:
            raise KvRefused(f"put {key!r}: {code.name}")

    async def get(self, key: bytes) -> bytes | None:
        """A linearizable read: the replica answers at the sequencer's read index."""
        code, value = decode_reply(await self.client.read(encode_get(key)))
        if code is not Code.OK:
            raise KvRefused(f"get {key!r}: {code.name}")
        return value
