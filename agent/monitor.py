"""Watching the GPUs: polled counters and pushed events go into the health tracker, and what
changes goes to the store at once.

Two loops share one tracker (both run in the agent's event loop; only the blocking NVML calls
run in worker threads). The poll loop samples every GPU each `poll_ms`; a GPU that stopped
answering is observed gone, NVML gone for the whole node is observed unavailable and NVML is
started again with back-off. The event loop waits for XID and ECC events `event_wait_ms` at a
time. Changed verdicts are reported as soon as they are seen; the full set is sent again with
every poll while a GPU is not healthy (the store's recovery hysteresis counts passes) and
every `FULL_REPORT_EVERY_POLLS` polls otherwise, so a lost report is repaired, and at every
poll after the store refused one until a full report taken since is accepted. A registration
carries a full reading in place of a full report (`reading`, `after_registering`): the store
applies it before the registration places anything.

The job runner tells the monitor of an ended job whose processes NVML still lists on its GPUs
after the release timeout (`job_lingers`, before the exit is reported): the GPUs fail at once
and are reported; every poll then reads their process lists again (`agent.gpu_leftovers`) until
the incident has closed by its run of clean checks, and the record is forgotten.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

import anyio

from agent import gpu_leftovers
from agent.exporter import AgentView, GpuHealthView
from agent.gpu import (
    EventKind,
    EventWaitFailed,
    GpuBackend,
    GpuEvent,
    GpuGone,
    NvmlUnavailable,
    ReadFailed,
)
from agent.gpu_leftovers import LEFTOVERS, GpuLeftovers
from agent.health import HealthTracker
from agent.health_model import SEVERITY, Check, Verdict
from agent.store_link import StoreLink
from statemachine.commands import HealthReport, HealthStatus
from statemachine.errors import Rejection

logger = logging.getLogger("cellar.agent.monitor")
FULL_REPORT_EVERY_POLLS = 12


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Monitor:
    def __init__(self, backend: GpuBackend, tracker: HealthTracker, link: StoreLink,
                 view: AgentView, *, poll_ms: int, event_wait_ms: int, retry_ms_max: int,
                 clock_ms: Callable[[], int] = monotonic_ms,
                 leftovers: GpuLeftovers | None = None) -> None:
        self.backend = backend
        self.tracker = tracker
        self.leftovers = GpuLeftovers() if leftovers is None else leftovers
        self.link = link
        self.view = view
        self.poll_ms = poll_ms
        self.event_wait_ms = event_wait_ms
        self.retry_ms_max = retry_ms_max
        self.clock_ms = clock_ms
        self.polls = 0
        self._restart_delay_ms = poll_ms
        self._refusals = 0  # health reports the store refused: the changes they took are lost
        self._refusals_repaired = 0  # of those, the ones a full report accepted since covers
        self._unheard = 0  # reports whose changes no store took (refused, or nothing registered)
        self._at_reading = (0, 0)  # (_refusals, _unheard) when the last `reading` was taken

    # --- polling ------------------------------------------------------------------------------

    async def poll_forever(self) -> None:
        while True:
            await self.poll_once()
            await anyio.sleep(self.poll_ms / 1000)

    async def poll_once(self) -> None:
        self.polls += 1
        try:
            await self.sample_all()
            await self._refresh_mig_modes()
            self.view.nvml_up, self.view.last_collect_s = True, time.time()
        except NvmlUnavailable as error:
            self._count("nvml_unavailable")
            self.view.nvml_up = False
            self.view.samples.clear()  # the page shows no reading NVML no longer gives
            self.tracker.observe_unavailable(error.message, self.clock_ms())
            await self._restart_backend()
        await self.report(full=self._full_report_due())

    async def sample_all(self) -> None:
        """Read every GPU once into the tracker (raises NvmlUnavailable for the node)."""
        for device in self.view.devices:
            try:
                sample = await anyio.to_thread.run_sync(self.backend.sample, device.uuid)
            except GpuGone as error:
                self._count("gpus_gone")
                self.view.samples.pop(device.uuid, None)  # not its last readings, frozen
                self.tracker.observe_gone(device.uuid, error.code, error.message,
                                          self.clock_ms())
                continue
            self.view.samples[device.uuid] = sample
            leftovers = await self._judge_leftovers(device.uuid)
            self.tracker.observe_sample(sample, self.clock_ms(), leftovers)
            self._forget_if_closed(device.uuid, leftovers)

    async def _refresh_mig_modes(self) -> None:
        """MIG mode (current and pending) is a property of the device list, which is read again
        only at registration: read it each poll, so a mode change made on a running node
        (pending != current: FAIL until the reset) is seen, and the MIG rules (NVLinks read
        down) follow the mode in force. Only known GPUs are updated; the device list itself
        changes at registration."""
        listed = {device.uuid: device
                  for device in await anyio.to_thread.run_sync(self.backend.devices)}
        devices = tuple(known if (now := listed.get(known.uuid)) is None else replace(
                            known, mig_enabled=now.mig_enabled, mig_pending=now.mig_pending)
                        for known in self.view.devices)
        if devices != self.view.devices:
            self.view.devices = devices
            self.tracker.observe_properties(self.view.devices)

    async def _judge_leftovers(self, uuid: str) -> tuple[Check, ...]:
        """The check of an ended job's processes left on the GPU, if it has a record; none
        when its process list cannot be read now, or a note came in while it was read (the
        incident stays as it is)."""
        if uuid not in self.leftovers:
            return ()
        pids = self.leftovers.pids(uuid)
        try:
            look = await anyio.to_thread.run_sync(gpu_leftovers.look, self.backend, uuid, pids)
        except (ReadFailed, GpuGone) as error:
            logger.warning("cannot read the processes on %s: %s", uuid, error)
            return ()
        if self.leftovers.pids(uuid) != pids:
            return ()
        check = self.leftovers.judge(uuid, look)
        return () if check is None else (check,)

    def _forget_if_closed(self, uuid: str, checks: tuple[Check, ...]) -> None:
        """A clean check that closed the leftovers incident (or found none open: an
        operator cleared it) ends the record."""
        if checks and not checks[0].found and not self.tracker.is_open(uuid, LEFTOVERS):
            self.leftovers.forget(uuid)
            logger.info("GPU %s no longer lists processes of ended jobs", uuid)

    async def job_lingers(self, pod_uid: str, pids_by_gpu: Mapping[str, Mapping[int, int]],
                          timeout_s: float) -> None:
        """An ended job's processes (pid: start ticks, per GPU) still listed after the release
        timeout `timeout_s`: the GPUs fail now, and the store hears it before the exit."""
        for uuid in sorted(pids_by_gpu):
            finding = self.leftovers.note(uuid, pod_uid, pids_by_gpu[uuid], timeout_s)
            if finding is None:
                self._count("leftover_notes_dropped")
                logger.error("too many GPUs with leftovers: %s on %s not recorded", pod_uid,
                             uuid)
                continue
            self._count("gpus_with_job_leftovers")
            logger.error("GPU %s: %s", uuid, finding.message)
            self.tracker.observe_finding(uuid, finding, self.clock_ms())
        await self.report()

    async def _restart_backend(self) -> None:
        """NVML went away: start it again, waiting longer each time it still fails."""
        await anyio.sleep(self._restart_delay_ms / 1000)
        try:
            await anyio.to_thread.run_sync(self.backend.stop)
            await anyio.to_thread.run_sync(self.backend.start)
            devices = await anyio.to_thread.run_sync(self.backend.devices)
        except NvmlUnavailable as error:
            self._restart_delay_ms = min(self._restart_delay_ms * 2, self.retry_ms_max)
            logger.warning("NVML still unavailable (%s); next try in %d ms", error,
                           self._restart_delay_ms)
            return
        logger.info("NVML is back with %d GPUs", len(devices))
        self._restart_delay_ms = self.poll_ms
        self.tracker.observe_devices(devices, self.clock_ms())

    def _full_report_due(self) -> bool:
        unhealthy = any(verdict.status is not HealthStatus.PASS
                        for verdict in self.tracker.verdicts())
        refused = self._refusals > self._refusals_repaired
        return unhealthy or refused or self.polls % FULL_REPORT_EVERY_POLLS == 1

    # --- events -------------------------------------------------------------------------------

    async def events_forever(self) -> None:
        while True:
            try:
                event = await anyio.to_thread.run_sync(self.backend.wait_event,
                                                       self.event_wait_ms,
                                                       abandon_on_cancel=True)
            except EventWaitFailed as error:
                self._count("event_wait_failures")
                self.tracker.observe_event_wait_failed(error.message, self.clock_ms())
                await self.report()
                await anyio.sleep(self.event_wait_ms / 1000)
                continue
            except NvmlUnavailable:
                await anyio.sleep(self.poll_ms / 1000)  # the poll loop brings NVML back
                continue
            self.tracker.observe_event_wait_ok(self.clock_ms())
            if event is not None:
                self._event(event)
            await self.report()

    def _event(self, event: GpuEvent) -> None:
        self._count("events")
        if event.kind is EventKind.XID and event.xid is not None:
            key = (event.uuid, event.xid)
            count, _ = self.view.xid_counts.get(key, (0, 0.0))
            self.view.xid_counts[key] = (count + 1, time.time())
            self.view.last_xid[event.uuid] = event.xid
        self.tracker.observe_event(event, self.clock_ms())

    # --- reporting ----------------------------------------------------------------------------

    async def report(self, *, full: bool = False) -> None:
        """Send the changed verdicts (or all of them) to the store; note job faults."""
        refusals_before = self._refusals
        verdicts = self._take(full=full)
        if verdicts:
            self._count("health_reports")
            answer = await self.link.report_health([verdict.report() for verdict in verdicts])
            # Refused (stale while the node registers again): the changes it carried were
            # taken from the tracker, so each poll sends every verdict again until a full
            # report taken after that refusal is accepted. The event and poll loops report
            # concurrently: a report of changes only, or one the store was not asked (no GPU
            # of it registered), repairs nothing.
            if isinstance(answer, Rejection):
                self._refusals += 1
            elif full and answer is not None:
                self._refusals_repaired = max(self._refusals_repaired, refusals_before)
            if isinstance(answer, Rejection) or answer is None:
                self._unheard += 1

    def reading(self) -> list[HealthReport]:
        """Every GPU's verdict now, for a registration to carry in place of a full report
        (the store applies it before the registration's scheduling pass, so a GPU lost while
        the agent was away is never placed); `after_registering` once the store took it."""
        self._at_reading = (self._refusals, self._unheard)
        return [verdict.report() for verdict in self._take(full=True)]

    async def after_registering(self) -> None:
        """The store took a registration carrying the last `reading`: a full report
        accepted. What changed since goes now, every verdict if a report taken since went
        unheard (refused, or left out as the node was not registered yet)."""
        refusals, unheard = self._at_reading
        self._count("health_reports")
        self._refusals_repaired = max(self._refusals_repaired, refusals)
        await self.report(full=self._unheard > unheard)

    def _take(self, *, full: bool) -> tuple[Verdict, ...]:
        """The verdicts to send, the changed ones (taken) or all; the view and the log follow
        them, and job faults are noted."""
        changed = self.tracker.take_changes()
        self.view.health = {verdict.uuid: health_view(verdict)
                            for verdict in self.tracker.verdicts()}
        for fault in self.tracker.take_job_faults():
            self._count("job_faults")
            logger.warning("job fault on %s: %s", fault.uuid, fault.label)
        for verdict in changed:
            logger.info("GPU %s is %s%s", verdict.uuid, verdict.status.value,
                        f": {verdict.reason}" if verdict.reason else "")
        return self.tracker.verdicts() if full else changed

    def _count(self, name: str) -> None:
        self.view.counters[name] = self.view.counters.get(name, 0) + 1


def health_view(verdict: Verdict) -> GpuHealthView:
    """The overall status and, per watch with an incident, the worst status on it."""
    worst: dict[str, HealthStatus] = {}
    for incident in verdict.incidents:
        current = worst.get(incident.watch.value)
        if current is None or SEVERITY[incident.status] > SEVERITY[current]:
            worst[incident.watch.value] = incident.status
    return GpuHealthView(uuid=verdict.uuid, status=verdict.status,
                         watches=tuple(sorted(worst.items())))
