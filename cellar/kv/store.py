"""The key-value store's client API: typed put and get over a `CellarClient`.

A put refused by its session (SESSIONS_FULL, SESSION_TOO_OLD) after the client sent it more
than once raises OutcomeUnknown: another copy may still be applied; so does SESSION_EXPIRED (a
copy ran, and its reply is gone). A key or value that is not bytes, or past the codec's bounds
(`KEY_BYTES_MAX`, `VALUE_BYTES_MAX`), is refused before it is sent (TypeError, ValueError,
naming the bound): every replica would answer it BAD_REQUEST. Puts made together are sent
together, a batch to a command (cellar/kv/put_batches.py); each caller still gets its own
put's answer."""

from __future__ import annotations

from cellar.kv.codec import (
    KEY_BYTES_MAX,
    PUTS_MAX,
    VALUE_BYTES_MAX,
    Code,
    decode_reply,
    encode_get,
)
from cellar.kv.put_batches import PutBatches
from consensus.runtime.client import CellarClient, ClientError


class KvRefused(ClientError):
    """The store answered with an error code (a malformed request, a stale sequence)."""


def _checked(what: str, data: bytes, bytes_max: int) -> bytes:
    """`data`, a bytes object of at most `bytes_max` bytes (refused as the machine would)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"a {what} must be bytes, not {type(data).__name__}")
    if len(data) > bytes_max:
        raise ValueError(f"a {what} of {len(data)} bytes: at most {bytes_max}")
    return bytes(data)


class KvStore:
    """Puts and gets over `client`. Concurrent puts are coalesced into commands of up to
    `puts_max` puts each (cellar/kv/put_batches.py; 1: a command a put)."""

    def __init__(self, client: CellarClient, *, puts_max: int = PUTS_MAX) -> None:
        self.client = client
        self._batches = PutBatches(client, puts_max)

    async def put(self, key: bytes, value: bytes) -> None:
        if not (type(key) is bytes and len(key) <= KEY_BYTES_MAX and type(value) is bytes
                and len(value) <= VALUE_BYTES_MAX):  # checked inline: this runs per put
            key, value = _checked("key", key, KEY_BYTES_MAX), _checked("value", value,
                                                                      VALUE_BYTES_MAX)
        code = await self._batches.submit(key, value)
        if code is not Code.OK:
            raise KvRefused(f"put {key!r}: {code.name}")

    async def get(self, key: bytes) -> bytes | None:
        """A linearizable read: the replica answers at the sequencer's read index."""
        key = _checked("key", key, KEY_BYTES_MAX)
        code, value = decode_reply(await self.client.read(encode_get(key)))
        if code is not Code.OK:
            raise KvRefused(f"get {key!r}: {code.name}")
        return value
