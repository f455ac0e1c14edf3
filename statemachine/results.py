"""What `apply` returns: one typed value per kind of outcome, or a `Rejection`.

Results are replies to the client that sent the command; they are cached in its session and
must therefore be deterministic values (sorted tuples, no object identities). What node agents
must *do* (start or kill a pod) goes to the outbox instead, where every agent can watch it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from statemachine.errors import Rejection


class GroupPhase(enum.StrEnum):
    PENDING = "pending"
    PREEMPTING = "preempting"  # cells reserved; waiting for the victims to leave
    ALLOCATED = "allocated"


class PodPhase(enum.StrEnum):
    UNBOUND = "unbound"  # a slot of the placement that no pod has claimed yet
    BOUND = "bound"  # a pod claimed it; the start effect is in the outbox
    RUNNING = "running"  # the agent acknowledged the start
    EXITED = "exited"


@dataclass(frozen=True, slots=True, kw_only=True)
class PodView:
    member: int
    index: int
    node: str
    gpu_indices: tuple[int, ...]
    pod_uid: str
    phase: PodPhase
    exit_code: int = 0
    exit_reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupStatus:
    group: str
    vc: str
    phase: GroupPhase
    priority: int
    effective_priority: int  # -1 once lazily downgraded
    chain: str
    pods: tuple[PodView, ...]
    victims: tuple[str, ...]
    evicting: str  # why the gang is being made to leave ("" when it is not)
    why_pending: str
    failures: tuple[str, ...]  # "uuid: reason", sorted; the first, up to a bound on bytes
    failures_omitted: int = 0  # the lines after those, left out


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigApplied:
    version: int
    # gangs that no longer fit their tenant and now run opportunistic; the first, by id, up
    # to a bound on bytes (limits.CONFIG_NAMES_BYTES_MAX)
    downgraded: tuple[str, ...]
    requeued: tuple[str, ...]  # preempting gangs sent back to the queue; the same
    downgraded_omitted: int = 0  # the gangs after those, left out
    requeued_omitted: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PodAssignment:
    """A pod the node must run: the agent (re)establishes these after registering. One whose
    gang is being evicted is listed too, to be stopped or, when it never ran, reported exited
    without being started."""

    group: str
    pod_uid: str
    gpu_uuids: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    command: tuple[str, ...] = ()
    evicting: bool = False  # its gang is being made to leave: never start it


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRegistered:
    node: str
    incarnation: int
    pods: tuple[PodAssignment, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PodBound:
    group: str
    member: int
    index: int
    pod_uid: str
    node: str
    gpu_uuids: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Done:
    """A command that needs no data back; `note` says what changed, for logs."""

    note: str


Result = GroupStatus | ConfigApplied | NodeRegistered | PodBound | Done | Rejection
