"""What one NVML event means for the GPU it names (reference/nvml.md §1.2, §2.1, §2.2, §2.4).

| event | status | closes after (then clean checks) |
| --- | --- | --- |
| XID classed FAIL (48, 64, 74, 79, 95, 119, 120, 140) | FAIL | a reset |
| XID classed WARN (63, 92, 94, DCGM's lists; unknown XIDs) | WARN | xid_warn_quiet_ms, or a reset |
| application XID (13, 31, 43, 45, 68, 109) | a job fault | - |
| ... repeated job_fault_repeats_to_warn times in the window | WARN | the window, or a reset |
| DOUBLE_BIT_ECC | FAIL | a reset |
| RECOVERY_ACTION | as the polled rule | the polled action back to NONE |
| GPU_UNAVAILABLE | FAIL | a reset |
| SINGLE_BIT_ECC, OTHER | nothing (the device plugin skips them) | |

XID incidents are keyed by number ("xid/xid_79"), so each XID is one incident however often it
repeats, and the message does not change with the count (the store sees no churn).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from agent.gpu import WHOLE_DEVICE, EventKind, GpuEvent
from agent.health_conditions import Clearing
from agent.health_model import Action, Check, Watch
from agent.health_policy import HealthPolicy, XidClass
from agent.health_rules import recovery_checks
from statemachine.commands import HealthStatus

# Short names, in our words, for the best-known XIDs (NVIDIA's Xid catalog has them all).
XID_NAMES: Final = {
    13: "graphics engine exception", 31: "GPU memory page fault",
    32: "corrupted push buffer stream", 43: "GPU stopped processing",
    45: "preemptive cleanup", 48: "double-bit ECC error", 62: "internal micro-controller halt",
    63: "page retirement or row remap recorded", 64: "page retirement or row remap failed",
    68: "video processor exception", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate", 94: "contained ECC error",
    95: "uncontained ECC error", 109: "context switch timeout", 119: "GSP RPC timeout",
    120: "GSP error", 140: "unrecovered ECC error",
}
XID_ACTIONS: Final = {79: Action.REBOOT_NODE, 64: Action.CONTACT_SUPPORT,
                      140: Action.CONTACT_SUPPORT}


@dataclass(frozen=True, slots=True)
class Opened:
    """An incident an event opens (or refreshes)."""

    check: Check
    clearing: Clearing
    quiet_ms: int = 0


@dataclass(frozen=True, slots=True)
class JobXid:
    """An application XID: the fault belongs to the job that ran on the GPU."""

    xid: int
    label: str


def xid_of(event: GpuEvent) -> int:
    """The XID number: NVML's eventData, carried in `xid` (in `data` by older producers)."""
    return event.xid if event.xid is not None else event.data


def xid_label(xid: int) -> str:
    name = XID_NAMES.get(xid)
    return f"XID {xid} ({name})" if name else f"XID {xid}"


def instance_of(event: GpuEvent) -> str:
    """Where on a MIG GPU the event happened, or "" for the whole device."""
    if event.gpu_instance == WHOLE_DEVICE:
        return ""
    compute = "" if event.compute_instance == WHOLE_DEVICE else \
        f", compute instance {event.compute_instance}"
    return f" on GPU instance {event.gpu_instance}{compute}"


def event_outcome(policy: HealthPolicy, event: GpuEvent) -> Opened | JobXid | None:
    """What `event` opens on its GPU, a job fault, or nothing."""
    if event.kind is EventKind.XID:
        return xid_outcome(policy, xid_of(event), instance_of(event))
    if event.kind is EventKind.DOUBLE_BIT_ECC:
        return Opened(Check(Watch.MEMORY, "dbe_event", HealthStatus.FAIL,
                            f"double-bit ECC error event{instance_of(event)}", Action.RESET_GPU),
                      Clearing.RESET)
    if event.kind is EventKind.GPU_UNAVAILABLE:
        return Opened(Check(Watch.DEVICE, "gpu_unavailable", HealthStatus.FAIL,
                            "the driver reports the GPU unavailable", Action.RESET_GPU),
                      Clearing.RESET)
    if event.kind is EventKind.RECOVERY_ACTION:
        for check in recovery_checks(event.data):
            return Opened(check, Clearing.EVIDENCE) if check.found else None
    return None


def xid_outcome(policy: HealthPolicy, xid: int, where: str) -> Opened | JobXid | None:
    label = xid_label(xid) + where
    kind = policy.classify_xid(xid)
    if kind is XidClass.JOB:
        return JobXid(xid, label)
    if kind is XidClass.FAIL:
        return Opened(Check(Watch.XID, f"xid_{xid}", HealthStatus.FAIL, label,
                            XID_ACTIONS.get(xid, Action.RESET_GPU)), Clearing.RESET)
    if kind is XidClass.WARN:
        return Opened(Check(Watch.XID, f"xid_{xid}", HealthStatus.WARN, label,
                            Action.INVESTIGATE), Clearing.QUIET, policy.xid_warn_quiet_ms)
    return None


def repeated_job_faults(policy: HealthPolicy) -> Opened:
    """Application XIDs repeating on one GPU point at the GPU after all (the Xid catalog's
    investigatory workflows): WARN, to run diagnostics."""
    window_s = policy.job_fault_window_ms // 1000
    message = (f"{policy.job_fault_repeats_to_warn} application XIDs within {window_s} s: run "
               "diagnostics")
    return Opened(Check(Watch.XID, "job_faults_repeated", HealthStatus.WARN, message,
                        Action.INVESTIGATE), Clearing.QUIET, policy.job_fault_window_ms)
