"""A machine's `query` that raises (as the GPU machine's effects query did on an effect over
EFFECT_BYTES_MAX) was called by the driver's own loop for a linearizable read, unguarded: the
exception ended the loop, and with it the replica, for one client's read (and, the client
trying the next replica, every replica in turn). The query is now answered with the error
(BAD_REQUEST: the client's Rejected), counted and logged, and the replica serves on; a watch
likewise."""

from __future__ import annotations

import anyio
import pytest

from consensus.runtime.client import Rejected
from jepsen.sim.kv_codec import decode_reply, encode_get, encode_put
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.local import local_cluster

pytestmark = pytest.mark.anyio
BOOM = b"boom"


class Fragile(SessionKv):
    def query(self, query: bytes) -> bytes:
        if query == BOOM:
            raise ValueError("a query the machine could not answer")
        return super().query(query)


async def test_a_query_that_raises_is_refused_and_the_replicas_serve_on() -> None:
    with anyio.fail_after(30):
        async with local_cluster(Fragile) as (cluster, client):
            await client.propose(encode_put("a", 1))
            with pytest.raises(Rejected, match="ValueError: a query the machine could not"):
                await client.read(BOOM)
            with pytest.raises(Rejected, match="could not answer the query"):
                await client.watch(BOOM, 0, wait_s=0.1)
            assert all(driver.running for driver in cluster.drivers)
            assert decode_reply(await client.read(encode_get("a"))) == (True, 1)
            assert sum(driver.metrics.counter("driver.queries_failed")
                       for driver in cluster.drivers) == 2
