"""The simulated cluster: replicas of the SDPaxos core driven through one event queue.

Each replica's driver follows the `Ready` contract as the runtime does: write the records,
send what may leave at once, sync (taking `sync_us`), then send what had to wait, install a
snapshot, apply the executed commands to the replica's own key-value state machine, serve
reads, and `advance`. Inputs arriving meanwhile queue in the core and leave in the next Ready:
batching comes for free under load, as in the runtime.

Time is simulated in microseconds. A replica counts ticks from its own clock (period
`tick_us`, off by up to `drift_ppm`); like the runtime's ticker it catches up on missed ticks
before it handles anything else after a pause. A paused replica (as under SIGSTOP) does
nothing until the pause ends: every step due meanwhile (a tick, a delivery, a flush, the end of
a sync with what follows it: sends, execution, replies) is deferred to the pause's end. A crash
loses unsynced records (a torn prefix may survive) and the frames its links held; a restart
rebuilds the replica from its disk. Frames a held cut kept (`jepsen.sim.network`) leave, in
order, when their link has dialed again (`release_held`), and the link's later frames follow
them.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable
from typing import Any, NamedTuple

from consensus.codec import encode_messages
from consensus.config import ReplicaConfig
from consensus.leader import ProposalDropped
from consensus.messages import Message
from consensus.prng import Prng
from consensus.ready import Ready
from consensus.replica import Replica
from jepsen.history import HistoryRecorder
from jepsen.sim.clients import Operation, Workload
from jepsen.sim.disk import Disk
from jepsen.sim.kv import KvStateMachine
from jepsen.sim.kv_codec import decode_reply, encode_get
from jepsen.sim.monitor import SafetyMonitor
from jepsen.sim.network import Network
from jepsen.sim.options import SimOptions

DELIVER, TICK, FLUSH, SYNCED, CLIENT, TIMEOUT, CALL = range(7)
FRAMES_WAITING_MAX = 256  # frames held for a crashed replica until it restarts
RECONNECT_US_MAX = 50_000  # how long after a restart its peers' held frames may arrive
# How long after a held link is up again its sender may dial it: the runtime's dialer backs
# off while the link is down, so a link held for long comes back any time within this.
HELD_RECONNECT_US_MAX = 300_000
UNANSWERED = "unanswered"  # an operation's outcome in `completed_after` when no answer came


class Event(NamedTuple):
    """Heap entries compare as tuples (time, then a unique sequence number), in C."""

    at_us: int
    sequence: int
    kind: int
    node: int
    payload: Any


class SimNode:
    """One replica and what its driver keeps: disk, state machine, clients' waiting ops."""

    __slots__ = ("busy", "config", "cpu_free_at", "crashes_in_force", "disk", "flush_pending",
                 "frames_waiting", "heard_incarnation", "id", "incarnation", "last_epoch",
                 "last_read_id",
                 "last_snapshot", "last_view", "paused_until", "pending_reads", "pending_tags",
                 "proposed_at", "rejoining", "replica", "sm", "tick_period_us",
                 "ticks_done", "ticks_origin_us", "wiped")

    def __init__(self, config: ReplicaConfig, tick_period_us: int) -> None:
        self.id = config.replica_id
        self.config = config
        self.replica: Replica | None = None
        self.sm = KvStateMachine()
        self.disk = Disk()
        self.busy = False
        self.flush_pending = False
        self.incarnation = 0
        self.paused_until = 0
        self.crashes_in_force = 0  # crash faults holding it down: it restarts when none is left
        self.cpu_free_at = 0
        self.tick_period_us = tick_period_us
        self.ticks_origin_us = 0
        self.ticks_done = 0
        self.last_snapshot = 0
        self.last_view = -1
        self.pending_tags: dict[int, Operation] = {}
        # Read ids are numbered from 1 again in every life, as the runtime's driver does:
        # replies meant for a read of an earlier life must not serve the new one's.
        self.last_read_id = 0
        self.pending_reads: dict[int, Operation] = {}  # read id -> its operation
        # Frames sent to it while it was down: the runtime's peers keep frames queued while
        # a connection is down and send them once the restarted replica is back, so its new
        # life hears what was meant for the old one (bounded, as the peers' queues are).
        # (frame, sender, `severed`, the sender's incarnation)
        self.frames_waiting: list[tuple[bytes, int, int, int]] = []
        # Per peer: its newest life a frame came from. A runtime replica drops the connection
        # of a peer's older life once the newer one dialed: nothing of the old life comes
        # after (`consensus.rejoin` relies on it), so frames of an older life are dropped.
        self.heard_incarnation = [0] * config.replica_count
        self.wiped = False  # its disk was lost: it restarts on an empty one and rejoins
        self.rejoining = False  # wiped, and not yet known to hold all its old life voted on
        self.last_epoch = 0  # its replica's epoch when it last crashed (peers' hellos name it)
        self.proposed_at: dict[int, int] = {}


class Cluster:
    def __init__(self, options: SimOptions, configs: list[ReplicaConfig], network: Network,
                 prng: Prng) -> None:
        self.options = options
        self.now_us = 0
        self._prng = prng
        self._events: list[Event] = []
        self._sequence = 0
        self.network = network
        self.monitor = SafetyMonitor(options.replica_count)
        self.history = HistoryRecorder()
        self.workload = Workload(options, prng.fork(7))
        self.nodes = [SimNode(config, self._tick_period(config.replica_id, options))
                      for config in configs]
        self._trace = hashlib.blake2b(digest_size=16)
        self.ready_latency_us: list[list[int]] = [[] for _ in configs]
        self.issuing = True
        self.client_processes: list[int] = []
        self.client_ops: dict[int, Operation] = {}
        self._op_ids = 0
        # (invoked at, outcome) per op; UNANSWERED for one that timed out or lost its replica
        self.completed_after: list[tuple[int, str]] = []
        self.invoked_at: dict[int, int] = {}
        # Per link, when the frames a held cut kept arrive: later frames arrive after them.
        self._reconnected_at: dict[tuple[int, int], int] = {}
        self.peer_snapshot_bytes: list[int] = []  # each snapshot installed from a peer, its size
        self.wipes = self.wipes_refused = 0  # disks lost, and wipes left plain crashes

    def _tick_period(self, replica: int, options: SimOptions) -> int:
        drift = self._prng.fork(100 + replica).int_inclusive(-options.drift_ppm,
                                                             options.drift_ppm)
        return options.tick_us * (1_000_000 + drift) // 1_000_000

    # --- the event queue ----------------------------------------------------------------------

    def schedule(self, at_us: int, kind: int, node: int, payload: Any = None) -> None:
        self._sequence += 1
        heapq.heappush(self._events, Event(at_us, self._sequence, kind, node, payload))

    def run_until(self, end_us: int) -> None:
        handlers = (self._deliver, self._tick, self._flush, self._synced, self._client,
                    self._timeout, self._call)
        while self._events and self._events[0].at_us <= end_us:
            event = heapq.heappop(self._events)
            self.now_us = self.monitor.now_us = event.at_us
            self._trace.update(b"%d:%d:%d;" % (event.at_us, event.kind, event.node))
            handlers[event.kind](event)
        self.now_us = self.monitor.now_us = end_us

    @property
    def trace_digest(self) -> str:
        return self._trace.hexdigest()

    # --- replicas -------------------------------------------------------------------------------

    def start(self, node: SimNode, replica: Replica) -> None:
        node.replica = replica
        node.sm = KvStateMachine()
        node.busy = node.flush_pending = False
        node.incarnation += 1
        node.last_read_id = 0
        if node.frames_waiting:
            reconnected_at = self.now_us + self._prng.int_inclusive(0, RECONNECT_US_MAX)
            for frame in node.frames_waiting:  # in order, once the peers have dialed again
                self.schedule(reconnected_at, DELIVER, node.id, frame)
            node.frames_waiting = []
        node.ticks_origin_us, node.ticks_done = self.now_us, 0
        node.last_snapshot = replica.inspect.log_base
        node.last_view = -1
        self.monitor.started(node.id, replica.inspect)
        self.schedule(self.now_us + node.tick_period_us, TICK, node.id, node.incarnation)
        self._request_flush(node)

    def crash(self, node: SimNode, *, torn: bool) -> None:
        if node.replica is None:
            return
        node.last_epoch = max(node.last_epoch, node.replica.epoch)
        node.replica = None
        node.disk.crash(self._prng, torn=torn)
        self.network.forget_held_from(node.id)
        for operation in [*node.pending_tags.values(), *node.pending_reads.values()]:
            self.finish_unknown(operation)
        node.pending_tags.clear()
        node.pending_reads.clear()
        node.proposed_at.clear()

    def wipe(self, node: SimNode) -> bool:
        """The crashed `node` lost its disk: it restarts on an empty one and rejoins. Not
        while as many other replicas as the group tolerates faults are still rejoining (one
        in 3 replicas, two in 5: more lost at once could lose what a quorum chose): False,
        and the crash stays a plain one."""
        for other in self.nodes:
            if other.rejoining and other.replica is not None and other.replica.rejoin_cleared:
                other.rejoining = False
        rejoining = sum(other.rejoining for other in self.nodes if other is not node)
        if rejoining >= node.config.faults_tolerated:
            self.wipes_refused += 1
            return False
        node.disk = Disk()
        node.wiped = node.rejoining = True
        self.wipes += 1
        return True

    def _request_flush(self, node: SimNode) -> None:
        if not node.flush_pending and node.replica is not None:
            node.flush_pending = True
            self.schedule(max(self.now_us, node.paused_until), FLUSH, node.id,
                          node.incarnation)

    def _available(self, node: SimNode, event: Event) -> bool:
        """Defer the event while the node is paused; False if it must not run now."""
        if node.replica is None:
            return False
        if self.now_us < node.paused_until:
            self.schedule(node.paused_until, event.kind, event.node, event.payload)
            return False
        self._catch_up_ticks(node)
        return True

    def _catch_up_ticks(self, node: SimNode) -> None:
        assert node.replica is not None
        due = (self.now_us - node.ticks_origin_us) // node.tick_period_us
        while node.ticks_done < due:
            node.ticks_done += 1
            node.replica.tick()

    def _tick(self, event: Event) -> None:
        node = self.nodes[event.node]
        if event.payload != node.incarnation or not self._available(node, event):
            return
        next_at = node.ticks_origin_us + (node.ticks_done + 1) * node.tick_period_us
        self.schedule(next_at, TICK, node.id, node.incarnation)
        assert node.replica is not None
        if node.replica.has_ready():
            self._request_flush(node)

    def _deliver(self, event: Event) -> None:
        node = self.nodes[event.node]
        frame, source, severed, life = event.payload
        if severed != self.network.severed(source, node.id):
            return  # a fault closed the connection it travelled on
        if life < node.heard_incarnation[source]:
            return  # from a life of the sender older than one this replica heard
        node.heard_incarnation[source] = life
        if node.replica is None:
            if len(node.frames_waiting) < FRAMES_WAITING_MAX:
                node.frames_waiting.append(event.payload)
            return
        if not self._available(node, event):
            return
        cost = self.options.straggler_cpu_us if node.id == self.options.straggler else 0
        if cost:
            if node.cpu_free_at > self.now_us:
                self.schedule(node.cpu_free_at, DELIVER, node.id, event.payload)
                return
            node.cpu_free_at = self.now_us + cost
        assert node.replica is not None
        node.replica.receive(frame)
        self._request_flush(node)

    def send(self, node: SimNode, messages: list[tuple[int, Message]]) -> None:
        by_target: dict[int, list[Message]] = {}
        for target, message in messages:
            by_target.setdefault(target, []).append(message)
        for target in sorted(by_target):
            frame = encode_messages(by_target[target])
            if self.network.holds(node.id, target):
                self.network.hold(node.id, target, frame)
                continue
            severed = self.network.severed(node.id, target)
            # Behind the frames a held link still has to send once it has dialed again.
            after_us = self._reconnected_at.get((node.id, target), 0)
            for arrival in self.network.arrivals(self.now_us, node.id, target):
                self.schedule(max(arrival, after_us), DELIVER, target,
                              (frame, node.id, severed, node.incarnation))

    def release_held(self, reconnect_us_max: int = HELD_RECONNECT_US_MAX) -> None:
        """Frames held on links that are up again leave in order, as a runtime peer sends its
        queue once it has dialed again (after a backoff: up to `reconnect_us_max`)."""
        for (source, target), frames in self.network.released():
            reconnected_at = self.now_us + self._prng.int_inclusive(0, reconnect_us_max)
            arrival = reconnected_at + self.network.latency_us(source, target)
            self._reconnected_at[(source, target)] = arrival
            severed = self.network.severed(source, target)
            life = self.nodes[source].incarnation  # a crash forgets what its life held
            for frame in frames:
                self.schedule(arrival, DELIVER, target, (frame, source, severed, life))

    # --- the driver: one Ready at a time --------------------------------------------------------

    def _flush(self, event: Event) -> None:
        node = self.nodes[event.node]
        if event.payload != node.incarnation:
            return
        node.flush_pending = False
        if node.busy or not self._available(node, event):
            return
        assert node.replica is not None
        ready = node.replica.ready()
        self._check_view_log(node, node.replica)
        if ready.is_empty():
            return
        node.disk.write(ready.records)
        self.send(node, ready.messages)
        node.busy = True
        if ready.must_sync:
            self.schedule(self.now_us + self.options.sync_us, SYNCED, node.id,
                          (node.incarnation, ready))
        else:
            self._persisted(node, ready)

    def _check_view_log(self, node: SimNode, replica: Replica) -> None:
        """A new sequencer's log, checked as soon as it is rebuilt: it must hold every instance
        ready by then. (Checked once the view is established, a sequencer whose acknowledgements
        came late would be held to what a newer view made ready since.)"""
        inspect = replica.inspect
        if inspect.holds_view_log and inspect.view != node.last_view:
            node.last_view = inspect.view
            self.monitor.view_log_built(node.id, inspect)

    def _synced(self, event: Event) -> None:
        """The sync a Ready waited for is done: unless the replica is paused (then at the end
        of the pause) it sends, executes and advances."""
        node = self.nodes[event.node]
        incarnation, ready = event.payload
        if incarnation != node.incarnation or not self._available(node, event):
            return
        node.disk.sync()
        self._persisted(node, ready)

    def _persisted(self, node: SimNode, ready: Ready) -> None:
        replica = node.replica
        assert replica is not None
        self.send(node, ready.messages_after_persist)
        install = ready.snapshot_to_install
        if install is not None:
            if install.meta.slot > node.last_snapshot:  # not the one it restarted from
                self.peer_snapshot_bytes.append(len(install.state))
            node.sm.restore(install.state)
            node.last_snapshot = install.meta.slot
            self.monitor.installed(node.id, install.meta)
        self._apply(node, ready)
        executed = replica.executed_slots  # before advance, which may execute more
        if executed - node.last_snapshot >= self.options.snapshot_every_slots and \
                replica.may_compact:
            replica.compact(node.sm.snapshot(), executed)
            node.last_snapshot = executed
        replica.advance()
        node.busy = False
        self._request_flush(node)

    def _apply(self, node: SimNode, ready: Ready) -> None:
        replica = node.replica
        assert replica is not None
        for tag in ready.covered:
            self._command_covered(node, tag)
        for item in ready.executed:
            self.monitor.executed(node.id, replica.inspect, item)
            for command in item.commands:
                reply = node.sm.apply(command.payload)
                if command.origin == node.id:
                    self._command_done(node, command.tag, reply)
        if ready.executed:  # the state after this Ready's last slot (the core may be further)
            self.monitor.digest(node.id, ready.executed[-1].slot + 1, node.sm.digest())
        for index in ready.readied_instances:
            self.monitor.ready(node.id, replica.inspect, index)
        for tag in ready.readied:
            self.monitor.readied(node.id, tag)
            proposed = node.proposed_at.pop(tag, None)
            if proposed is not None:
                self.ready_latency_us[node.id].append(self.now_us - proposed)
        for read_id in ready.reads:
            self._read_done(node, read_id)
        for read_id in ready.reads_refused:
            operation = node.pending_reads.pop(read_id, None)
            if operation is not None:
                self.finish(operation, "fail", None)

    # --- clients --------------------------------------------------------------------------------

    def add_client(self, client: int, start_us: int) -> None:
        self.client_processes.append(client)
        self.schedule(start_us, CLIENT, client % self.options.replica_count, client)

    def _client(self, event: Event) -> None:
        client = event.payload
        if not self.issuing:
            return
        node = self.nodes[event.node]
        if node.replica is None or self.now_us < node.paused_until:
            self.schedule(self.now_us + self.options.think_us * 5, CLIENT, node.id, client)
            return
        self._op_ids += 1
        deadline = self.now_us + self.options.client_timeout_ms * 1000
        operation = self.workload.next_operation(self._op_ids, client,
                                                 self.client_processes[client], node.id,
                                                 deadline)
        self._invoke(node, operation)

    def _invoke(self, node: SimNode, operation: Operation) -> None:
        replica = node.replica
        assert replica is not None
        operation.handle = self.history.invoke(operation.process, operation.f, operation.value,
                                               key=operation.key)
        self.client_ops[operation.op_id] = operation
        self.invoked_at[operation.op_id] = self.now_us
        self.schedule(operation.deadline_us, TIMEOUT, node.id, operation.op_id)
        if operation.f == "get":
            node.last_read_id += 1
            operation.read_id = node.last_read_id
            node.pending_reads[operation.read_id] = operation
            replica.read(operation.read_id)
        else:
            try:
                tag = replica.propose(operation.payload)
            except ProposalDropped:
                self.finish(operation, "fail", operation.value)
                return
            node.pending_tags[tag] = operation
            node.proposed_at[tag] = self.now_us
            self.monitor.proposed(node.id, tag)
        self._request_flush(node)

    def propose_at(self, replica: int, payload: bytes) -> None:
        """An open-loop proposal (no client waits for it): only its latency is measured."""
        node = self.nodes[replica]
        if node.replica is None:
            return
        tag = node.replica.propose(payload)
        node.proposed_at[tag] = self.now_us
        self._request_flush(node)

    def _command_done(self, node: SimNode, tag: int, reply: bytes) -> None:
        applied, _ = decode_reply(reply)  # a cas: false when the compare failed
        self._command_ended(node, tag, lambda _: applied)

    def _command_covered(self, node: SimNode, tag: int) -> None:
        """A snapshot from a peer applied this command; its reply is not here. A put took
        effect; whether a cas did, the store remembers (until it has seen `CAS_OUTCOMES_MAX`
        newer ones: then the outcome is unknown)."""
        self._command_ended(node, tag, node.sm.cas_outcomes.get)

    def _command_ended(self, node: SimNode, tag: int,
                       cas_took_effect: Callable[[int], bool | None]) -> None:
        """Answer the client of `tag`: a put took effect; a cas as `cas_took_effect` says of
        its new value (None: unknown)."""
        operation = node.pending_tags.pop(tag, None)
        if operation is None:
            return
        if operation.f == "put":
            self.finish(operation, "ok", operation.value)
            return
        new_value: int = operation.value[1]  # type: ignore[index]
        took_effect = cas_took_effect(new_value)
        if took_effect is None:
            self.finish_unknown(operation)
            return
        self.finish(operation, "ok", took_effect)
        if took_effect:
            self.workload.observed(operation.key, new_value)

    def _read_done(self, node: SimNode, read_id: int) -> None:
        operation = node.pending_reads.pop(read_id, None)
        if operation is None:
            return
        _, value = decode_reply(node.sm.query(encode_get(operation.key)))
        self.finish(operation, "ok", value)

    def _timeout(self, event: Event) -> None:
        operation = self.client_ops.get(event.payload)
        if operation is None:
            return
        node = self.nodes[operation.replica]
        if node.pending_reads.get(operation.read_id) is operation:
            del node.pending_reads[operation.read_id]
            if node.replica is not None:
                node.replica.cancel_read(operation.read_id)
        for tag in [tag for tag, pending in node.pending_tags.items() if pending is operation]:
            del node.pending_tags[tag]
        self.finish_unknown(operation)

    def finish_unknown(self, operation: Operation) -> None:
        """No answer came (a timeout, a crash): a write's outcome is unknown (info); a read
        changed nothing, so it failed. Either is `unknown` in `completed_after`, which the
        runner's liveness check counts after the heal."""
        self.finish(operation, "fail" if operation.f == "get" else "info", None, answered=False)

    def finish(self, operation: Operation, outcome: str, value: object, *,
               answered: bool = True) -> None:
        if self.client_ops.pop(operation.op_id, None) is None:
            return
        assert operation.handle is not None
        self.history.complete(operation.handle, outcome, value)
        self.completed_after.append((self.invoked_at.pop(operation.op_id),
                                     outcome if answered else UNANSWERED))
        if outcome == "info":
            self.client_processes[operation.client] += len(self.client_processes)
        self.schedule(self.now_us + self._prng.int_inclusive(0, self.options.think_us),
                      CLIENT, operation.client % self.options.replica_count, operation.client)

    # --- faults and phases (scheduled by the runner) ------------------------------------------

    def call_at(self, at_us: int, action: Callable[[Cluster], None]) -> None:
        self.schedule(at_us, CALL, 0, action)

    def _call(self, event: Event) -> None:
        event.payload(self)
