"""The node agent's GPU health tracker: observations in, verdicts out, no I/O.

The agent hands `HealthTracker` everything it learns about its GPUs, with the time it learnt it
(`now_ms` is always an argument, never read): samples it polled, events it waited for, a GPU that
stopped answering, NVML failing for the whole node, the event wait failing. Per GPU the tracker
keeps its open incidents (agent.health_conditions: opening, hysteresis, clearing), its signals'
last good values (agent.health_signals) and what the link rules remember (agent.health_links),
and answers with one `Verdict` per GPU, the worst incident deciding (agent.health_model).

- `take_changes` hands back the verdicts whose status or reason changed since it was last
  called: what the agent reports to the store at once.
- `take_job_faults` hands back application XIDs (reference/nvml.md §2.4): they belong to the job
  that ran on the GPU, and the agent attaches them there; the GPU only warns once they repeat.
- `observe_finding` takes evidence found between polls (an ended job's processes still on a
  GPU, agent.gpu_leftovers); the checks on its key passed with later samples close it.
- A GPU never sampled is UNKNOWN; NVML unavailable makes every GPU UNKNOWN, never PASS and never
  "0 GPUs"; a failed event wait makes every GPU UNKNOWN on the events watch until a wait succeeds.
- A sample or loss for a GPU the tracker does not know is ignored (`observe_devices` adds GPUs);
  an event for one makes every GPU UNKNOWN on the events watch until events quiet down, since
  the device plugin's lesson is that an event one cannot attribute could concern any GPU.

Deterministic: integer arithmetic, no randomness, and every output in sorted order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Final

from agent.gpu import DeviceInfo, DeviceSample, GpuEvent, NvmlCode
from agent.health_conditions import Clearing, Conditions
from agent.health_events import JobXid, Opened, event_outcome, repeated_job_faults, xid_of
from agent.health_links import LinkWatch
from agent.health_model import Action, Check, Key, Verdict, Watch, clean, verdict_of, worse
from agent.health_policy import HealthPolicy
from agent.health_rules import Context, polled_checks
from agent.health_signals import SignalMemory
from statemachine.commands import HealthStatus

JOB_FAULTS_MAX: Final = 1024  # untaken job faults kept; the oldest drop first
XID_INCIDENTS_MAX: Final = 32  # distinct XIDs open on one GPU; more fold into "xid_many"
# Counters that only a GPU reset or driver reload sets back (reference/nvml.md §1.3, §1.4).
RESET_COUNTERS: Final = ("ecc_volatile_corrected", "ecc_volatile_uncorrected", "energy_mj")
# GpuGone codes after which the GPU answering again means it was reset.
LOST_CODES: Final = frozenset({NvmlCode.GPU_IS_LOST, NvmlCode.RESET_REQUIRED,
                               NvmlCode.GPU_NOT_FOUND, NvmlCode.NOT_FOUND})
CODE_NAMES: Final = {int(member): member.name.lower() for member in NvmlCode}
MISSING: Final = "missing from NVML's device list"  # the reason a GPU not listed fails
NO_SAMPLE: Final[Key] = (Watch.DEVICE, "no_sample")
GONE: Final[Key] = (Watch.DEVICE, "gpu_gone")
NVML_UNAVAILABLE: Final[Key] = (Watch.DRIVER, "nvml_unavailable")
EVENT_WAIT_FAILED: Final[Key] = (Watch.EVENTS, "event_wait_failed")
ANSWERED: Final = (NO_SAMPLE, GONE, NVML_UNAVAILABLE)  # a sample is evidence against these


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFault:
    """An application XID on a GPU: the job running there faulted, not (yet) the GPU."""

    uuid: str
    xid: int
    label: str  # "XID 13 (graphics engine exception)", with the MIG instance if any
    at_ms: int
    gpu_instance: int
    compute_instance: int


@dataclass(slots=True)
class _Gpu:
    info: DeviceInfo
    conditions: Conditions
    signals: SignalMemory = field(default_factory=SignalMemory)
    links: LinkWatch = field(default_factory=LinkWatch)
    lost: bool = False  # it stopped answering with a LOST_CODES code: answering is a reset
    job_faults_ms: deque[int] = field(default_factory=deque)  # newest application XIDs


class HealthTracker:
    """Per-GPU health from observations; see the module docstring for the contract."""

    def __init__(self, policy: HealthPolicy, devices: tuple[DeviceInfo, ...], *,
                 now_ms: int = 0) -> None:
        self._policy = policy
        self._gpus: dict[str, _Gpu] = {}
        self._reported: dict[str, tuple[HealthStatus, str]] = {}
        self._job_faults: deque[JobFault] = deque(maxlen=JOB_FAULTS_MAX)
        for device in sorted(devices, key=lambda device: device.uuid):
            self._add(device, now_ms)

    def _add(self, device: DeviceInfo, now_ms: int) -> None:
        gpu = _Gpu(info=device, conditions=Conditions(self._policy),
                   job_faults_ms=deque(maxlen=self._policy.job_fault_repeats_to_warn))
        gpu.conditions.found(Check(*NO_SAMPLE, HealthStatus.UNKNOWN, "not sampled yet"), now_ms)
        self._gpus[device.uuid] = gpu

    # Observations.

    def observe_devices(self, devices: tuple[DeviceInfo, ...], now_ms: int) -> None:
        """NVML's device list again: new GPUs are added (UNKNOWN until sampled), known ones
        take the new properties (MIG mode), and a GPU missing from the list fails as lost."""
        present = {device.uuid: device for device in devices}
        for uuid in sorted(present):
            if uuid in self._gpus:
                self._gpus[uuid].info = present[uuid]
            else:
                self._add(present[uuid], now_ms)
        for uuid in sorted(set(self._gpus) - set(present)):
            self._lose(self._gpus[uuid], NvmlCode.GPU_NOT_FOUND, MISSING, now_ms)

    def observe_properties(self, devices: tuple[DeviceInfo, ...]) -> None:
        """New properties (MIG mode) of GPUs already tracked; others are ignored."""
        for device in devices:
            gpu = self._gpus.get(device.uuid)
            if gpu is not None:
                gpu.info = device

    def observe_missing(self, devices: tuple[DeviceInfo, ...], now_ms: int) -> None:
        """GPUs the node registered that NVML does not list: tracked if they were not, and
        failed as lost."""
        for device in sorted(devices, key=lambda device: device.uuid):
            if device.uuid not in self._gpus:
                self._add(device, now_ms)
            self._lose(self._gpus[device.uuid], NvmlCode.GPU_NOT_FOUND, MISSING, now_ms)

    def observe_sample(self, sample: DeviceSample, now_ms: int,
                       judged_elsewhere: tuple[Check, ...] = ()) -> None:
        """One poll of one GPU: every polled rule, against this sample and the last good values
        before it, with the checks the agent made of the GPU at the same poll outside the
        sample (`judged_elsewhere`: agent.gpu_leftovers); RESET and QUIET incidents move
        towards closing."""
        gpu = self._gpus.get(sample.uuid)
        if gpu is None:
            return
        policy = self._policy
        values, checks = gpu.signals.observe(
            sample, now_ms, failed_reads_to_unknown=policy.failed_reads_to_unknown,
            essential=policy.essential_signals)
        context = Context(policy=policy, device=gpu.info, values=values, fabric=sample.fabric)
        checks.extend(polled_checks(context))
        checks.extend(gpu.links.checks(context))
        checks.extend(clean(*key) for key in ANSWERED)
        checks.extend(judged_elsewhere)
        reset = gpu.lost or any(values.dropped(name) for name in RESET_COUNTERS)
        gpu.lost = False
        for check in _worst_by_key(checks):
            gpu.conditions.look(check, now_ms)
        gpu.conditions.end_of_sample(now_ms, reset=reset)

    def observe_event(self, event: GpuEvent, now_ms: int) -> None:
        outcome = event_outcome(self._policy, event)
        gpu = self._gpus.get(event.uuid)
        if outcome is None:
            return
        if gpu is None:
            self._unattributed(event, now_ms)
        elif isinstance(outcome, JobXid):
            self._job_fault(gpu, event, outcome, now_ms)
        else:
            self._open(gpu, outcome, now_ms)

    def observe_gone(self, uuid: str, code: int, message: str, now_ms: int) -> None:
        """One GPU stopped answering (GpuGone). FAIL until it answers again and then passes
        its clean checks; a corrupted InfoROM only warns (reference/nvml.md §4.1)."""
        gpu = self._gpus.get(uuid)
        if gpu is not None:
            self._lose(gpu, code, message, now_ms)

    def observe_finding(self, uuid: str, check: Check, now_ms: int) -> None:
        """Evidence found outside a poll (a job's processes left on the GPU): opens or
        refreshes the incident, which closes by the polled checks on its key (EVIDENCE)."""
        gpu = self._gpus.get(uuid)
        if gpu is not None and check.found:
            gpu.conditions.found(check, now_ms)

    def observe_unavailable(self, message: str, now_ms: int) -> None:
        """NVML cannot be used on the node: every GPU is UNKNOWN until it is sampled again."""
        check = Check(*NVML_UNAVAILABLE, HealthStatus.UNKNOWN, f"NVML unavailable: {message}",
                      Action.CHECK_DRIVER)
        for uuid in sorted(self._gpus):
            self._gpus[uuid].conditions.found(check, now_ms)

    def observe_event_wait_failed(self, message: str, now_ms: int) -> None:
        """Events may have been lost: the events watch of every GPU is UNKNOWN until a wait
        succeeds (polled counters catch up with what the events would have said)."""
        check = Check(*EVENT_WAIT_FAILED, HealthStatus.UNKNOWN,
                      f"waiting for GPU events failed, events may be lost: {message}",
                      Action.CHECK_DRIVER)
        for uuid in sorted(self._gpus):
            self._gpus[uuid].conditions.found(check, now_ms)

    def observe_event_wait_ok(self, now_ms: int) -> None:
        """An event wait returned (an event or the routine timeout): events flow again."""
        del now_ms  # the close needs no time; kept for a uniform observe_* signature
        for uuid in sorted(self._gpus):
            self._gpus[uuid].conditions.settle(EVENT_WAIT_FAILED)

    def clear(self, uuid: str) -> bool:
        """An operator's clear: closes every incident of the GPU at once; evidence still there
        opens again at the next sample. False for a GPU the tracker does not know."""
        gpu = self._gpus.get(uuid)
        if gpu is None:
            return False
        gpu.conditions.clear()
        gpu.job_faults_ms.clear()
        return True

    # Answers.

    def verdicts(self) -> tuple[Verdict, ...]:
        """One verdict per GPU, by UUID."""
        return tuple(verdict_of(uuid, self._gpus[uuid].conditions.incidents())
                     for uuid in sorted(self._gpus))

    def is_open(self, uuid: str, key: Key) -> bool:
        """Whether the GPU has an open incident on `key`."""
        gpu = self._gpus.get(uuid)
        return gpu is not None and key in gpu.conditions

    def take_changes(self) -> tuple[Verdict, ...]:
        """The verdicts whose (status, reason) changed since the last call; all at the first."""
        changed = []
        for verdict in self.verdicts():
            now = (verdict.status, verdict.reason)
            if self._reported.get(verdict.uuid) != now:
                self._reported[verdict.uuid] = now
                changed.append(verdict)
        return tuple(changed)

    def take_job_faults(self) -> tuple[JobFault, ...]:
        """Application XIDs since the last call, oldest first (at most JOB_FAULTS_MAX)."""
        faults = tuple(self._job_faults)
        self._job_faults.clear()
        return faults

    def last_good(self, uuid: str, signal: str) -> tuple[int, int] | None:
        """(value, read at ms) of a signal's last good reading on a GPU, for metrics."""
        gpu = self._gpus.get(uuid)
        return None if gpu is None else gpu.signals.last_good(signal)

    # Helpers.

    def _lose(self, gpu: _Gpu, code: int, message: str, now_ms: int) -> None:
        inforom = code == NvmlCode.CORRUPTED_INFOROM
        name = CODE_NAMES.get(code, "error")
        check = Check(*GONE, HealthStatus.WARN if inforom else HealthStatus.FAIL,
                      f"the GPU stopped answering: {name} (NVML {code}): {message}",
                      Action.INVESTIGATE if inforom else Action.RESET_GPU)
        gpu.conditions.found(check, now_ms)
        gpu.lost = gpu.lost or code in LOST_CODES

    def _open(self, gpu: _Gpu, opened: Opened, now_ms: int) -> None:
        check = opened.check
        if (check.watch is Watch.XID and check.key not in gpu.conditions
                and gpu.conditions.count(Watch.XID, "xid_") >= XID_INCIDENTS_MAX):
            check = replace(check, code="xid_many",
                            message=f"more than {XID_INCIDENTS_MAX} distinct XIDs, the last "
                                    f"{check.message}")
        gpu.conditions.found(check, now_ms, opened.clearing, opened.quiet_ms)

    def _job_fault(self, gpu: _Gpu, event: GpuEvent, job: JobXid, now_ms: int) -> None:
        self._job_faults.append(JobFault(uuid=event.uuid, xid=xid_of(event), label=job.label,
                                         at_ms=now_ms, gpu_instance=event.gpu_instance,
                                         compute_instance=event.compute_instance))
        times = gpu.job_faults_ms
        times.append(now_ms)
        if len(times) == times.maxlen and now_ms - times[0] <= self._policy.job_fault_window_ms:
            self._open(gpu, repeated_job_faults(self._policy), now_ms)

    def _unattributed(self, event: GpuEvent, now_ms: int) -> None:
        check = Check(Watch.EVENTS, "unattributed_event", HealthStatus.UNKNOWN,
                      f"a {event.kind} event for a GPU this agent does not know "
                      f"({event.uuid!r}): it could concern any GPU")
        for uuid in sorted(self._gpus):
            self._gpus[uuid].conditions.found(check, now_ms, Clearing.QUIET,
                                              self._policy.xid_warn_quiet_ms)


def _worst_by_key(checks: list[Check]) -> list[Check]:
    """One check per key (the worst when rules overlap), in key order."""
    by_key: dict[Key, Check] = {}
    for check in checks:
        known = by_key.get(check.key)
        if known is None or worse(known.status, check.status) is check.status:
            by_key[check.key] = check
    return [by_key[key] for key in sorted(by_key)]
