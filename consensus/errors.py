"""The consensus package's own small exception hierarchy: expected conditions, never bugs.

A broken invariant is an `AssertionError` and stops the replica; a business rejection is a value
returned by the state machine; these are the conditions in between, which a caller branches on.
"""

from __future__ import annotations


class ConsensusError(Exception):
    """Base of every expected condition raised by `consensus`."""


class InvalidMessage(ConsensusError):
    """A decoded message or command failed validation: wrong type, out of range, or too big.

    Raised by decoders only; the replica drops and counts such a message and never trusts it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class QueryRefused(ConsensusError):
    """A state machine's query gate (`consensus.state_machine.QueryGate`) will not let the
    principal ask the query; the server answers REFUSED with `reason`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
