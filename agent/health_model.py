"""The words the agent's health policy speaks: watches, checks, incidents and verdicts.

A rule looks at one sample or event and answers with a `Check` on one (watch, code) key: PASS
when it looked and found nothing, or the status it found. Open checks become `Incident`s (see
`agent.health_conditions`), and a GPU's `Verdict` is the worst of its incidents.

Severity runs FAIL > WARN > UNKNOWN > PASS (reference/nvml.md §2.4). A signal that shows a fault
outranks a signal that shows nothing: WARN carries evidence and an action ("reset when idle"),
UNKNOWN only says the agent cannot see. Neither is ever a pass. The reason sent to the store is
the worst incident (the newest among equally bad ones), rendered deterministically and capped
at the store's REASON_LENGTH_MAX.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from statemachine.commands import HealthReport, HealthStatus
from statemachine.limits import REASON_LENGTH_MAX


class Watch(enum.StrEnum):
    """What an incident concerns: DCGM's health systems plus the agent's own."""

    MEMORY = "memory"
    THERMAL = "thermal"
    POWER = "power"
    PCIE = "pcie"
    NVLINK = "nvlink"
    XID = "xid"
    DRIVER = "driver"
    DEVICE = "device"
    FABRIC = "fabric"
    MIG = "mig"
    EVENTS = "events"


class Action(enum.StrEnum):
    """What an operator (or the agent's own follow-up) should do about an incident."""

    NONE = "none"
    RESTART_JOB = "restart_job"
    RESET_WHEN_IDLE = "reset_when_idle"
    RESET_GPU = "reset_gpu"
    REBOOT_NODE = "reboot_node"
    DRAIN_P2P = "drain_p2p"
    CONTACT_SUPPORT = "contact_support"
    CHECK_COOLING = "check_cooling"
    CHECK_POWER = "check_power"
    CHECK_FABRIC_MANAGER = "check_fabric_manager"
    CHECK_DRIVER = "check_driver"
    INVESTIGATE = "investigate"


SEVERITY: Final = {HealthStatus.PASS: 0, HealthStatus.UNKNOWN: 1, HealthStatus.WARN: 2,
                   HealthStatus.FAIL: 3}
ELLIPSIS: Final = "…"

Key = tuple[Watch, str]


def worse(first: HealthStatus, second: HealthStatus) -> HealthStatus:
    """The more severe of two statuses."""
    return first if SEVERITY[first] >= SEVERITY[second] else second


def capped(text: str, length_max: int = REASON_LENGTH_MAX) -> str:
    """`text`, cut to `length_max` characters with an ellipsis where it was cut."""
    assert length_max >= 1
    if len(text) <= length_max:
        return text
    return text[: length_max - 1] + ELLIPSIS


@dataclass(frozen=True, slots=True)
class Check:
    """One rule's answer about one key: PASS means it looked and found nothing there."""

    watch: Watch
    code: str
    status: HealthStatus
    message: str = ""
    action: Action = Action.NONE

    @property
    def key(self) -> Key:
        return (self.watch, self.code)

    @property
    def found(self) -> bool:
        return self.status is not HealthStatus.PASS


def clean(watch: Watch, code: str) -> Check:
    return Check(watch, code, HealthStatus.PASS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Incident:
    """An open finding on one GPU, after reference/nvml.md §2.4's record shape."""

    watch: Watch
    status: HealthStatus
    code: str  # stable, machine-readable: "dbe_volatile", "xid_79", "nvlink_down"
    message: str  # for people; at most REASON_LENGTH_MAX characters
    since_ms: int  # when it opened; kept while it stays open
    action: Action

    def order(self) -> tuple[int, int, str, str]:
        """Worst first, the newest first among equals, then by watch and code: the order
        verdicts list incidents in (so the reason tells the latest news of the worst kind)."""
        return (-SEVERITY[self.status], -self.since_ms, self.watch.value, self.code)


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """One GPU's health: the worst incident decides the status and the reason."""

    uuid: str
    status: HealthStatus
    reason: str  # "" when PASS; at most REASON_LENGTH_MAX characters
    incidents: tuple[Incident, ...]  # worst first

    def report(self) -> HealthReport:
        """The store command's view of this verdict."""
        return HealthReport(uuid=self.uuid, status=self.status, reason=self.reason)


def verdict_of(uuid: str, incidents: tuple[Incident, ...]) -> Verdict:
    ordered = tuple(sorted(incidents, key=Incident.order))
    if not ordered:
        return Verdict(uuid=uuid, status=HealthStatus.PASS, reason="", incidents=())
    worst = ordered[0]
    more = f" (+{len(ordered) - 1} more)" if len(ordered) > 1 else ""
    head = f"{worst.watch}/{worst.code}: "
    body = capped(worst.message, max(1, REASON_LENGTH_MAX - len(head) - len(more)))
    reason = capped(head + body + more)
    return Verdict(uuid=uuid, status=worst.status, reason=reason, incidents=ordered)
