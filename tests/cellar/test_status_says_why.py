"""`cellar status` said every replica was "down (... did not answer)" when the client could not
even make its TLS handshake (a `--certs` directory of another cluster's CA, an expired
certificate): the replicas were up and the operator was sent looking for a dead cluster. The
README says a *silent* replica shows as down; one the client could not connect to should say
why."""

from __future__ import annotations

import anyio
import pytest

from consensus.runtime.client import CellarClient, ClientConfig, Unavailable
from consensus.runtime.connect import ConnectRefused
from tests.consensus.runtime.fake_replicas import SilentReplica

pytestmark = pytest.mark.anyio


async def test_status_names_why_a_replica_could_not_be_reached() -> None:
    async def connect(endpoint: str) -> SilentReplica:
        raise ConnectRefused(f"{endpoint}: the TLS handshake failed")

    config = ClientConfig(attempt_timeout_s=0.05, deadline_s=0.5, retry_backoff_s=0.01)
    with anyio.fail_after(10):
        async with CellarClient(["127.0.0.1:7100"], connect, config, first=0) as client:
            with pytest.raises(Unavailable) as refused:
                await client.status("127.0.0.1:7100")
    assert "TLS handshake failed" in str(refused.value)


async def test_admin_reads_and_commands_name_why_no_replica_could_be_reached() -> None:
    """`cellar admin --certs <another cluster's>` said "no replica answered the read in time"
    (or "no replica took the command"), exit 2, as if the cluster were down."""
    async def connect(endpoint: str) -> SilentReplica:
        raise ConnectRefused(f"{endpoint}: the TLS handshake failed")

    config = ClientConfig(attempt_timeout_s=0.05, deadline_s=0.3, retry_backoff_s=0.01)
    with anyio.fail_after(10):
        async with CellarClient(["a", "b"], connect, config, first=0) as client:
            with pytest.raises(Unavailable) as read:
                await client.read(b"get")
            with pytest.raises(Unavailable) as command:
                await client.propose(b"put")
    assert "TLS handshake failed" in str(read.value)
    assert "TLS handshake failed" in str(command.value)
