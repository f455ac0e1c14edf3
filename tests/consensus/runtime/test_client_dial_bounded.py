"""A dial to a replica whose host drops packets (the TCP handshake, or the TLS one, never
ends) is given up after the client's connect_timeout_s, and the command goes on to the next
replica. The dial had been bounded only by the command's deadline, so a client whose first
replica was such a host spent the whole deadline there and failed although another replica
answered."""

from __future__ import annotations

import anyio
import pytest

from consensus.runtime.client import CellarClient, ClientConfig
from tests.consensus.runtime.fake_replicas import AnsweringReplica

pytestmark = pytest.mark.anyio


class Dialer:
    """"a" never finishes a dial; "b" answers."""

    def __init__(self) -> None:
        self.dials_to_a = 0

    async def __call__(self, endpoint: str) -> AnsweringReplica:
        if endpoint == "a":
            self.dials_to_a += 1
            await anyio.sleep_forever()
        return AnsweringReplica(b"done")


async def test_a_hanging_dial_costs_the_connect_timeout_not_the_deadline() -> None:
    config = ClientConfig(attempt_timeout_s=0.5, connect_timeout_s=0.2, deadline_s=1.0,
                          retry_backoff_s=0.01)
    dialer = Dialer()
    with anyio.fail_after(5):
        async with CellarClient(["a", "b"], dialer, config, first=0) as client:
            assert await client.propose(b"put") == b"done"
            assert dialer.dials_to_a == 1
            assert await client.propose(b"put") == b"done"  # moved on: "a" not dialed again
            assert dialer.dials_to_a == 1


def test_connect_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="connect_timeout_s"):
        ClientConfig(connect_timeout_s=0)
