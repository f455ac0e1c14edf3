"""The job runner: starts the commands the store binds to this node's GPUs, watches them end,
stops them, and finds them again after an agent restart (reference/nvml.md section 3.2).

Use it as an async context manager; it holds one watcher task per job, and `exits` delivers an
`Exited` for each job that ends, whoever ended it, exactly once per runner:

    async with JobRunner(state_dir, local_gpu_uuids=uuids, gpus=backend) as runner:
        report = await runner.reconcile(bindings_from_the_store)
        ...  # report lost ones, start `to_start`, stop `to_stop`
        outcome = await runner.start(binding)
        async for exited in runner.exits: ...

A job lives as long as its first process (the session leader the runner launched); when it
ends, whatever it left running is stopped too (SIGTERM, grace, SIGKILL), as a container's
processes end with its init, so that none of them runs once the exit is reported, even when a
stop that had begun is cancelled (NVML's process lists are checked by `stop` only; the
agent's monitor cross-checks them otherwise).

A job whose processes NVML still lists on its GPUs after `gpu_release_timeout_s` is handed to
the `leftovers` sink (the agent's monitor, which fails those GPUs until NVML lets go) before its
exit goes out.

Leaving the context stops the watchers, not the jobs: jobs outlive the agent, and the next
runner on the same state directory adopts them. A pod uid is started at most once, ever: the
ledger (`agent.started_ledger`) remembers it before the launch. A job's record
(`agent.job_state`) is on disk before `start` returns and until its exit has been seen.

Failures that concern one job are outcome values (`StartRefused`, `StartFailed`, a
`StopOutcome` that needs attention); only a damaged state directory raises (`JobStateCorrupt`,
from the constructor). Disk writes run in worker threads, under one lock, and so does the
check of the running jobs' logs every `log_poll_s`: one past `log_bytes_max` is cut, keeping
its tail (`agent.job_logs`). A stop's /proc scans run in worker threads too: on a node with
thousands of processes one takes tens of milliseconds, which the event loop (the agent's
heartbeats) must not wait for.
"""

from __future__ import annotations

import functools
import logging
import os
import pathlib
import signal
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol

import anyio
from anyio.abc import TaskGroup

from agent import job_group, procfs
from agent.binding import POD_UID_MARK, Binding, job_environment, refusal
from agent.gpu_release import GpuProcesses, ReleaseCheck, wait_released
from agent.job_limits import JobLimits
from agent.job_logs import LOGS_NAME, cap_log, log_path, open_log, prune_logs
from agent.job_outcomes import (
    EXIT_CODE_UNKNOWN,
    REASON_ADOPTED_EXIT,
    REASON_LOST,
    Exited,
    GpuRelease,
    ReconcileReport,
    Started,
    StartFailed,
    StartOutcome,
    StartRefused,
    StopOutcome,
    Termination,
    exit_of_wait_status,
)
from agent.job_state import JobRecord, JobRecords
from agent.process_watch import wait_adopted, wait_child
from agent.spawn import spawn
from agent.started_ledger import StartedLedger

logger = logging.getLogger("cellar.agent.jobs")
REASON_REAPED_ELSEWHERE = "exit status unknown: the process was reaped by someone else"


class LeftoverSink(Protocol):
    """Who hears of an ended job whose processes NVML still lists after the release timeout
    (the agent's monitor, which fails those GPUs): awaited before the exit is handed out."""

    async def job_lingers(self, pod_uid: str, pids_by_gpu: Mapping[str, Mapping[int, int]],
                          timeout_s: float) -> None: ...


@dataclass(eq=False)
class _Job:
    record: JobRecord
    child: bool  # launched by this runner (its status can be read) or adopted
    exited: anyio.Event = field(default_factory=anyio.Event)
    stopping: bool = False  # a stop was asked: the exit says so
    ending: anyio.Lock = field(default_factory=anyio.Lock)  # held by a stop ending the group


class JobRunner:
    def __init__(self, state_dir: pathlib.Path, *, local_gpu_uuids: Collection[str],
                 gpus: GpuProcesses, limits: JobLimits | None = None,
                 inherited_env: Mapping[str, str] | None = None,
                 leftovers: LeftoverSink | None = None) -> None:
        """`local_gpu_uuids`: this node's inventory; `gpus`: NVML's process lists (the
        node's `GpuBackend`); `inherited_env`: the environment jobs start from (the agent's
        own by default); `leftovers`: told of every ended job still on its GPUs after the
        release timeout, before its exit goes out (nobody by default: only logged)."""
        self.limits = (limits or JobLimits()).validate()
        self._local = frozenset(local_gpu_uuids)
        self._gpus = gpus
        self._leftovers = leftovers
        self._env = dict(os.environ if inherited_env is None else inherited_env)
        self._logs = state_dir / LOGS_NAME
        self._logs.mkdir(parents=True, exist_ok=True)
        self._ledger = StartedLedger(state_dir, self.limits.started_remembered_max)
        self._records = JobRecords(state_dir)
        self._boot_id = procfs.boot_id()
        # The last uid launched, when no record names it: an agent killed between a launch and
        # its record left that job running; the first reconcile finds it by its mark.
        newest = self._ledger.newest()
        recorded = {record.binding.pod_uid for record in self._records.all()}
        self._unrecorded = newest if newest not in recorded else None
        self._jobs: dict[str, _Job] = {}
        # Jobs that ended, whose exit is on its way to the store: neither running nor lost,
        # and never to start again (the store still has them bound until it hears).
        self._unreported: set[str] = set()
        # Killed before their start: never to start (as many as the ledger keeps, the
        # oldest forgotten first; dict order is insertion order).
        self._forbidden: dict[str, None] = {}
        self._exits_in, self.exits = anyio.create_memory_object_stream[Exited](
            self.limits.jobs_max)
        self._tasks: TaskGroup | None = None
        self._lock: anyio.Lock | None = None

    async def __aenter__(self) -> JobRunner:
        assert self._tasks is None, "a runner is entered once"
        self._lock = anyio.Lock()
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        self._tasks.start_soon(self._cap_logs_forever)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> bool | None:
        assert self._tasks is not None
        self._tasks.cancel_scope.cancel()  # the watchers; the jobs keep running
        try:
            # The body's own exception is the caller's: it propagates as it is, not wrapped in
            # the task group's exception group. A watcher's failure would come out here.
            await self._tasks.__aexit__(None, None, None)
        finally:
            self._exits_in.close()
            self.exits.close()  # read exits inside: an unread one is "lost" to the next runner
        return None

    def observe_gpus(self, local_gpu_uuids: Collection[str]) -> None:
        """The node's inventory as NVML lists it now (a GPU that did not answer at first may
        be registered later): bindings are checked against it from now on."""
        self._local = frozenset(local_gpu_uuids)

    def runs(self, pod_uid: str) -> bool:
        """Whether this runner watches a job of this pod uid now."""
        return pod_uid in self._jobs

    def group_of(self, pod_uid: str) -> str | None:
        """The gang of the job this runner watches under this pod uid now, or None."""
        job = self._jobs.get(pod_uid)
        return None if job is None else job.record.binding.group

    def exit_pending(self, pod_uid: str) -> bool:
        """Whether this pod's job ended here and its exit is not reported yet."""
        return pod_uid in self._unreported

    def exit_reported(self, pod_uid: str) -> None:
        """The store had an answer for this pod's exit (`exits` handed it out)."""
        self._unreported.discard(pod_uid)

    def holders(self, gpu_uuids: Collection[str]) -> tuple[str, ...]:
        """The pod uids of the jobs that run (or still end) on any of `gpu_uuids`."""
        wanted = set(gpu_uuids)
        return tuple(uid for uid in sorted(self._jobs)
                     if wanted.intersection(self._jobs[uid].record.binding.gpu_uuids))

    def started_before(self, pod_uid: str) -> bool:
        """Whether this pod uid was ever started here (by this runner or an earlier one)."""
        return pod_uid in self._jobs or pod_uid in self._ledger

    def running(self) -> tuple[JobRecord, ...]:
        """The jobs this runner watches now, by pod uid."""
        return tuple(self._jobs[uid].record for uid in sorted(self._jobs))

    async def start(self, binding: Binding) -> StartOutcome:
        """Validate and launch the binding's command; see the module docstring."""
        async with self._locked():
            reason = self._refusal(binding)
            if reason is not None:
                return StartRefused(pod_uid=binding.pod_uid, reason=reason)
            try:
                await anyio.to_thread.run_sync(self._remember, binding.pod_uid)
            except OSError as error:
                return StartFailed(pod_uid=binding.pod_uid,
                                   reason=f"cannot record the start in {self._ledger.path}: "
                                          f"{error}")
            return await self._launch(binding)

    async def forbid_start(self, pod_uid: str) -> bool:
        """Make sure this pod uid never starts under this runner: True when it had not
        started (nor will now: a start waiting for the lock is refused), False when it had.
        A killed pod's deferred start must not launch it after its kill found nothing."""
        async with self._locked():
            if self.started_before(pod_uid):
                return False
            self._forbidden[pod_uid] = None
            if len(self._forbidden) > self.limits.started_remembered_max:
                del self._forbidden[next(iter(self._forbidden))]
            return True

    def start_forbidden(self, pod_uid: str) -> bool:
        """Whether `forbid_start` refused this pod uid's start."""
        return pod_uid in self._forbidden

    def _refusal(self, binding: Binding) -> str | None:
        reason = refusal(binding, self._local, self.limits)
        if reason is not None:
            return reason
        uid = binding.pod_uid
        if uid in self._jobs or uid in self._ledger:
            return "already started on this node: a pod uid is started at most once"
        if uid in self._forbidden:
            return "killed before its start"
        if len(self._jobs) >= self.limits.jobs_max:
            return f"this node already runs {self.limits.jobs_max} jobs (jobs_max)"
        return None

    def _remember(self, pod_uid: str) -> None:
        self._ledger.remember(pod_uid)
        live_logs = {job.record.log_path for job in self._jobs.values()}
        try:
            prune_logs(self._logs, self.limits.logs_kept_max - 1, keep=live_logs)
        except OSError:
            logger.exception("cannot prune old job logs in %s", self._logs)

    async def _launch(self, binding: Binding) -> StartOutcome:
        try:
            record = self._spawn(binding)
        except OSError as error:
            return StartFailed(pod_uid=binding.pod_uid,
                               reason=f"cannot start {binding.command[0]!r}: {error}")
        try:
            await anyio.to_thread.run_sync(self._records.put, record)
        except OSError as error:
            await self._abandon(record)
            return StartFailed(pod_uid=binding.pod_uid,
                               reason=f"cannot record the job in {self._records.path}, so it "
                                      f"was killed: {error}")
        self._track(record, child=True)
        return Started(pod_uid=binding.pod_uid, pid=record.pid, pgid=record.pgid,
                       start_ticks=record.start_ticks, log_path=record.log_path)

    def _spawn(self, binding: Binding) -> JobRecord:
        path = log_path(self._logs, binding.pod_uid)
        self._logs.mkdir(exist_ok=True)  # an operator may have cleared the logs away
        log_fd = open_log(path)
        try:
            pid = spawn(binding.command, job_environment(binding, self._env), log_fd)
        finally:
            os.close(log_fd)
        ticks = procfs.start_ticks(pid)
        assert ticks is not None, "an unreaped child is in /proc"
        return JobRecord(binding=binding, pid=pid, pgid=pid, start_ticks=ticks,
                         started_unix_ns=time.time_ns(), log_path=str(path),
                         boot_id=self._boot_id)

    async def _abandon(self, record: JobRecord) -> None:
        """Kill a job whose record could not be written: no restarted agent could find it."""
        await _signal_job(record, signal.SIGKILL)
        with anyio.move_on_after(self.limits.kill_wait_s):
            await wait_child(record.pid, self.limits.exit_poll_s)

    def _track(self, record: JobRecord, *, child: bool) -> None:
        assert self._tasks is not None, "use the runner inside `async with`"
        job = _Job(record, child)
        self._jobs[record.binding.pod_uid] = job
        self._tasks.start_soon(self._watch, job)

    async def _watch(self, job: _Job) -> None:
        record, binding = job.record, job.record.binding
        code, reason = await self._wait_exit(job)
        if job.stopping:
            reason = f"stopped by the agent; {reason}"
        seen = {record.pid: record.start_ticks}  # every process of the job met
        async with job.ending:  # after a stop under way: what one cancelled left is ended here
            await self._end_leftovers(record, seen)
        job.exited.set()
        # The exit frees the job's GPUs in the store, which may hand them on at once: it
        # waits until NVML shows none of the job's processes on them (a context may take a
        # while to go), as a stop does (reference/nvml.md 3.2).
        check = await wait_released(
            self._gpus, binding.gpu_uuids, seen,
            timeout_s=self.limits.gpu_release_timeout_s, poll_s=self.limits.gpu_poll_s)
        if check.release not in (GpuRelease.RELEASED, GpuRelease.NO_GPUS):
            logger.warning("%s ended, and its GPUs %s: %s %s", binding.pod_uid,
                           check.release.value, check.detail, check.lingering_pids)
        await self._tell_leftovers(binding.pod_uid, check, seen)
        async with self._locked():  # no reconcile between the two: it would call the job lost
            await anyio.to_thread.run_sync(self._cap_logs, (record.log_path,))
            try:
                await anyio.to_thread.run_sync(self._records.forget, binding.pod_uid)
            except OSError:
                logger.exception("cannot remove the record of %s (pid %d) from %s",
                                 binding.pod_uid, record.pid, self._records.path)
            del self._jobs[binding.pod_uid]
            self._unreported.add(binding.pod_uid)
        exited = Exited(pod_uid=binding.pod_uid, group=binding.group, exit_code=code,
                        reason=reason)
        try:
            await self._exits_in.send(exited)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            self._unreported.discard(binding.pod_uid)
            logger.warning("nobody reads exits any more: %s", exited)

    async def _cap_logs_forever(self) -> None:
        """Every `log_poll_s`, cut the running jobs' logs that passed `log_bytes_max`."""
        while True:
            await anyio.sleep(self.limits.log_poll_s)
            async with self._locked():
                paths = tuple(job.record.log_path for job in self._jobs.values())
                await anyio.to_thread.run_sync(self._cap_logs, paths)

    def _cap_logs(self, paths: Iterable[str]) -> None:
        for path in paths:
            try:
                cut = cap_log(pathlib.Path(path), self.limits.log_bytes_max,
                              self.limits.log_tail_bytes)
            except OSError:
                logger.exception("cannot cut the job log %s", path)
                continue
            if cut:
                logger.warning("job log %s passed %d bytes: cut, its last %d bytes kept",
                               path, self.limits.log_bytes_max, self.limits.log_tail_bytes)

    async def _tell_leftovers(self, pod_uid: str, check: ReleaseCheck,
                              seen: Mapping[int, int]) -> None:
        """A job's processes still on its GPUs: the sink fails those GPUs before the store
        hears of the exit, which frees them there."""
        if check.release is not GpuRelease.LINGERING or self._leftovers is None:
            return
        pids_by_gpu = {uuid: {pid: seen[pid] for pid in pids}
                       for uuid, pids in check.lingering_by_gpu}
        await self._leftovers.job_lingers(pod_uid, pids_by_gpu,
                                          self.limits.gpu_release_timeout_s)

    async def _wait_exit(self, job: _Job) -> tuple[int, str]:
        record, poll_s = job.record, self.limits.exit_poll_s
        if not job.child:
            await wait_adopted(record.pid, record.start_ticks, poll_s)
            return EXIT_CODE_UNKNOWN, REASON_ADOPTED_EXIT
        status = await wait_child(record.pid, poll_s)
        if status is None:
            return EXIT_CODE_UNKNOWN, REASON_REAPED_ELSEWHERE
        return exit_of_wait_status(status)

    async def stop(self, pod_uid: str, grace_s: float | None = None) -> StopOutcome:
        """SIGTERM the job's group, SIGKILL it after `grace_s` (the limits' by default), wait
        for every process of the job to end, then for NVML to show none of them on the job's
        GPUs. Stopping a pod that does not run is a no-op outcome (`NOT_RUNNING`)."""
        job = self._jobs.get(pod_uid)
        if job is None or job.exited.is_set():
            return StopOutcome(pod_uid=pod_uid, termination=Termination.NOT_RUNNING,
                               gpu_release=GpuRelease.NO_GPUS)
        job.stopping = True
        seen = {job.record.pid: job.record.start_ticks}  # every process of the job met
        async with job.ending:
            termination = await self._end_group(
                job.record, seen, self.limits.grace_s if grace_s is None else grace_s)
        with anyio.move_on_after(self.limits.kill_wait_s):
            await job.exited.wait()  # the watcher reaps at once
        check = await wait_released(
            self._gpus, job.record.binding.gpu_uuids, seen,
            timeout_s=self.limits.gpu_release_timeout_s, poll_s=self.limits.gpu_poll_s)
        if check.release is not GpuRelease.RELEASED and check.release is not GpuRelease.NO_GPUS:
            logger.warning("%s needs attention: %s %s", pod_uid, check.detail,
                           check.lingering_pids)
        return StopOutcome(pod_uid=pod_uid, termination=termination,
                           gpu_release=check.release, lingering_pids=check.lingering_pids,
                           detail=check.detail)

    async def _end_group(self, record: JobRecord, seen: dict[int, int], grace_s: float, *,
                         marked_only: bool = False) -> Termination:
        """SIGTERM (and SIGCONT) every process of the job, SIGKILL those left after
        `grace_s`, and wait until none runs; `seen` collects every process met on the way.
        `marked_only`: see `_end_leftovers`."""
        steps = ((signal.SIGTERM, grace_s, Termination.STOPPED),
                 (signal.SIGKILL, self.limits.kill_wait_s, Termination.KILLED))
        for sig, wait_s, termination in steps:
            seen.update(await _signal_job(record, sig, marked_only=marked_only))
            if sig is signal.SIGTERM:  # a stopped process would hold it pending, not end
                seen.update(await _signal_job(record, signal.SIGCONT, marked_only=marked_only))
            if await self._wait_gone(record, seen, wait_s, marked_only=marked_only):
                return termination
        return Termination.UNKILLABLE

    async def _wait_gone(self, record: JobRecord, seen: dict[int, int], timeout_s: float, *,
                         marked_only: bool = False) -> bool:
        """Wait until no process of the job runs (zombies have ended), up to `timeout_s`."""
        with anyio.move_on_after(timeout_s):
            while members := await _members(record, marked_only=marked_only):
                seen.update(members)
                await anyio.sleep(self.limits.group_poll_s)
            return True
        return False

    async def _end_leftovers(self, record: JobRecord, seen: dict[int, int] | None = None, *,
                             marked_only: bool = False) -> None:
        """A job ends with its first process, as a container does: processes it left running
        are stopped too (with the grace period), so that an exit frees the job's GPUs; `seen`
        collects them. `marked_only` for a job found dead after a restart: its first pid may
        have been reused since by a stranger's group or session, so only processes carrying
        the job's mark are its own."""
        left = await _members(record, marked_only=marked_only)
        if left:
            logger.warning("%s ended, leaving pids %s running: stopping them",
                           record.binding.pod_uid, sorted(left))
            await self._end_group(record, {} if seen is None else seen, self.limits.grace_s,
                                  marked_only=marked_only)

    async def reconcile(self, expected: Sequence[Binding]) -> ReconcileReport:
        """Match the store's bindings for this node against the ledger and the live processes;
        adopt every recorded job still running. See `ReconcileReport` for what the caller
        must do with the answer."""
        # By gang and uid: uids are unique only within a gang, and another gang's job of the
        # same uid is neither this pod (to adopt) nor one the store wants (not to stop).
        wanted: dict[tuple[str, str], Binding] = {}
        for binding in expected:
            wanted.setdefault((binding.group, binding.pod_uid), binding)
        async with self._locked():
            dead = await self._adopt_records()
            dead.update(await self._find_unrecorded({b.pod_uid: b for b in reversed(expected)}))
        async with anyio.create_task_group() as tasks:
            for record in dead.values():
                tasks.start_soon(functools.partial(self._end_leftovers, record,
                                                   marked_only=True))
        running = {(job.record.binding.group, uid): job.record.binding
                   for uid, job in self._jobs.items()}
        gone = {key: binding for key, binding in wanted.items()
                if key not in running and key[1] not in self._unreported}  # exit on its way
        started = {key for key in gone if key[1] in self._ledger or key[1] in dead}
        return ReconcileReport(
            adopted=_by_uid(binding for key, binding in running.items() if key in wanted),
            lost=tuple(Exited(pod_uid=uid, group=group, exit_code=EXIT_CODE_UNKNOWN,
                              reason=REASON_LOST)
                       for group, uid in sorted(started, key=lambda key: (key[1], key[0]))),
            to_start=_by_uid(binding for key, binding in gone.items() if key not in started),
            to_stop=_by_uid(binding for key, binding in running.items() if key not in wanted))

    async def _adopt_records(self) -> dict[str, JobRecord]:
        """Watch every recorded job whose first process still runs; forget the others and
        return those of this boot (a reboot ended every process of an earlier one, and a
        process of this boot may hold a recorded pid and start time: it is no job's)."""
        dead: dict[str, JobRecord] = {}
        earlier_boot: list[str] = []
        for record in self._records.all():
            uid = record.binding.pod_uid
            if uid in self._jobs:
                continue
            if record.boot_id and record.boot_id != self._boot_id:
                earlier_boot.append(uid)
            elif procfs.is_alive(record.pid, record.start_ticks):
                logger.info("adopting %s (pid %d)", uid, record.pid)
                self._track(record, child=False)
            else:
                dead[uid] = record
        if dead or earlier_boot:
            try:
                await anyio.to_thread.run_sync(
                    lambda: self._records.forget(*dead, *earlier_boot))
            except OSError:
                logger.exception("cannot forget ended jobs in %s", self._records.path)
        return dead

    async def _find_unrecorded(self, wanted: Mapping[str, Binding]) -> dict[str, JobRecord]:
        """The job launched last by an earlier runner and never recorded, if it still runs: a
        record to end it by (its processes carry its mark), as a dead job's leftovers are; the
        store hears it lost, or never knew it. Looked for once per runner."""
        uid, self._unrecorded = self._unrecorded, None
        if uid is None or uid in self._jobs:
            return {}
        leaders = await anyio.to_thread.run_sync(procfs.marked_leaders, POD_UID_MARK, uid)
        if not leaders:
            return {}
        pid, ticks = min(leaders.items())
        logger.warning("%s (pid %d) was launched but never recorded: stopping it", uid, pid)
        binding = wanted.get(uid) or Binding(group="", pod_uid=uid, gpu_uuids=(), command=())
        return {uid: JobRecord(binding=binding, pid=pid, pgid=pid, start_ticks=ticks,
                               started_unix_ns=0, log_path="")}

    def _locked(self) -> anyio.Lock:
        assert self._lock is not None, "use the runner inside `async with`"
        return self._lock


async def _members(record: JobRecord, *, marked_only: bool) -> dict[int, int]:
    """`job_group.members`, whose /proc scan runs in a worker thread."""
    return await anyio.to_thread.run_sync(
        functools.partial(job_group.members, record, marked_only=marked_only))


async def _signal_job(record: JobRecord, sig: signal.Signals, *, marked_only: bool = False
                      ) -> dict[int, int]:
    """`job_group.signal_job`, whose /proc scan runs in a worker thread."""
    return await anyio.to_thread.run_sync(
        functools.partial(job_group.signal_job, record, sig, marked_only=marked_only))


def _by_uid(bindings: Iterable[Binding]) -> tuple[Binding, ...]:
    return tuple(sorted(bindings, key=lambda binding: (binding.pod_uid, binding.group)))
