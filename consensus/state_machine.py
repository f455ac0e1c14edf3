"""What consensus needs of the state machine it replicates: a small protocol, nothing more.

Consensus never imports the state machine; the runtime and the simulator hand it an object with
these methods. Commands arrive in the global log order, each exactly once, as the encoded
`Envelope` bytes a client proposed; the reply goes back to that client.
"""

from __future__ import annotations

from typing import Protocol


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
