"""What the job runner answers: the outcome of a start, of a job's exit, of a stop and of a
reconciliation after a restart. Plain frozen values, so the agent can report them to the store
as they are.

Exit codes follow the shell's convention:

- a job that exits by itself: its exit code, 0 to 255;
- a job killed by signal n: 128 + n (SIGKILL: 137, SIGTERM: 143);
- a job whose status cannot be known: `EXIT_CODE_UNKNOWN` (-1), which no process can return.
  This is the case of a job adopted after an agent restart (it is no longer the agent's child,
  so nobody tells the agent how it ended) and of a job lost while the agent was down.
"""

from __future__ import annotations

import enum
import os
import signal
from dataclasses import dataclass
from typing import Final

from agent.binding import Binding

EXIT_CODE_UNKNOWN: Final = -1
SIGNAL_EXIT_BASE: Final = 128
REASON_ADOPTED_EXIT: Final = "exit status unknown: the agent restarted while it ran"
REASON_LOST: Final = ("lost: started before the agent restarted and not running when it "
                      "reconciled; exit status unknown")


@dataclass(frozen=True, slots=True, kw_only=True)
class Started:
    pod_uid: str
    pid: int
    pgid: int
    start_ticks: int  # /proc/<pid>/stat field 22: clock ticks after boot
    log_path: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StartRefused:
    """The binding was not launched and never will be by this runner: it is invalid for this
    node, was started before, or the node runs `jobs_max` jobs."""

    pod_uid: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StartFailed:
    """Launching failed (command not found, permission denied, disk full): the reason is the
    OS error. The pod uid counts as started and is never launched again."""

    pod_uid: str
    reason: str


StartOutcome = Started | StartRefused | StartFailed


@dataclass(frozen=True, slots=True, kw_only=True)
class Exited:
    pod_uid: str
    group: str
    exit_code: int  # see the module docstring
    reason: str


def exit_of_wait_status(status: int) -> tuple[int, str]:
    """The exit code and its reason for a `waitpid` status."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return code, f"exited with code {code}"
    return SIGNAL_EXIT_BASE - code, f"killed by signal {-code} ({_signal_name(-code)})"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unnamed"


class Termination(enum.StrEnum):
    NOT_RUNNING = "not_running"  # unknown pod, or it had already exited: nothing was done
    STOPPED = "stopped"  # the whole group was gone within the grace period after SIGTERM
    KILLED = "killed"  # something outlived the grace period; SIGKILL ended the group
    UNKILLABLE = "unkillable"  # a process outlived SIGKILL by kill_wait_s (stuck in the kernel)


class GpuRelease(enum.StrEnum):
    NO_GPUS = "no_gpus"  # nothing to check: CPU-only job, or no stop was needed
    RELEASED = "released"  # NVML shows none of the job's processes on its GPUs
    LINGERING = "lingering"  # some still show after gpu_release_timeout_s
    UNCHECKED = "unchecked"  # NVML was unavailable or a GPU was gone: no confirmation


@dataclass(frozen=True, slots=True, kw_only=True)
class StopOutcome:
    pod_uid: str
    termination: Termination
    gpu_release: GpuRelease
    lingering_pids: tuple[int, ...] = ()  # sorted; set with LINGERING
    detail: str = ""  # why the check could not be made, for UNCHECKED

    @property
    def needs_attention(self) -> bool:
        """The job's GPUs must not be handed out again before someone looks at them."""
        return (self.termination is Termination.UNKILLABLE
                or self.gpu_release in (GpuRelease.LINGERING, GpuRelease.UNCHECKED))


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileReport:
    """What the runner found after a restart, each list sorted by pod uid.

    - `adopted`: expected and running; watched again, its exit will be reported.
    - `lost`: expected and started before, but its first process no longer runs: report it to
      the store as exited (`EXIT_CODE_UNKNOWN`, `REASON_LOST`); it is never started again.
      Processes it left running have been stopped before the report is returned.
    - `to_start`: expected and never started here: the caller starts it.
    - `to_stop`: running but not expected (the store does not know it): adopted, so the
      caller can stop it.
    """

    adopted: tuple[Binding, ...]
    lost: tuple[Exited, ...]
    to_start: tuple[Binding, ...]
    to_stop: tuple[Binding, ...]
