"""The key-value store's client API: typed put and get over a `CellarClient`.

A put refused by its session (SESSIONS_FULL, SESSION_TOO_OLD) after the client sent it more
than once raises OutcomeUnknown: another copy may still be applied; so does SESSION_EXPIRED (a
copy ran, and its reply is gone)."""

from __future__ import annotations

from cellar.kv.codec import Code, decode_reply, encode_get, encode_put
from consensus.runtime.client import CellarClient, ClientError


class KvRefused(ClientError):
    """The store answered with an error code (a malformed request, a stale sequence)."""


# The session's refusals, which it does not remember (statemachine/sessions.py): after a retry
# the client raises OutcomeUnknown for them, as a copy sent earlier may still be applied. And
# SESSION_EXPIRED: a copy ran, and its reply is gone.
_SESSION_REFUSALS = (Code.SESSION_TOO_OLD, Code.SESSIONS_FULL, Code.SESSION_EXPIRED)


def _not_applied(reply: bytes) -> str | None:
    code, _ = decode_reply(reply)
    return code.name if code in _SESSION_REFUSALS else None


class KvStore:
    def __init__(self, client: CellarClient) -> None:
        self.client = client

    async def put(self, key: bytes, value: bytes) -> None:
        code, _ = decode_reply(await self.client.propose(encode_put(key, value),
                                                         not_applied=_not_applied))
        if code is not Code.OK:
            raise KvRefused(f"put {key!r}: {code.name}")

    async def get(self, key: bytes) -> bytes | None:
        """A linearizable read: the replica answers at the sequencer's read index."""
        code, value = decode_reply(await self.client.read(encode_get(key)))
        if code is not Code.OK:
            raise KvRefused(f"get {key!r}: {code.name}")
        return value
