"""Effects: what node agents and schedulers must learn from the log (see `outbox`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class EffectKind(enum.StrEnum):
    START_POD = "start_pod"
    KILL_POD = "kill_pod"
    GANG_ALLOCATED = "gang_allocated"
    GANG_PREEMPTING = "gang_preempting"
    GANG_RELEASED = "gang_released"
    GANG_DOWNGRADED = "gang_downgraded"
    GANG_FAILURE = "gang_failure"  # hardware under the gang failed
    GANG_REQUEUED = "gang_requeued"  # a preemptor lost its reservation and waits again
    POD_EXITED = "pod_exited"  # a gang's pod was first reported exited: the code and why


@dataclass(frozen=True, slots=True, kw_only=True)
class Effect:
    index: int
    kind: EffectKind
    node: str  # "" for gang events, which concern schedulers rather than one node
    group: str
    pod_uid: str = ""
    gpu_uuids: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    reason: str = ""
    command: tuple[str, ...] = ()  # START_POD: the argv to run
