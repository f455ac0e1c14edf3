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
    server asks the gate before a read or watch goes to the driver, and runs the query the
    gate hands back, which may be narrower than the one asked (the bytes stay opaque here)."""

    def admit_query(self, principal: Principal, query: bytes) -> bytes:
        """The query to run for `principal`: `query` itself, or one narrowed to what the
        principal may see of it (the GPU store answers a node agent's whole-gang query with
        its own node's share). Raises QueryRefused, with why, for a query the principal may
        not ask (answered REFUSED), and InvalidMessage, with the reason, for one that does
        not decode (answered BAD_REQUEST): a watch of one would hold its bytes at the replica
        for its whole wait (up to ten minutes) only to be answered with the machine's error."""
        ...
