"""The pods the store binds to this node: reconciled at registration, started on START_POD,
stopped on KILL_POD, and their starts and exits reported back.

An effect is a hint: before starting a pod the agent asks the store whether the pod is still
bound here (effects are replayed after a restart, and a gang may have been released since). A
pod whose gang the store is already evicting (preempted or drained while the agent was away or
lagging) is never started: it is reported killed before its start, so the gang can leave;
so is one a KILL_POD names that this node never started while the store still has it here.
The last effect handled is remembered in the state directory, so a restarted agent resumes
where it was; so is the cursor the watch moves past other nodes' effects (at most every
`CURSOR_SAVE_EVERY_S`, or once it moved `CURSOR_SAVE_EVERY_EFFECTS`), so an idle agent
restarted after its last effect was trimmed is not told its effects were. Outcomes the store
must hear are reported until it answers (`agent.store_link`): a job that could not start is
reported exited with 127 and the reason, a job lost while the agent was away with its lost
reason. A job that ended is neither started again nor called lost while its exit is on its
way to the store (a replayed START_POD had reported it "could not start", and a registration
"lost", ahead of its own exit). The store hands a released gang's GPUs on as soon as it asks
for its pods' kill: a pod whose GPUs a job still holds starts only once that job has ended
(and the runner reports an exit only once NVML shows the job's GPUs free).
"""

from __future__ import annotations

import logging
import pathlib
import time
from collections import Counter
from collections.abc import Callable
from contextlib import aclosing

import anyio

from agent.binding import Binding
from agent.job_outcomes import Exited, Started, StopOutcome, Termination
from agent.jobs import JobRunner
from agent.store_link import Standing, StoreLink
from consensus.runtime.durable_file import replace_file
from consensus.validation import INT64_MAX
from statemachine.effects import Effect, EffectKind
from statemachine.errors import Rejection
from statemachine.results import NodeRegistered, PodAssignment
from statemachine.store import EffectsTrimmed

logger = logging.getLogger("cellar.agent.pods")
EXIT_CODE_NOT_STARTED = 127  # as a shell says for a command it could not run
EXIT_CODE_KILLED = 137  # as a shell says for a command ended by SIGKILL
REASON_KILLED_BEFORE_START = "killed before start: its gang is being evicted"
EFFECTS_CURSOR = "effects-after"
WATCH_WAIT_S = 5.0
CURSOR_SAVE_EVERY_S = 10.0  # a cursor moved past others' effects is saved at most this often
CURSOR_SAVE_EVERY_EFFECTS = 1_000  # ... unless it moved this far since the last save
GPU_WAIT_POLL_S = 0.05  # a start deferred for its GPUs looks this often whether they are free


def binding_of(pod: PodAssignment | Effect) -> Binding:
    """A binding from a registration's pod or from a START_POD effect (both decoded and
    checked: `statemachine.result_codec`, `agent.store_link`)."""
    return Binding(group=pod.group, pod_uid=pod.pod_uid, gpu_uuids=pod.gpu_uuids,
                   command=pod.command, env=pod.env)


class Pods:
    def __init__(self, link: StoreLink, runner: JobRunner, state_dir: pathlib.Path, *,
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self.link = link
        self.runner = runner
        self.cursor_path = state_dir / EFFECTS_CURSOR
        self.counts: Counter[str] = Counter()
        self.clock_s = clock_s
        self._saved_index = 0  # the cursor last written to `cursor_path`
        self._saved_at_s = float("-inf")
        # Pods whose start is deferred or under way: a replayed START_POD (the registration's
        # reconcile deferred it, then the effect came again) must not start it a second time,
        # which the runner refuses and `start` would report as "could not start" (exit 127).
        # By gang and uid: another gang's pod of the same uid is no replay of it.
        self._starting: set[tuple[str, str]] = set()

    async def reconcile(self, registered: NodeRegistered, stops: anyio.abc.TaskGroup) -> None:
        """After registering: adopt what runs, report what was lost, start what never ran,
        and begin stopping what the store does not know, in `stops`: a stop can outlast a
        lease (grace, kill wait, GPU release), and nothing here waits for one."""
        report = await self.runner.reconcile([binding_of(pod) for pod in registered.pods])
        evicting = {(pod.group, pod.pod_uid) for pod in registered.pods if pod.evicting}
        for binding in report.adopted:
            await self._acknowledge(binding)
        for exited in report.lost:
            self.counts["jobs_lost"] += 1
            await self._report_exit(exited)
        for binding in report.to_stop:  # first: a pod to start may need their GPUs
            stops.start_soon(self.stop, binding.pod_uid)
        for binding in report.to_start:
            if (binding.group, binding.pod_uid) in evicting:
                await self._killed_before_start(binding.group, binding.pod_uid)
            else:
                await self._start_or_defer(binding, stops)

    async def _start_or_defer(self, binding: Binding, tasks: anyio.abc.TaskGroup) -> None:
        """Start the pod now, or, while jobs still run on its GPUs (the store hands a gang's
        GPUs on as soon as it asks for their pods' kill), once they have ended, in `tasks`:
        nothing here waits for a stop."""
        if (binding.group, binding.pod_uid) in self._starting:
            return  # a replayed START_POD: its start is deferred or under way already
        if self.runner.holders(binding.gpu_uuids):
            self.counts["starts_deferred"] += 1
            self._starting.add((binding.group, binding.pod_uid))
            tasks.start_soon(self._start_when_free, binding)
        else:
            await self.start(binding)

    async def _start_when_free(self, binding: Binding) -> None:
        try:
            while holders := self.runner.holders(binding.gpu_uuids):
                logger.info("pod %s waits for %s to leave its GPUs", binding.pod_uid,
                            ", ".join(holders))
                await anyio.sleep(GPU_WAIT_POLL_S)
            if await self.link.standing(binding.group, binding.pod_uid) is Standing.BOUND:
                await self._start(binding)  # else: released or evicting meanwhile
        finally:
            self._starting.discard((binding.group, binding.pod_uid))

    async def start(self, binding: Binding) -> None:
        key = (binding.group, binding.pod_uid)
        if key in self._starting:
            return  # a replayed START_POD: its start is under way
        self._starting.add(key)
        try:
            await self._start(binding)
        finally:
            self._starting.discard(key)

    async def _start(self, binding: Binding) -> None:
        """Start the pod, held in `_starting` by the caller."""
        if self.runner.group_of(binding.pod_uid) not in (None, binding.group):
            pass  # another gang's job holds this uid: the runner refuses it, reported below
        elif self.runner.runs(binding.pod_uid) or self.runner.exit_pending(binding.pod_uid):
            return  # a replayed START_POD: it runs, or ran and its exit is on its way
        outcome = await self.runner.start(binding)
        if isinstance(outcome, Started):
            self.counts["jobs_started"] += 1
            logger.info("started pod %s of %s: pid %d on %s", binding.pod_uid, binding.group,
                        outcome.pid, ",".join(binding.gpu_uuids) or "no GPU")
            await self._acknowledge(binding)
            return
        if self.runner.start_forbidden(binding.pod_uid):  # its exit is reported killed
            logger.info("pod %s was killed before its start: not started", binding.pod_uid)
            return
        self.counts["jobs_not_started"] += 1
        logger.error("pod %s could not start: %s", binding.pod_uid, outcome.reason)
        await self._report_exit(Exited(pod_uid=binding.pod_uid, group=binding.group,
                                       exit_code=EXIT_CODE_NOT_STARTED,
                                       reason=f"could not start: {outcome.reason}"))

    async def _killed_before_start(self, group: str, pod_uid: str) -> None:
        self.counts["jobs_killed_before_start"] += 1
        logger.info("pod %s of %s is being evicted: not starting it", pod_uid, group)
        await self._report_exit(Exited(pod_uid=pod_uid, group=group,
                                       exit_code=EXIT_CODE_KILLED,
                                       reason=REASON_KILLED_BEFORE_START))

    async def stop(self, pod_uid: str) -> StopOutcome:
        outcome = await self.runner.stop(pod_uid)
        if outcome.needs_attention:
            self.counts["stops_needing_attention"] += 1
            logger.error("pod %s: %s", pod_uid, outcome.detail)
        return outcome

    async def _acknowledge(self, binding: Binding) -> None:
        result = await self.link.ack_started(binding.group, binding.pod_uid, binding.gpu_uuids)
        if isinstance(result, Rejection):
            logger.warning("the store refused the start of %s (%s): stopping it",
                           binding.pod_uid, result)
            await self.stop(binding.pod_uid)

    async def _report_exit(self, exited: Exited) -> None:
        result = await self.link.report_exit(exited.group, exited.pod_uid, exited.exit_code,
                                             exited.reason[:256])
        if isinstance(result, Rejection):
            logger.info("the store no longer knows %s (%s)", exited.pod_uid, result)

    async def report_exits(self) -> None:
        """Forever: tell the store about each job that ended."""
        async for exited in self.runner.exits:
            self.counts["jobs_exited"] += 1
            logger.info("pod %s exited with %d%s", exited.pod_uid, exited.exit_code,
                        f" ({exited.reason})" if exited.reason else "")
            try:
                await self._report_exit(exited)
            finally:
                self.runner.exit_reported(exited.pod_uid)

    async def skip_covered_effects(self) -> None:
        """Before registering: move the cursor past the effects the store no longer keeps
        (or back to its outbox's end, when past it). The registration's reconcile covers
        every effect before it, so the watch that follows must not be told of that gap (a
        new agent, at cursor 0, on a trimmed outbox registered twice at once)."""
        after = self._cursor()
        resume_after = await self.link.effects_resume_after(after)
        if resume_after != after:
            logger.info("effects after %d are not kept: the registration covers them, the "
                        "watch resumes after %d", after, resume_after)
            await self._save(resume_after)

    async def follow_effects(self) -> None:
        """Forever: act on this node's effects, from where the last run stopped. When some
        were trimmed before this agent saw them (it was cut off for long), or its cursor is
        past the store's outbox (the store was rebuilt or restored from an older backup), it
        raises EffectsTrimmed (CursorAhead), having moved its cursor to where the store's
        effects resume: the registration that must follow reconciles with the store's
        bindings, which covers what was missed."""
        after = self._cursor()
        async with anyio.create_task_group() as stops, aclosing(self.link.effects(
                after, wait_s=WATCH_WAIT_S, on_cursor=self._cursor_moved)) as effects:
            try:
                async for effect in effects:
                    await self._effect(effect, stops)
                    await self._save(effect.index)
            except EffectsTrimmed as gap:
                logger.warning("%s: reconciling", gap)
                await self._save(gap.resume_after)
                raise

    async def _effect(self, effect: Effect, stops: anyio.abc.TaskGroup) -> None:
        kind = effect.kind
        if kind is EffectKind.START_POD:
            binding = binding_of(effect)
            standing = await self.link.standing(binding.group, binding.pod_uid)
            if standing is Standing.BOUND:
                await self._start_or_defer(binding, stops)
            elif standing is Standing.EVICTING and not self.runner.started_before(
                    binding.pod_uid):
                await self._killed_before_start(binding.group, binding.pod_uid)
        elif kind is EffectKind.KILL_POD:
            self.counts["kills"] += 1
            stops.start_soon(self._kill, effect.group, effect.pod_uid)

    async def _kill(self, group: str, pod_uid: str) -> None:
        """Stop the pod; one never started here, that the store still has here, is reported
        killed before its start (its gang may be waiting for that exit to leave)."""
        if self.runner.group_of(pod_uid) not in (None, group):
            # Another gang's job holds this uid here (uids are unique only within a gang):
            # this gang's pod never ran here, and that job is not this kill's to stop.
            if await self.link.standing(group, pod_uid) is not Standing.GONE:
                await self._killed_before_start(group, pod_uid)
            return
        outcome = await self.stop(pod_uid)
        if outcome.termination is not Termination.NOT_RUNNING:
            return  # its exit is reported by whoever saw it end
        if not await self.runner.forbid_start(pod_uid):  # a deferred start's too
            # It started: before the stop looked (its exit is, or was, reported by whoever
            # saw it end), or while the stop looked, a deferred start holding the runner's
            # lock. That job runs now, and this kill is the only one it gets (the store
            # resends kills to a preemption's victims only, and takes its ack): stop it.
            if self.runner.group_of(pod_uid) == group:
                await self.stop(pod_uid)
            return
        if await self.link.standing(group, pod_uid) is not Standing.GONE:
            await self._killed_before_start(group, pod_uid)

    def _cursor(self) -> int:
        """The cursor saved last; 0 (replay every effect) when there is none, or none the
        store could take as an index (the effects query refuses one out of range as malformed,
        which no retry mends)."""
        try:
            index = int(self.cursor_path.read_text(encoding="ascii").strip() or 0)
            if not 0 <= index <= INT64_MAX:
                raise ValueError(f"{index} is not an effect index")
            return index
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as error:
            logger.warning("cannot read %s (%s): replaying every effect", self.cursor_path,
                           error)
            return 0

    def _cursor_moved(self, index: int) -> None:
        """The watch moved the cursor past others' effects (every effect of this node up to
        `index` was handled): saved now and then, not at every idle page (on the event loop,
        as the watch calls this: at most once every `CURSOR_SAVE_EVERY_S` while idle)."""
        if (index - self._saved_index >= CURSOR_SAVE_EVERY_EFFECTS
                or self.clock_s() - self._saved_at_s >= CURSOR_SAVE_EVERY_S):
            self._remember(index)

    async def _save(self, index: int) -> None:
        """`_remember` in a worker thread: its two fsyncs follow every effect, and a page of
        effects handled with no checkpoint between them (kills) would hold the heartbeats for
        all of them in a row on a busy disk."""
        await anyio.to_thread.run_sync(self._remember, index)

    def _remember(self, index: int) -> None:
        try:
            replace_file(self.cursor_path, f"{index}\n".encode("ascii"))
        except OSError as error:
            logger.warning("cannot write %s: %s", self.cursor_path, error)
            return
        self._saved_index, self._saved_at_s = index, self.clock_s()
