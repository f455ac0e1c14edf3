"""The node agent: one process per GPU node, acting for that node only.

It starts NVML (retrying with back-off while the driver is away: the GPU count is then unknown,
and nothing is registered rather than zero GPUs), registers the node's GPUs with a fresh
incarnation (with those registered before and lost since, as `agent.registered_gpus` keeps them
across restarts, or as the store has them if that record is lost) and with their health as read
then (a GPU lost while the agent was away is failed before the registration places anything on
it), reports what changed since at once, heartbeats from then on (stopping jobs may take longer
than a lease), reconciles the jobs the store expects with the ones running (which covers every
effect before the registration: the effects cursor first skips those the store no longer
keeps), and then runs until stopped: the health monitor (`agent.monitor`), the pods loop
(`agent.pods`: effects in, starts, stops and exits out) and the metrics page. The store client
follows failovers by itself; if the store says this incarnation is over (the node was
registered again elsewhere or deregistered), the agent registers again and reconciles.
Under TLS a `CertWatch` (`consensus.runtime.cert_watch`) takes a renewed certificate and key
into `tls_contexts`, which the store client dials with (`cellar agent` passes the same to its
connector), for every new connection, without a restart; it says ahead, in the log and on the
metrics page (gpu_agent_tls_cert_seconds_left, of the certificate presented now), that the
node's certificate is ending.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from anyio.abc import TaskStatus

from agent.config import AgentConfig
from agent.exporter import AgentView, render
from agent.gpu import DeviceInfo, GpuBackend, NvmlUnavailable
from agent.health import HealthTracker
from agent.inventory import fresh_boot_id, gpu_inventory, gpu_links, registered_devices
from agent.jobs import JobRunner
from agent.monitor import Monitor, monotonic_ms
from agent.pods import Pods
from agent.registered_gpus import RegisteredGpus
from agent.store_link import NodeGpus, StoreLink, is_stale
from consensus.runtime.cert_watch import CertWatch
from consensus.runtime.metrics_http import serve_metrics
from consensus.runtime.storage_lock import DirectoryLock
from consensus.runtime.tls import TlsConfig, TlsContexts
from statemachine.commands import GpuLink
from statemachine.store import EffectsTrimmed, GpuStore

logger = logging.getLogger("cellar.agent")
START_RETRY_MS_MIN = 500


class IncarnationOver(Exception):
    """The store registered this node again since: register anew."""


@dataclass
class Agent:
    config: AgentConfig
    backend: GpuBackend
    store: GpuStore
    # The contexts the store client dials with, renewed by the watch; by default built from
    # the configuration's files (then only the watch's gauge and lines follow a renewal).
    tls_contexts: TlsContexts | None = None

    def __post_init__(self) -> None:
        self.view = AgentView(node=self.config.node)
        self.link = StoreLink(self.store, self.config.node,
                              retry_ms_max=self.config.intervals.retry_ms_max)
        self.registrations = 0
        self.metrics_port = 0
        self._registered_gpus = RegisteredGpus(self.config.state_dir)
        self._offered: tuple[DeviceInfo, ...] = ()  # the GPUs of the last registration tried
        files = self.config.tls
        if self.tls_contexts is None and files is not None:
            self.tls_contexts = TlsContexts(
                TlsConfig(ca_file=files.ca, cert_file=files.cert, key_file=files.key))
        # replaced by a test that wants its own clock and period
        self.cert_watch: CertWatch | None = None if self.tls_contexts is None else CertWatch(
            self.tls_contexts, f"node agent {self.config.node}")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; raises DataDirectoryLocked when another agent runs on the
        state directory (both would start the same pods and drop each other's job records)."""
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        lock = DirectoryLock.acquire(self.config.state_dir)
        try:
            await self._run(task_status)
        finally:
            lock.release()

    async def _run(self, task_status: TaskStatus[None]) -> None:
        devices = await self._start_backend()
        self.view.devices = devices
        tracker = self._tracker(devices)
        intervals = self.config.intervals
        # The monitor keeps the registry of ended jobs' processes left on GPUs: the runner's
        # release checks fill it (`leftovers=monitor` below), the monitor's polls clear it.
        monitor = Monitor(self.backend, tracker, self.link, self.view,
                          poll_ms=intervals.poll_ms, event_wait_ms=intervals.event_wait_ms,
                          retry_ms_max=intervals.retry_ms_max)
        await self._first_look(monitor)
        async with JobRunner(self.config.state_dir, local_gpu_uuids=[d.uuid for d in devices],
                             gpus=self.backend, limits=self.config.jobs,
                             leftovers=monitor) as runner:
            pods = Pods(self.link, runner, self.config.state_dir)
            read_gpus = functools.partial(self._read_gpus, tracker, runner)
            amend_gpus = functools.partial(self._take_stores_gpus, tracker)
            async with anyio.create_task_group() as tasks:
                if self.config.metrics is not None:
                    self.metrics_port = await tasks.start(self._serve_metrics, pods, runner)
                tasks.start_soon(monitor.poll_forever)
                tasks.start_soon(monitor.events_forever)
                tasks.start_soon(pods.report_exits)
                if self.cert_watch is not None:
                    tasks.start_soon(self.cert_watch.run)
                await self._serve_incarnations(pods, monitor, read_gpus, amend_gpus,
                                               task_status)

    async def _serve_incarnations(self, pods: Pods, monitor: Monitor,
                                  read_gpus: Callable[[], Awaitable[NodeGpus]],
                                  amend_gpus: Callable[[], Awaitable[bool]],
                                  task_status: TaskStatus[None]) -> None:
        """Register with every GPU's health, report what changed since, reconcile and serve;
        again whenever the store ends the incarnation. The health goes with the registration:
        the store keeps a GPU's last health across registrations, and one lost while the agent
        was away would stay placeable until the next poll, and could be placed by the
        registration's own scheduling pass."""
        reconciled = False
        while True:
            await pods.skip_covered_effects()
            registered = await self.link.register(fresh_boot_id(), read_gpus, amend_gpus,
                                                  monitor.reading)
            self._registered_gpus.remember(self._offered)
            self.registrations += 1
            logger.info("registered %s: incarnation %d, %d pods expected", self.config.node,
                        registered.incarnation, len(registered.pods))
            try:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._heartbeats)  # the lease is renewed while reconciling
                    await monitor.after_registering()
                    await pods.reconcile(registered, tasks)
                    if not reconciled:
                        reconciled = True
                        task_status.started()
                    tasks.start_soon(pods.follow_effects)
            except* IncarnationOver:
                logger.warning("the store ended incarnation %d: registering again",
                               registered.incarnation)
            except* EffectsTrimmed:
                logger.warning("effects missed while away: registering again to reconcile")

    async def _read_gpus(self, tracker: HealthTracker, runner: JobRunner) -> NodeGpus:
        """The GPUs to register, listed by NVML again each time: one that did not answer at
        first (NotReady, a reset under way) counts once it does. The health tracker, the job
        runner and the metrics page follow the list. A GPU registered before and missing now
        (off the bus), even by an earlier run of the agent, is registered still, as last seen,
        and each GPU at the index it was registered at (`agent.registered_gpus`): the tracker
        reports it failed, and the store, which wants every index of the node, keeps taking
        the node and its other GPUs."""
        try:
            devices = await anyio.to_thread.run_sync(self.backend.devices)
        except NvmlUnavailable as error:
            logger.warning("cannot list the GPUs again (%s): registering those listed before",
                           error)
            devices = self.view.devices
        if devices != self.view.devices:
            logger.info("NVML lists %d GPUs now, %d before", len(devices),
                        len(self.view.devices))
            self.view.devices = devices
            tracker.observe_devices(devices, monotonic_ms())
            runner.observe_gpus([device.uuid for device in devices])
        self._offered = self._registered_gpus.to_register(devices)
        return (gpu_inventory(self._offered, self.config.models),
                await self._links(self._offered))

    async def _take_stores_gpus(self, tracker: HealthTracker) -> bool:
        """The store refused the GPUs as not matching the node: when this agent's record of
        those it registered before is lost (a wiped state directory, a corrupt file) and one
        is off the bus, NVML lists too few. Take the store's record of the node's GPUs for
        ours; each one NVML does not list is registered still, failed (`_read_gpus`). True if
        that changed the record."""
        stored = await self.link.registered_inventory()
        listed = self.view.devices
        if not self._registered_gpus.adopt(registered_devices(stored, listed,
                                                              self.config.models)):
            return False
        missing = self._registered_gpus.lost(listed)
        logger.warning("the GPUs registered before are missing from %s or out of date: "
                       "registering those NVML lists with the %d the store has of %s, those "
                       "NVML does not list held failed: %s", self._registered_gpus.path,
                       len(stored), self.config.node,
                       ", ".join(f"GPU {device.index} ({device.uuid})" for device in missing)
                       or "none")
        tracker.observe_missing(missing, monotonic_ms())
        return True

    def _tracker(self, devices: tuple[DeviceInfo, ...]) -> HealthTracker:
        """A tracker of the GPUs NVML lists and of those registered before but not listed
        now, which it holds failed (missing from NVML's list)."""
        now_ms = monotonic_ms()
        tracker = HealthTracker(self.config.health,
                                devices + self._registered_gpus.lost(devices), now_ms=now_ms)
        tracker.observe_devices(devices, now_ms)
        return tracker

    async def _links(self, devices: tuple[DeviceInfo, ...]) -> tuple[GpuLink, ...]:
        try:
            topology = await anyio.to_thread.run_sync(self.backend.topology)
        except NvmlUnavailable as error:
            logger.warning("cannot read the GPU topology: %s", error)
            return ()
        return gpu_links(devices, topology)

    async def _first_look(self, monitor: Monitor) -> None:
        """Sample every GPU before registering, so the first report says what is known."""
        try:
            await monitor.sample_all()
        except NvmlUnavailable as error:
            logger.warning("NVML failed right after it started: %s", error)

    async def _start_backend(self) -> tuple[DeviceInfo, ...]:
        delay_ms = START_RETRY_MS_MIN
        while True:
            try:
                await anyio.to_thread.run_sync(self.backend.start)
                devices = await anyio.to_thread.run_sync(self.backend.devices)
            except NvmlUnavailable as error:
                self.view.nvml_up = False
                logger.error("NVML unavailable, GPU count unknown: %s (again in %d ms)", error,
                             delay_ms)
                await anyio.sleep(delay_ms / 1000)
                delay_ms = min(delay_ms * 2, self.config.intervals.retry_ms_max)
                continue
            self.view.nvml_up = True
            logger.info("NVML started: %d GPUs", len(devices))
            return devices

    async def _heartbeats(self) -> None:
        while True:
            result = await self.link.heartbeat()
            if is_stale(result):
                raise IncarnationOver(str(result))
            self.view.counters["heartbeats"] = self.view.counters.get("heartbeats", 0) + 1
            self._registered_gpus.save()  # a write that failed at the registration
            await anyio.sleep(self.config.intervals.heartbeat_ms / 1000)

    async def _serve_metrics(self, pods: Pods, runner: JobRunner, *,
                             task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED
                             ) -> None:
        """Serve /metrics; reports the bound port (metrics = "HOST:0" picks a free one)."""
        address = self.config.metrics
        assert address is not None

        def page() -> str:
            self.view.allocated = {uuid for record in runner.running()
                                   for uuid in record.binding.gpu_uuids}
            self.view.counters.update({name: float(count)
                                       for name, count in pods.counts.items()})
            self.view.counters["store_calls_retried"] = float(self.link.calls_retried)
            self.view.counters["store_effects_refused"] = float(self.link.effects_refused)
            self.view.counters["store_answers_refused"] = float(self.link.answers_refused)
            if self.cert_watch is not None:
                self.view.cert_seconds_left = float(int(self.cert_watch.seconds_left()))
            return render(self.view)

        await serve_metrics(address.host, address.port, page, task_status=task_status)
