"""A replica file's byte budgets below what one valid request may need.

`limits.proposal_bytes_max` took any positive integer. Below the largest valid command
(ENVELOPE_BYTES_MAX, about a megabyte) a larger command, valid by the protocol, is refused
OVERLOADED by every replica at every try, for ever ("the replica holds 0 bytes of requests ...
at most ..."): the client retries the whole deadline and then says no replica took it, as if
the cluster were down. The input queue admits an item over its bound into an empty queue for
that reason (inbox.py); the budget does not, so the file must not set it that low, as
`frame_bytes_max` has its floor. Likewise `watch_bytes_max`: a principal's share is an eighth
of it, and a watch whose query is larger than that share is refused for ever.
"""

from __future__ import annotations

import pathlib

import anyio
import pytest

from consensus.runtime.client import Unavailable
from consensus.runtime.node_config import NodeConfigError, parse_node_config
from jepsen.sim.kv_codec import encode_put
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.local import local_cluster
from tests.consensus.runtime.test_node_config import base

pytestmark = pytest.mark.anyio
BUDGET = 64 << 10  # accepted by the replica file before; a command of 100 KiB is valid


async def test_a_valid_command_over_a_small_budget_is_refused_for_ever() -> None:
    """What such a file did, on every replica of a cluster."""
    with anyio.fail_after(30):
        async with local_cluster(SessionKv, proposal_bytes_max=BUDGET) as (cluster, client):
            await client.propose(encode_put("small", 1))  # served
            with pytest.raises(Unavailable, match="no replica took the command") as refused_as:
                await client.propose(b"x" * (100 << 10), deadline_s=2)
            # and says why: the replicas' refusal, not only that none took it
            assert f"(at most {BUDGET})" in str(refused_as.value)
            refused = sum(driver.metrics.counter("driver.proposals_refused_bytes")
                          for driver in cluster.drivers)
            held = [driver.proposal_bytes for driver in cluster.drivers]
    # refused again and again (the client backs off between tries), every budget empty
    assert refused >= 4 and held == [0, 0, 0]


@pytest.mark.parametrize("key, value", [("proposal_bytes_max", BUDGET),
                                        ("watch_bytes_max", 1 << 20)])
def test_the_replica_file_refuses_a_budget_below_one_valid_request(key: str,
                                                                   value: int) -> None:
    raw = base()
    raw["limits"][key] = value
    with pytest.raises(NodeConfigError, match=f"limits.{key}: {value} is below its floor"):
        parse_node_config(raw, base=pathlib.Path("."))
