"""A client refused OVERLOADED backs off: each pause before its next try grows, up to a cap,
and is jittered, so a crowd of clients refused at once does not come back at once. It retried
every `retry_backoff_s` (50 ms) for its whole deadline: a thousand clients shed by one busy
replica came back together twenty times a second, each keeping the replica as busy as before.
The pauses stay within the caller's deadline."""

from __future__ import annotations

import random

import anyio
import pytest

from consensus.runtime.client import CellarClient, ClientConfig, Unavailable
from consensus.runtime.client_codec import Code, Request, Response, encode_response
from tests.consensus.runtime.fake_replicas import ScriptedReplica

pytestmark = pytest.mark.anyio


class OverloadedReplica(ScriptedReplica):
    """A replica that refuses every request OVERLOADED; `heard` counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.heard = 0

    def hear(self, request: Request, frame: bytes) -> None:
        self.heard += 1
        self.answer(encode_response(Response(request.request_id, Code.OVERLOADED,
                                             message="busy")))


async def test_a_command_refused_overloaded_backs_off_within_its_deadline() -> None:
    replica = OverloadedReplica()

    async def connect(endpoint: str) -> OverloadedReplica:
        return replica

    # With a fixed 10 ms pause a 1 s deadline saw a try every 20 ms (two pauses a round: 48
    # tries); with pauses doubling from 10 ms it sees under ten.
    config = ClientConfig(attempt_timeout_s=0.5, deadline_s=10.0, retry_backoff_s=0.01)
    with anyio.fail_after(10):
        async with CellarClient(["a"], connect, config, first=0) as client:
            started = anyio.current_time()
            with pytest.raises(Unavailable, match="last refused: busy"):
                await client.propose(b"put", deadline_s=1.0)
            took_s = anyio.current_time() - started
    assert 1.0 <= took_s < 1.5  # the pauses end at the deadline, not past it
    assert 3 <= replica.heard <= 25


async def test_a_pause_longer_than_the_deadline_left_is_cut_to_it() -> None:
    replica = OverloadedReplica()

    async def connect(endpoint: str) -> OverloadedReplica:
        return replica

    config = ClientConfig(attempt_timeout_s=0.5, deadline_s=10.0, retry_backoff_s=5.0,
                          retry_backoff_max_s=30.0)
    with anyio.fail_after(10):
        async with CellarClient(["a"], connect, config, first=0) as client:
            started = anyio.current_time()
            with pytest.raises(Unavailable):
                await client.read(b"get", deadline_s=0.3)
            assert anyio.current_time() - started < 1.5


def test_the_pauses_grow_to_the_cap_and_differ_between_clients() -> None:
    config = ClientConfig(retry_backoff_s=0.05, retry_backoff_max_s=1.0)

    async def never(endpoint: str) -> ScriptedReplica:
        raise OSError(endpoint)

    def pauses(client: CellarClient) -> list[float]:
        backoff = client._backoff()
        return [backoff.next_delay_s() for _ in range(12)]

    first = pauses(CellarClient(["a"], never, config, rng=random.Random(1)))
    second = pauses(CellarClient(["a"], never, config, rng=random.Random(2)))
    again = pauses(CellarClient(["a"], never, config, rng=random.Random(1)))
    assert first == again  # seeded: a test or a simulation can replay them
    assert first != second  # jittered: two clients refused together come back apart
    for series in (first, second):
        assert 0.025 <= series[0] <= 0.05  # the first pause is about retry_backoff_s
        assert all(pause <= 1.0 for pause in series)  # never past the cap
        assert min(series[6:]) >= 0.5  # by then at the cap: [half, whole] of it
        ceilings = [min(1.0, 0.05 * 2 ** retry) for retry in range(12)]
        assert all(c / 2 <= pause <= c for c, pause in zip(ceilings, series, strict=True))


@pytest.mark.parametrize("options", [{"retry_backoff_max_s": 0.01},
                                     {"retry_backoff_s": 2.0, "retry_backoff_max_s": 1.0}])
def test_a_cap_below_the_first_pause_is_refused(options: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ClientConfig(**options)  # type: ignore[arg-type]
