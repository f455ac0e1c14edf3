"""Each node agent's share of the reserve the driver keeps for node agents' commands.

The driver keeps places and bytes that only node agents' commands may take
(`consensus.runtime.proposal_budget`), so that a flood of other clients' commands cannot refuse
the agents' heartbeats and let healthy nodes' leases lapse. Every agent shared that reserve
whole: one agent sending commands without waiting for answers (a bug, or a stolen key) could
hold all of it and starve every other node's heartbeats, the very lapse the reserve is there
to prevent. So the server counts each node's commands in flight, from submit until their
answer, and asks for the reserve only while the node holds fewer than `COMMANDS_PER_NODE_MAX`
of them and under `BYTES_PER_NODE_MAX` of their bytes; past either, its commands compete for
the shared budget like any other client's (counted in `server.node_reserve_exceeded`). An agent
has a heartbeat, a health report or an exit in flight at a time: a few commands of a few
kilobytes, far within its share.

Bounded: a node has an entry only while it has a command in flight under the reserve.
"""

from __future__ import annotations

from consensus.runtime.driver import Done
from consensus.runtime.metrics import Metrics

COMMANDS_PER_NODE_MAX = 32
BYTES_PER_NODE_MAX = 256 << 10
RESERVE_EXCEEDED = "server.node_reserve_exceeded"


class NodeReserve:
    """Commands and bytes each node holds in the reserve now (module docstring)."""

    __slots__ = ("_held", "metrics")

    def __init__(self, metrics: Metrics) -> None:
        self._held: dict[str, tuple[int, int]] = {}  # node -> (commands, bytes)
        self.metrics = metrics

    def held(self, node: str) -> tuple[int, int]:
        return self._held.get(node, (0, 0))

    def claim(self, node: str, size_bytes: int, done: Done) -> tuple[Done, bool]:
        """Whether `node`'s command of `size_bytes` may use the reserve, and the callback to
        hand the driver: `done`, which then also gives the command's share back."""
        commands, held_bytes = self.held(node)
        if commands >= COMMANDS_PER_NODE_MAX or held_bytes + size_bytes > BYTES_PER_NODE_MAX:
            self.metrics.count(RESERVE_EXCEEDED)
            return done, False
        self._held[node] = (commands + 1, held_bytes + size_bytes)

        def answered(reply: bytes | None, error: Exception | None) -> None:
            self._give_back(node, size_bytes)
            done(reply, error)

        return answered, True

    def _give_back(self, node: str, size_bytes: int) -> None:
        commands, held_bytes = self._held[node]
        if commands == 1:
            del self._held[node]
        else:
            self._held[node] = (commands - 1, held_bytes - size_bytes)
