"""Rejections: the business errors of the state machine, returned as values, never raised out.

A rejection carries a code from a fixed enum and a deterministic message (sorted lists, no object
addresses, no timings), so every replica returns byte-identical replies. Inside the package a
handler may raise `Refusal` to unwind; `apply` turns it into the `Rejection` value and rolls the
state back. A broken invariant is an `AssertionError`, which is a bug and stops the replica.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Code(enum.StrEnum):
    """Why a command was refused. The values are part of the wire format: never renumber."""

    MALFORMED = "malformed"  # the body is not a valid command: a field is missing or wrong
    TOO_LARGE = "too_large"
    UNKNOWN_COMMAND = "unknown_command"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNAUTHORIZED = "unauthorized"
    STALE_SEQUENCE = "stale_sequence"  # a session sequence older than the last one applied
    SEQUENCE_REUSED = "sequence_reused"  # the last sequence applied, with another command
    NO_CONFIG = "no_config"
    VERSION_MISMATCH = "version_mismatch"
    CONFIG_INVALID = "config_invalid"
    ASSIGNMENT_INFEASIBLE = "assignment_infeasible"
    CONFIG_CONFLICT = "config_conflict"  # valid alone, but it would strand live allocations
    UNKNOWN_NODE = "unknown_node"
    UNKNOWN_GPU = "unknown_gpu"
    INVENTORY_MISMATCH = "inventory_mismatch"
    STALE_INCARNATION = "stale_incarnation"
    NOT_REGISTERED = "not_registered"
    NODE_BUSY = "node_busy"
    UNKNOWN_VC = "unknown_vc"
    UNKNOWN_MODEL = "unknown_model"
    MODEL_NOT_IN_VC = "model_not_in_vc"
    NEVER_SATISFIABLE = "never_satisfiable"
    GROUP_CONFLICT = "group_conflict"  # the group id exists with a different spec
    UNKNOWN_GROUP = "unknown_group"
    GROUP_NOT_ALLOCATED = "group_not_allocated"
    NO_FREE_SLOT = "no_free_slot"
    UNKNOWN_POD = "unknown_pod"
    POD_MISMATCH = "pod_mismatch"
    SESSION_TOO_OLD = "session_too_old"  # stamped too long ago to open a session (sessions.py)
    SESSIONS_FULL = "sessions_full"  # no room for a new session until one expires
    SESSION_EXPIRED = "session_expired"  # run before, its cached reply dropped (sessions.py)
    GROUPS_FULL = "groups_full"  # GROUPS_MAX gangs held: release some before submitting more


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A command refused: nothing in the state changed."""

    code: Code
    message: str

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"


class Refusal(Exception):
    """Raised inside the package to refuse a command; `apply` catches it and rolls back."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.rejection = Rejection(code=code, message=message)


def refuse(code: Code, message: str) -> Refusal:
    """Build a `Refusal` to raise: `raise refuse(Code.UNKNOWN_NODE, ...)`."""
    return Refusal(code, message)
