"""Cellar's failover figure for `cellar bench peers`: on a running `CellarCluster`, SIGKILL the
sequencer while callers keep putting, and time the kill to the first commit of a put sent
after it. The timing itself is `cellar bench cluster`'s (`failover_ms`), shared."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence

from cellar.bench.cluster import FailoverError, failover_ms
from cellar.bench.peers.cellar_peer import BENCH_PRINCIPAL, CellarCluster
from cellar.bench.peers.kv import KvClient, KvCluster
from cellar.bench.peers.load import key_for, random_value
from consensus.runtime.client import ClientConfig, ClientError
from consensus.runtime.tls import IdentityRole

FAILOVER_CALLERS = 16
FAILOVER_FIRST_CALLER = 90_000  # keys of their own, apart from the workload's
ADMIN_CONFIG = ClientConfig(attempt_timeout_s=1.0, deadline_s=10.0, sessions=4)


async def cellar_failover(cluster: KvCluster, clients: Sequence[KvClient]) -> dict[str, float]:
    """`{"failover_ms": ...}`, or nothing (with a message on stderr) if it could not be timed."""
    if not isinstance(cluster, CellarCluster):
        raise TypeError(f"failover is timed on Cellar clusters only, not {cluster.name}")
    value = random_value(16)
    calls = [functools.partial(clients[caller % len(clients)].put,
                               key_for(FAILOVER_FIRST_CALLER + caller, 0), value)
             for caller in range(FAILOVER_CALLERS)]
    admin = cluster.layout.client(IdentityRole.ADMIN, BENCH_PRINCIPAL, ADMIN_CONFIG)
    try:
        async with admin:
            milliseconds = await failover_ms(cluster.processes, admin, calls)
    except (FailoverError, ClientError, OSError) as error:  # the figure only, not the round
        print(f"{cluster.name}: failover not timed: {error}", file=sys.stderr)
        return {}
    return {"failover_ms": milliseconds}
