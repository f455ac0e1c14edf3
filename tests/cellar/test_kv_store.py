"""The key-value store's client API against faked replicas, on asyncio and on trio: a put its
session refused is "not applied" (KvRefused) only when it was sent once."""

from __future__ import annotations

import anyio
import pytest

from cellar.kv.codec import Code, encode_reply
from cellar.kv.store import KvRefused, KvStore
from consensus.runtime.client import CellarClient, OutcomeUnknown
from tests.consensus.runtime.fake_replicas import RETRYING_CONFIG, silent_then_answering

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("code", [Code.SESSIONS_FULL, Code.SESSION_TOO_OLD,
                                  Code.SESSION_EXPIRED])
async def test_a_put_its_session_refused_after_a_retry_is_an_unknown_outcome(code: Code
                                                                            ) -> None:
    """Sent to "a", unanswered, then to "b", which refused it: the copy at "a" may still be
    applied once an idle session expires (or on a replica whose clock is behind)."""
    connect = silent_then_answering(encode_reply(code))
    with anyio.fail_after(10):
        async with CellarClient(["a", "b"], connect, RETRYING_CONFIG, first=0) as client:
            with pytest.raises(OutcomeUnknown, match=code.name):
                await KvStore(client).put(b"k", b"v")
        async with CellarClient(["a", "b"], connect, RETRYING_CONFIG, first=1) as client:
            with pytest.raises(KvRefused, match=code.name):  # sent once: not applied
                await KvStore(client).put(b"k", b"v")
