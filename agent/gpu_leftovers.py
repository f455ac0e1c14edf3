"""Leftovers of ended jobs: GPUs that still list a job's processes after its release timeout.

Owns the registry of those GPUs, and nothing else: per GPU, the pids (with start ticks) of
ended jobs that NVML still listed when `agent.gpu_release.wait_released` gave up, the pods they
belonged to and the timeout that ran out. Why: once a job's exit is reported the store frees
its GPUs and may bind the next job onto one that still holds the dead job's CUDA context and
memory. The monitor (`agent.monitor`) turns each record into a FAIL finding on the GPU's
`device/ended_job_processes` key, reported before the exit is, and re-judges it at every poll
from NVML's process list, so the incident closes by the tracker's evidence rules
(`agent.health_conditions`: a run of clean checks); once closed, the record is forgotten here.

A recorded pid still counts as the job's by `agent.gpu_release`'s rule: NVML lists it and /proc
has no such process (a context left behind) or has it with the recorded start ticks; a listed
pid that /proc shows with another start time is a new process that reused the number.

Bounded: at most `gpus_max` GPUs, `pids_per_gpu_max` pids and `pods_per_gpu_max` pod names per
GPU. A note for one GPU more is dropped (and counted; the node has fewer GPUs than that). Pids
past the limit are not kept but counted as untracked: while a GPU has untracked pids, any
process NVML lists on it keeps it failed, since the agent can no longer tell which are the
ended jobs'. Pod names past the limit only shorten the message. Not persisted: an agent
restart forgets the records (and its tracker starts afresh).

The registry does no I/O and is used from the event loop only; `look` is the one function that
reads NVML and /proc, and runs in a worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from agent.gpu_release import GpuProcesses, lingering_pids
from agent.health_model import Action, Check, Key, Watch, clean
from statemachine.commands import HealthStatus

LEFTOVERS: Final[Key] = (Watch.DEVICE, "ended_job_processes")
GPUS_MAX: Final = 1024
PIDS_PER_GPU_MAX: Final = 256
PODS_PER_GPU_MAX: Final = 16
MESSAGE_PIDS_MAX: Final = 16  # pids named in a message; the incident caps its length anyway


@dataclass(frozen=True, slots=True, kw_only=True)
class Look:
    """What one read of a GPU's process list says about its recorded leftovers."""

    lingering: tuple[int, ...]  # recorded pids still the ended jobs', sorted
    listed_count: int  # processes NVML lists on the GPU, the ended jobs' or not


@dataclass(slots=True)
class _Record:
    pids: dict[int, int] = field(default_factory=dict)  # pid: start ticks
    pods: list[str] = field(default_factory=list)  # oldest first, at most pods_per_gpu_max
    pods_untracked: int = 0
    pids_untracked: int = 0
    timeout_s: float = 0.0  # the release timeout that ran out last


class GpuLeftovers:
    """The registry; see the module docstring."""

    def __init__(self, *, gpus_max: int = GPUS_MAX, pids_per_gpu_max: int = PIDS_PER_GPU_MAX,
                 pods_per_gpu_max: int = PODS_PER_GPU_MAX) -> None:
        assert min(gpus_max, pids_per_gpu_max, pods_per_gpu_max) >= 1
        self._gpus_max = gpus_max
        self._pids_max = pids_per_gpu_max
        self._pods_max = pods_per_gpu_max
        self._records: dict[str, _Record] = {}
        self.notes_dropped = 0  # notes for a GPU past gpus_max

    def __contains__(self, uuid: str) -> bool:
        return uuid in self._records

    def uuids(self) -> tuple[str, ...]:
        """The GPUs with a record, sorted."""
        return tuple(sorted(self._records))

    def pids(self, uuid: str) -> dict[int, int]:
        """A copy of the pids recorded on the GPU (pid: start ticks); empty without a record."""
        record = self._records.get(uuid)
        return {} if record is None else dict(record.pids)

    def note(self, uuid: str, pod_uid: str, pids: Mapping[int, int], timeout_s: float
             ) -> Check | None:
        """An ended job's `pids` (pid: start ticks) still listed on the GPU after `timeout_s`:
        recorded, and the FAIL finding for them. None when the note was dropped."""
        record = self._records.get(uuid)
        if record is None:
            if len(self._records) >= self._gpus_max:
                self.notes_dropped += 1
                return None
            record = self._records[uuid] = _Record()
        _add_pids(record, pids, self._pids_max)
        _add_pod(record, pod_uid, self._pods_max)
        record.timeout_s = timeout_s
        return _finding(record, tuple(sorted(pids)))

    def judge(self, uuid: str, look: Look) -> Check | None:
        """The polled check for the GPU from one `look` at it: FAIL while a recorded pid is
        still the ended jobs' (or, with untracked pids, while NVML lists any process), PASS
        otherwise; None when the GPU has no record."""
        record = self._records.get(uuid)
        if record is None:
            return None
        if look.lingering:
            return _finding(record, look.lingering)
        if record.pids_untracked and look.listed_count:
            return _finding(record, ())
        return clean(*LEFTOVERS)

    def forget(self, uuid: str) -> None:
        """The GPU's incident closed: its record goes."""
        self._records.pop(uuid, None)


def look(gpus: GpuProcesses, uuid: str, pids: Mapping[int, int]) -> Look:
    """Read the GPU's process list and /proc (blocks: run it in a worker thread)."""
    listed = tuple(process.pid for process in gpus.processes(uuid))
    return Look(lingering=lingering_pids(listed, pids), listed_count=len(listed))


def _add_pids(record: _Record, pids: Mapping[int, int], pids_max: int) -> None:
    for pid in sorted(pids):
        if pid in record.pids or len(record.pids) < pids_max:
            record.pids[pid] = pids[pid]
        else:
            record.pids_untracked += 1


def _add_pod(record: _Record, pod_uid: str, pods_max: int) -> None:
    if pod_uid in record.pods:
        return
    if len(record.pods) < pods_max:
        record.pods.append(pod_uid)
    else:
        record.pods_untracked += 1


def _finding(record: _Record, pids: tuple[int, ...]) -> Check:
    named = list(pids[:MESSAGE_PIDS_MAX])
    more_pids = len(pids) - len(named) + record.pids_untracked
    pid_text = f"pids {named}" + (f" (+{more_pids} more)" if more_pids else "")
    pods = ", ".join(record.pods) + (f" (+{record.pods_untracked} more)"
                                     if record.pods_untracked else "")
    pods_word = "pod" if len(record.pods) + record.pods_untracked == 1 else "pods"
    message = (f"processes of an ended job still on the GPU after {record.timeout_s:g} s: "
               f"{pid_text}; {pods_word} {pods}")
    return Check(*LEFTOVERS, HealthStatus.FAIL, message, Action.INVESTIGATE)
