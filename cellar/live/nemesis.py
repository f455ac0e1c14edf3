"""The live nemesis: the simulator's faults, done to real replica processes and their links.

The schedule is the simulator's (`jepsen.sim.nemesis.draw_schedule`, from the same kind of
seed), and so is what a network fault cuts or slows (`disturbance`): here the links are the
relays of `cellar.live.relays`. A crash is `kill -9` and a restart when it ends; a pause is
SIGSTOP and SIGCONT; a wipe is a crash that also deletes the data directory, and the restart
is with `--rejoin` (`consensus.rejoin`). Replicas rejoin one at a time, as an operator
replaces disks: once one replica lost its disk in a run, a wipe of another is a plain crash
(recorded so). Faults overlap as they are drawn: the links are recomputed from the
network faults still in force, and a replica crashed (or paused) twice comes back when the
last of them ends. Each fault's start and end go into the history (never checked, shown in
the report, and counted at the end of the run: `FAULT_STARTED`, `FAULT_SKIPPED` with why).

A replica is stopped only once it is bound to the harness (`child_processes.bound_yet`: its
death signal armed): a pause in force when a crash ends, or one that begins just after a
restart, once sent SIGSTOP to a child still in the trampoline that arms it; a harness killed
then (SIGKILL) left that replica stopped for good, holding its ports. The stop waits for the
binding, `BIND_WAIT_S` at most (polling every `BIND_POLL_S`); a replica not bound by then is
left running, and the history says so.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from cellar.live.relays import LinkRelays
from cellar.local_cluster import ProcessCluster
from jepsen.history import HistoryRecorder
from jepsen.sim.nemesis import Fault, NemesisEvent, disturbance
from jepsen.sim.network import Disturbance

FindSequencer = Callable[[], Awaitable[int | None]]
# The faults whose links depend on which replica is the sequencer. Finding it asks every replica
# (a second for each that does not answer), so no other fault waits for that.
_BY_SEQUENCER = frozenset({Fault.ISOLATE_SEQUENCER, Fault.ISOLATE_SEQUENCER_HELD,
                           Fault.MUTE_SEQUENCER, Fault.DEAF_TO_SEQUENCER})
FAULT_STARTED, FAULT_SKIPPED, FAULT_UNPAUSED = "start", "skip", "unpaused"  # history `f`s
SKIPPED_LOOKING_FOR_SEQUENCER = "its window passed while the sequencer was looked for"
BIND_WAIT_S = 5.0  # a restarted replica arms its death signal within ms; a pause waits this long
BIND_POLL_S = 0.01


class LiveNemesis:
    def __init__(self, cluster: ProcessCluster, relays: LinkRelays, recorder: HistoryRecorder,
                 find_sequencer: FindSequencer, *, clog_ms: int) -> None:
        self._cluster = cluster
        self._relays = relays
        self._recorder = recorder
        self._find_sequencer = find_sequencer
        self._clog_ms = clog_ms
        self._network: dict[int, Disturbance] = {}
        self._crashed: dict[int, int] = {}  # replica -> crash faults in force
        self._paused: dict[int, int] = {}
        self._wiped: set[int] = set()  # lost their disks: they start again with --rejoin
        self._ever_wiped: set[int] = set()
        self._faults_started = 0
        self._group: anyio.abc.TaskGroup | None = None  # while `run` runs: for deferred stops
        self.exits: list[str] = []  # replicas that stopped without the nemesis

    async def run(self, schedule: tuple[NemesisEvent, ...], started_s: float) -> None:
        """Each event at its time after `started_s` (the loop's clock), until all ended."""
        async with anyio.create_task_group() as group:
            self._group = group
            for event in schedule:
                group.start_soon(self._fault, event, started_s)
        self._group = None

    async def _fault(self, event: NemesisEvent, started_s: float) -> None:
        await anyio.sleep_until(started_s + event.at_ms / 1000)
        self._faults_started += 1
        number = self._faults_started
        what = f"{event.fault.value} {event.target} for {event.duration_ms} ms"
        ends_s = started_s + (event.at_ms + event.duration_ms) / 1000
        end = await self._start(event, number, ends_s)
        if end is None:  # finding the sequencer took the fault's whole window
            self._recorder.nemesis(FAULT_SKIPPED, f"{what}: {SKIPPED_LOOKING_FOR_SEQUENCER}")
            return
        self._recorder.nemesis(FAULT_STARTED, what)
        try:  # its scheduled end, however late it started (finding the sequencer)
            await anyio.sleep_until(ends_s)
        finally:
            with anyio.CancelScope(shield=True):
                end()
                self._recorder.nemesis("stop", what)

    async def _start(self, event: NemesisEvent, number: int, ends_s: float
                     ) -> Callable[[], None] | None:
        """Put the fault in force; returns what ends it (None: its window passed first)."""
        target = event.target
        if event.fault in (Fault.CRASH, Fault.WIPE):
            self._start_crash(target)
            if event.fault is Fault.WIPE:
                self._wipe(target)
            return lambda: self._end_crash(target)
        if event.fault is Fault.PAUSE:
            self._paused[target] = self._paused.get(target, 0) + 1
            self._hold(target)
            return lambda: self._end_pause(target)
        sequencer = await self._find_sequencer() if event.fault in _BY_SEQUENCER else None
        if anyio.current_time() >= ends_s:
            return None
        self._network[number] = disturbance(
            event.fault, target, len(self._cluster.processes),
            sequencer=target if sequencer is None else sequencer, clog_us=self._clog_ms * 1000)
        self._apply_network()
        return lambda: self._end_network(number)

    def _wipe(self, replica: int) -> None:
        """The crashed replica's disk is lost; not while another one is (or was) rejoining."""
        others = sorted(self._ever_wiped - {replica})
        if others:
            self._recorder.nemesis("plain", f"wipe {replica} left a plain crash: replica "
                                            f"{others[0]} lost its disk in this run")
            return
        shutil.rmtree(self._cluster.layout.data_dir(replica), ignore_errors=True)
        self._wiped.add(replica)
        self._ever_wiped.add(replica)

    def _restart(self, replica: int) -> None:
        self._cluster.processes[replica].start(rejoin=replica in self._wiped)
        self._wiped.discard(replica)

    def _end_crash(self, replica: int) -> None:
        self._crashed[replica] -= 1
        if not self._crashed[replica] and not self._cluster.processes[replica].running:
            self._restart(replica)
            if self._paused.get(replica, 0):  # a pause still in force holds the new process
                self._hold(replica)

    def _start_crash(self, replica: int) -> None:
        self.note_exits()  # one that stopped by itself first is not this crash's
        self._crashed[replica] = self._crashed.get(replica, 0) + 1
        self._cluster.processes[replica].kill()

    def _hold(self, replica: int) -> None:
        """SIGSTOP `replica` for a pause in force: now if it is bound to this process, else
        once it is (`_hold_when_bound`)."""
        process = self._cluster.processes[replica]
        if not process.running or process.process is None:
            return  # crashed: the restart at the crash's end holds it
        if process.bound() or self._group is None:
            self._signal(replica, signal.SIGSTOP)
            return
        self._group.start_soon(self._hold_when_bound, replica, process.process)

    async def _hold_when_bound(self, replica: int, started: object) -> None:
        """SIGSTOP `replica` once it has armed its death signal, while the pause lasts and the
        process is the one `started`; `BIND_WAIT_S` at most, then leave it running."""
        deadline_s = anyio.current_time() + BIND_WAIT_S
        while anyio.current_time() < deadline_s:
            await anyio.sleep(BIND_POLL_S)
            process = self._cluster.processes[replica]
            if (not self._paused.get(replica, 0) or process.process is not started
                    or not process.running):
                return  # the pause ended, or the process did (or was replaced)
            if process.bound():
                self._signal(replica, signal.SIGSTOP)
                return
        self._recorder.nemesis(FAULT_UNPAUSED, f"replica {replica} left running in its "
                                               f"pause: not bound to the harness within "
                                               f"{BIND_WAIT_S:g} s of its start")

    def _end_pause(self, replica: int) -> None:
        self._paused[replica] -= 1
        if not self._paused[replica]:
            self._signal(replica, signal.SIGCONT)

    def _end_network(self, number: int) -> None:
        del self._network[number]
        self._apply_network()

    def _apply_network(self) -> None:
        faults = self._network.values()
        # A held link is a cut link here: the relays close its connections, and the sender's
        # queue keeps what it sends meanwhile until it dials again (the simulator's model).
        cut = {link for fault in faults for link in (*fault.blocked, *fault.held)}
        slowed = {link for fault in faults for link in fault.clogged}
        delay_us = max((fault.clog_us for fault in faults if fault.clogged), default=0)
        self._relays.set_links(cut, slowed, delay_us / 1e6)

    def _signal(self, replica: int, number: signal.Signals) -> None:
        process = self._cluster.processes[replica]
        if process.running and process.process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.process.send_signal(number)

    def note_exits(self) -> None:
        """Record every replica that stopped though no crash fault holds it down: it failed by
        itself (an invariant's assert, an error), which the run must not hide by restarting
        it."""
        for replica, process in enumerate(self._cluster.processes):
            if process.running or self._crashed.get(replica, 0) or process.process is None:
                continue
            stopped = f"replica {replica} exited by itself (status {process.process.returncode})"
            if stopped not in self.exits:
                self.exits.append(stopped)
                self._recorder.nemesis("exit", stopped)

    def heal(self) -> None:
        """Everything back: links pass, paused replicas go on, crashed ones restart."""
        self.note_exits()
        self._network.clear()
        self._apply_network()
        for replica in sorted(self._paused):
            if self._paused[replica]:
                self._paused[replica] = 0
                self._signal(replica, signal.SIGCONT)
        for replica, process in enumerate(self._cluster.processes):
            self._crashed[replica] = 0
            if not process.running:
                self._restart(replica)
        self._recorder.nemesis("heal")
