"""A peer refused for its protocol is counted as such, not as one whose lease timing differs:
an operator reading `transport.peers_refused_timing` would look for a tick_ms to fix."""

from __future__ import annotations

import pathlib

import anyio
import pytest

from consensus.runtime.framing import TIMING_REFUSED, encode_frames
from consensus.runtime.peers import PEER_PROTOCOL, Hello, LinkTiming
from tests.consensus.runtime.test_peer_hello_refusals import certified_mesh
from tests.consensus.runtime.test_peers import (
    TIME_LIMIT_S,
    certificates,  # noqa: F401  (fixture)
    dial,
    eventually,
    start,
)

pytestmark = pytest.mark.anyio
PROTOCOL_REFUSED = "transport.peers_refused_protocol"


async def test_a_peer_of_another_protocol_is_counted_as_one_not_as_other_timing(
        certificates: pathlib.Path) -> None:  # noqa: F811
    ports, _inbox, mesh, replica_1 = certified_mesh(certificates)
    other = Hello(1, LinkTiming(), protocol=PEER_PROTOCOL + 1)
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            running = await start(group, mesh)
            stream = await dial(ports[0], replica_1)
            await stream.send(encode_frames([other.encode()]))
            await eventually(lambda: 1 in mesh.refused)
            await stream.aclose()
            await running.stop()
            group.cancel_scope.cancel()
    assert mesh.metrics[PROTOCOL_REFUSED] == 1
    assert mesh.metrics[TIMING_REFUSED] == 0
