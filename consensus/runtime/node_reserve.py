"""Each node agent's share of the reserve the driver keeps for node agents' commands.

The driver keeps places and bytes that only node agents' commands may take
(`consensus.runtime.proposal_budget`), so that a flood of other clients' commands cannot refuse
the agents' heartbeats and let healthy nodes' leases lapse. Every agent shared that reserve
whole: one agent sending commands without waiting for answers (a bug, or a stolen key) could
hold all of it and starve every other node's heartbeats, the very lapse the reserve is there
to prevent. So the server counts each node's commands in flight, from submit until the driver
lets go of their bytes (the command executed, was covered by a snapshot, or was refused: the
driver calls the `released` callback it was handed), and asks for the reserve only while the
node holds fewer than `COMMANDS_PER_NODE_MAX` of them and under `BYTES_PER_NODE_MAX` of their
bytes; past either, its commands compete for the shared budget like any other client's
(counted in `server.node_reserve_exceeded`). An agent has a heartbeat, a health report or an
exit in flight at a time: a few commands of a few kilobytes, far within its share.

The share was once given back at the command's answer, but an answer (UNKNOWN at the client's
deadline, at least WAIT_MS_MIN) comes while the command still waits in the core holding its
bytes in the reserve: an agent asking for no wait sent its share again and again and held the
whole reserve (tests/consensus/runtime/test_node_reserve_held_until_executed.py).

Bounded: a node has an entry only while it has a command in flight under the reserve.
"""

from __future__ import annotations

from collections.abc import Callable

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

    def claim(self, node: str, size_bytes: int) -> Callable[[], None] | None:
        """None when `node`'s command of `size_bytes` may not use the reserve; else the
        callback to hand the driver as `released`, which gives the command's share back (once,
        however often it is called)."""
        commands, held_bytes = self.held(node)
        if commands >= COMMANDS_PER_NODE_MAX or held_bytes + size_bytes > BYTES_PER_NODE_MAX:
            self.metrics.count(RESERVE_EXCEEDED)
            return None
        self._held[node] = (commands + 1, held_bytes + size_bytes)
        given_back = False

        def released() -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                self._give_back(node, size_bytes)

        return released

    def _give_back(self, node: str, size_bytes: int) -> None:
        commands, held_bytes = self._held[node]
        if commands == 1:
            del self._held[node]
        else:
            self._held[node] = (commands - 1, held_bytes - size_bytes)
