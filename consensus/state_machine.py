"""What consensus needs of the state machine it replicates: a small protocol, nothing more.

Consensus never imports the state machine; the runtime and the simulator hand it an object with
these methods. Commands arrive in the global log order, each exactly once, as the encoded
`Envelope` bytes a client proposed; the reply goes back to that client.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from consensus.envelope import Principal


class StateMachine(Protocol):
    def apply(self, command: bytes) -> bytes:
        """Apply one encoded envelope; return the encoded reply. Deterministic; never raises
        for bad input (a rejection is a reply)."""
        ...

    def query(self, query: bytes) -> bytes:
        """Answer a read-only query on the current state."""
        ...

    def snapshot(self) -> bytes:
        """The whole state as canonical bytes: equal states give equal bytes."""
        ...

    def restore(self, snapshot: bytes) -> None:
        """Replace the whole state with one produced by `snapshot`."""
        ...

    def digest(self) -> bytes:
        """A short hash of the canonical state, equal across replicas and processes."""
        ...


@runtime_checkable
class QueryGate(Protocol):
    """A state machine that decides who may ask what (the GPU store: a node agent asks only
    about its own node). Commands carry their principal into `apply`; queries do not, so the
    server asks the gate before a read or watch goes to the driver."""

    def check_query(self, principal: Principal, query: bytes) -> str | None:
        """None if `principal` may ask `query`, else why not (answered REFUSED). Raises
        InvalidMessage, with the reason, for a query that does not decode (answered
        BAD_REQUEST): a watch of one would hold its bytes at the replica for its whole wait
        (up to ten minutes) only to be answered with the machine's error."""
        ...
