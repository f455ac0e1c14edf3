"""The key-value store's client API: typed put and get over a `CellarClient`.

A put refused by its session (SESSIONS_FULL, SESSION_TOO_OLD) after the client sent it more
than once raises OutcomeUnknown: another copy may still be applied; so does SESSION_EXPIRED (a
copy ran, and its reply is gone). A key or value that is not bytes, or past the codec's bounds
(`KEY_BYTES_MAX`, `VALUE_BYTES_MAX`), is refused before it is sent (TypeError, ValueError,
naming the bound): every replica would answer it BAD_REQUEST."""

from __future__ import annotations

from cellar.kv.codec import (
    KEY_BYTES_MAX,
    OK_REPLY,
    VALUE_BYTES_MAX,
    Code,
    Operation,
    decode_reply,
    encode_get,
)
from consensus.codec import pack
from consensus.runtime.client import CellarClient, ClientError

_PUT = Operation.PUT.value  # packed as a plain int, as encode_put packs it


class KvRefused(ClientError):
    """The store answered with an error code (a malformed request, a stale sequence)."""


# The session's refusals, which it does not remember (statemachine/sessions.py): after a retry
# the client raises OutcomeUnknown for them, as a copy sent earlier may still be applied. And
# SESSION_EXPIRED: a copy ran, and its reply is gone.
_SESSION_REFUSALS = (Code.SESSION_TOO_OLD, Code.SESSIONS_FULL, Code.SESSION_EXPIRED)


def _not_applied(reply: bytes) -> str | None:
    code, _ = decode_reply(reply)
    return code.name if code in _SESSION_REFUSALS else None


def _checked(what: str, data: bytes, bytes_max: int) -> bytes:
    """`data`, a bytes object of at most `bytes_max` bytes (refused as the machine would)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"a {what} must be bytes, not {type(data).__name__}")
    if len(data) > bytes_max:
        raise ValueError(f"a {what} of {len(data)} bytes: at most {bytes_max}")
    return bytes(data)


class KvStore:
    def __init__(self, client: CellarClient) -> None:
        self.client = client

    async def put(self, key: bytes, value: bytes) -> None:
        if not (type(key) is bytes and len(key) <= KEY_BYTES_MAX and type(value) is bytes
                and len(value) <= VALUE_BYTES_MAX):  # checked inline: this runs per command
            key, value = _checked("key", key, KEY_BYTES_MAX), _checked("value", value,
                                                                      VALUE_BYTES_MAX)
        # encode_put and decode_reply, inline (once per command): the same bytes, and an OK
        # needs no decoding
        reply = await self.client.propose(pack([_PUT, key, value]), not_applied=_not_applied)
        if reply == OK_REPLY:
            return
        code, _ = decode_reply(reply)
        if code is not Code.OK:
            raise KvRefused(f"put {key!r}: {code.name}")

    async def get(self, key: bytes) -> bytes | None:
        """A linearizable read: the replica answers at the sequencer's read index."""
        key = _checked("key", key, KEY_BYTES_MAX)
        code, value = decode_reply(await self.client.read(encode_get(key)))
        if code is not Code.OK:
            raise KvRefused(f"get {key!r}: {code.name}")
        return value
