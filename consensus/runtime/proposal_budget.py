"""The bytes of client commands a replica holds: a budget, so a client cannot queue unbounded
memory at it.

Proposals are bounded in count by the driver's inbox and the core's queue, but one command may
be a megabyte, and a client's deadline bounds nothing: a command whose client stopped waiting
(OutcomeUnknown, or a request with no time to wait at all) stays queued in the core until it
executes. So the driver counts a command's bytes from `submit` until the command executes, a
peer's snapshot covers it, or the core refuses it, whatever became of its client; a submit that
would take the count past `bytes_max` is refused as Overloaded (nothing proposed: retrying is
safe).

A read's query counts too, from `submit_read` until its answer (or refusal, or expiry) is
handed to its client: the driver refunds it then (`Driver.submit_read`). A watch's query,
which may wait minutes, counts against a budget of its own (watch_budget.py).

Node agents' commands (heartbeats, health reports, exits) have a reserve that no other client
can take: past `bytes_max` the budget still admits a command the driver was told is reserved (the
server says so for a node-role principal's, and for no one else's), up to NODE_RESERVED_BYTES
more. The driver keeps the last NODE_RESERVED_COMMANDS places of its input queue's share for
clients and of the core's queue of proposals for them too (at most half of each). A flood of
other clients' commands had refused the agents' heartbeats as Overloaded while the sequencer's
own ticks, proposed past every budget, went on judging their leases: after a lease and its grace
healthy nodes were judged Down and their GPUs failed. All held stays bounded, by
`bytes_max + NODE_RESERVED_BYTES`.

One case is released on time instead: a snapshot installed from a peer may make the core forget
own commands it had in flight (their indexes fall below the snapshot), and it leaves their
clients to time out. The driver cannot tell which, so at such an install every held command
whose client no longer waits is released, and the others when their client's deadline passes.
"""

from __future__ import annotations

from collections.abc import Callable

# Bytes that only reserved (node agents') commands may hold past the budget: 4096 commands of
# up to 2 KiB, heartbeats and health reports of a few thousand nodes at once.
NODE_RESERVED_BYTES = 8 << 20
# Places kept for node agents' commands at the end of the driver's input queue's share for
# clients and of the core's queue of proposals (at most half of either).
NODE_RESERVED_COMMANDS = 4096


def shared_places(places: int) -> int:
    """Of a queue's `places` for clients' commands, those any client may take; the rest are
    kept for node agents' (module docstring)."""
    return places - min(NODE_RESERVED_COMMANDS, places // 2)


class ProposalBudget:
    """Bytes held per command tag, within `bytes_max` (node agents' reserve past it); see the
    module docstring."""

    __slots__ = ("_held", "_on_release", "_release_at_deadline", "bytes_max", "held_bytes")

    def __init__(self, bytes_max: int) -> None:
        if bytes_max <= 0:
            raise ValueError(f"bytes_max: must be positive, got {bytes_max}")
        self.bytes_max = bytes_max
        self.held_bytes = 0  # admitted: queued in the inbox, or held under a tag
        self._held: dict[int, int] = {}  # tag -> bytes, for commands the core took
        self._release_at_deadline: set[int] = set()
        # tag -> called once its bytes are released (a node agent's share: node_reserve.py)
        self._on_release: dict[int, Callable[[], None]] = {}

    def __len__(self) -> int:
        """Commands held under a tag."""
        return len(self._held)

    def admit(self, size: int, reserved: bool = False) -> bool:
        """Take `size` bytes for a command on its way to the core; False (nothing taken) when
        that would pass the budget, or for a `reserved` command its reserve."""
        limit = self.bytes_max + NODE_RESERVED_BYTES if reserved else self.bytes_max
        if self.held_bytes + size > limit:
            return False
        self.held_bytes += size
        return True

    def refund(self, size: int) -> None:
        """An admitted command the core refused: never proposed."""
        self.held_bytes -= size
        assert self.held_bytes >= 0

    def hold(self, tag: int, size: int, on_release: Callable[[], None] | None = None) -> None:
        """The core took an admitted command under `tag`; `on_release` is called once its
        bytes are released."""
        assert tag not in self._held, tag
        self._held[tag] = size
        if on_release is not None:
            self._on_release[tag] = on_release

    def release(self, tag: int) -> None:
        """The command under `tag` left the core (executed, or covered by a snapshot); a tag
        not held (another replica's, or released already) is ignored."""
        size = self._held.pop(tag, None)
        if size is not None:
            self.held_bytes -= size
            # both are empty but for a snapshot installed and node agents' commands: no call
            # into them then (this runs per command)
            if self._release_at_deadline:
                self._release_at_deadline.discard(tag)
            if self._on_release:
                on_release = self._on_release.pop(tag, None)
                if on_release is not None:
                    on_release()

    def forget_after_snapshot(self, waiting: Callable[[int], bool]) -> None:
        """A peer's snapshot was installed: release each held command whose client no longer
        waits (`waiting(tag)` False), and the others once their deadline passes."""
        for tag in list(self._held):
            if waiting(tag):
                self._release_at_deadline.add(tag)
            else:
                self.release(tag)

    def deadline_passed(self, tag: int) -> None:
        """The client of the command under `tag` stopped waiting."""
        if tag in self._release_at_deadline:
            self.release(tag)
