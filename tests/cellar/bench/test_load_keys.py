"""The load generator's keys: each caller cycles over its own keys, in order, and no two
callers share one, however many keys each is given."""

from __future__ import annotations

from collections import defaultdict

import anyio
import pytest

from cellar.bench.peers.load import key_for, keys_per_caller, put_operation, run_phase


class RecordingClient:
    """Records, for each caller's key prefix, the keys put in order."""

    def __init__(self) -> None:
        self.keys: dict[bytes, list[bytes]] = defaultdict(list)

    async def put(self, key: bytes, value: bytes) -> None:
        self.keys[key.rsplit(b"-", 1)[0]].append(key)
        await anyio.sleep(0.001)

    async def get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize(("callers", "keys"), [(3, 2), (2, 5), (4, None)])
def test_each_caller_cycles_over_its_own_keys_in_order(callers: int, keys: int | None) -> None:
    client = RecordingClient()

    async def phase() -> None:
        await run_phase([client], callers, 0.05, put_operation(b"v"), timeout_s=1.0, keys=keys)

    anyio.run(phase)
    count = keys_per_caller(callers) if keys is None else keys
    assert len(client.keys) == callers
    for caller in range(callers):
        put = client.keys[key_for(caller, 0, count).rsplit(b"-", 1)[0]]
        assert put == [key_for(caller, number, count) for number in range(len(put))]
        if keys is not None:
            assert len(put) > count  # it went round its keys at least once
        assert len(set(put)) == min(count, len(put))
