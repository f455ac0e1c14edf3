"""A node agent's share of the reserve lasts as long as its commands hold the reserve.

The server counted a node's commands in its share (node_reserve.py) from submit until their
answer, but the driver holds a command's bytes, in the reserve, until the command executes
(proposal_budget.py), whatever became of its client. An agent asking for no wait (timeout 0,
answered UNKNOWN after WAIT_MS_MIN) got its share back at each answer and sent its share again:
round after round it took the whole reserve, and every other node's heartbeat was refused
OVERLOADED while the other clients' commands filled the shared budget, the very lapse the
per-node share is there to prevent.

Method: a lone replica (its peers absent: nothing executes), a budget that a scheduler fills,
a flooding agent sending its share in rounds until well past the reserve, then another agent's
heartbeat."""

from __future__ import annotations

import anyio
import pytest

from consensus.config import ReplicaConfig
from consensus.envelope import Principal, Role
from consensus.prng import Prng
from consensus.replica import Replica
from consensus.runtime.client_codec import Code, Propose, decode_response, encode_request
from consensus.runtime.driver import Driver, DriverConfig
from consensus.runtime.metrics import Metrics
from consensus.runtime.node_reserve import BYTES_PER_NODE_MAX, COMMANDS_PER_NODE_MAX
from consensus.runtime.proposal_budget import NODE_RESERVED_BYTES
from consensus.runtime.server import ClientServer
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.local import SCHEDULER, MemoryFrames, MemoryStore

pytestmark = pytest.mark.anyio
BODY = b"h" * (BYTES_PER_NODE_MAX // COMMANDS_PER_NODE_MAX - 512)  # a share: 32 of these
HEARTBEAT = b"h" * 200  # a heartbeat's body, about its size
ROUNDS = 2 * NODE_RESERVED_BYTES // BYTES_PER_NODE_MAX  # twice the whole reserve


async def test_an_agent_answered_unknown_cannot_take_the_whole_reserve() -> None:
    replica = Replica(ReplicaConfig(replica_id=1, replica_count=3), Prng(1))
    driver = Driver(replica, MemoryStore(), SessionKv(), lambda target, frame: True, Metrics(),
                    config=DriverConfig(tick_ms=5, proposal_bytes_max=4096))
    server = ClientServer(driver)
    streams = {}
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)
            for principal in (SCHEDULER, Principal(Role.NODE, "n0"), Principal(Role.NODE, "n1")):
                up, server_in = anyio.create_memory_object_stream[bytes](1000)
                server_out, down = anyio.create_memory_object_stream[bytes](1000)
                tasks.start_soon(server.serve, principal, MemoryFrames(server_out, server_in))
                streams[principal.name] = (up, down)
            up, down = streams[SCHEDULER.name]  # the shared budget, full
            for sequence in range(1, 4):
                await up.send(encode_request(Propose(sequence, "s", sequence, b"x" * 1500,
                                                     5000)))
            assert decode_response(await down.receive()).code is Code.OVERLOADED
            up, down = streams["n0"]  # the flooder: its share, again and again, no wait
            request_id = 0
            for _ in range(ROUNDS):
                for _ in range(COMMANDS_PER_NODE_MAX):
                    request_id += 1
                    await up.send(encode_request(Propose(request_id, "n0", request_id, BODY,
                                                         0)))
                for _ in range(COMMANDS_PER_NODE_MAX):
                    await down.receive()  # UNKNOWN (taken) or OVERLOADED (past its share)
            for body in (b"h" * 200, b""):  # and the last bytes, in small commands
                for _ in range(ROUNDS):
                    for _ in range(COMMANDS_PER_NODE_MAX):
                        request_id += 1
                        await up.send(encode_request(Propose(request_id, "n0", request_id,
                                                             body, 0)))
                    for _ in range(COMMANDS_PER_NODE_MAX):
                        await down.receive()
            up, down = streams["n1"]  # another node's heartbeat
            await up.send(encode_request(Propose(1, "n1", 1, HEARTBEAT, 0)))
            answer = decode_response(await down.receive())
            tasks.cancel_scope.cancel()
    assert answer.code is not Code.OVERLOADED, (
        f"one agent held {driver.proposal_bytes} bytes, the whole reserve: another node's "
        f"heartbeat was refused: {answer.message}")
