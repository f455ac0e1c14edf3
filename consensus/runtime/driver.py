"""The driver: one task owns a replica and carries out each Ready in the order it demands.

Peer frames, client proposals and reads reach it through one bounded `Inbox`; time reaches it
as ticks counted from a monotonic clock that also counts a suspended machine's sleep
(`TICK_CLOCK`): the task sleeps until an input comes or the next tick is due, and after a pause
it catches up on every missed tick before it handles anything else (the last
`TICKS_REPLAYED_MAX` replayed one by one, any earlier passed over at once), and again before each
input of a batch, so a lease is never granted or judged on stale time (a follower's promise
and a sequencer's read index are judged at inputs; the core grants nothing of the kind on a
tick, as a replayed tick's `now` is in the past). Any input wakes it at once; with none, it
sleeps `idle_wake_ticks` ticks at a time instead of one: every wake-up costs a switch of
process, and ticks had been most of an idle replica's CPU, and a wake-up in four of a busy one
at one caller. The core's clock stays exact (the missed ticks are caught up on waking, and
before every input); only what it does on a tick by itself (heartbeats, resends, timeouts) and
the clients' deadlines may come up to `idle_wake_ticks - 1` ticks late, well inside the margins
between heartbeats, leases and elections.

Each Ready is handled as `consensus.ready` prescribes: messages that may leave at once go out,
the records are appended and synced (in a worker thread while this task waits, under load or
when the sync is long: see `_persist_records`), then the messages that promised them
leave, a snapshot is installed, the executed commands are applied to the state machine and
their results handed to the waiting clients, and `advance()` lets the core count its own
acceptance.

A reader that hands in an input while the driver's task sleeps, with at most one command or
read of this replica's clients waiting and the last turn a single input's, runs the turn
itself (`claim_turn`, then `turn_here`) instead of waking the driver's task: at one caller
every message received had cost a second turn of the loop, from the reader's task to the
driver's (six turns a put at the sequencer's replica, three at the acceptor; now four and
two). Under load the gates keep turns with the driver's task, which takes every input of a
loop's turn at once (one Ready, one append, one sync for all of them). One turn runs at a
time: the driver's task, woken meanwhile, waits for the other to end; offers made during it
do not ring, and the end rings for any. A turn's awaits are shielded, so a reader cancelled
during one (its connection replaced) still ends it whole, and what a turn raises stops the
driver's task, as its own would.

Group commit comes for free: while one sync runs, inputs queue (in the inbox and in the
kernel's socket buffers), and the next Ready carries all of them in one batch of records and
one sync.

A replica snapshots its state machine, and its core and record log let the log below go, every
`snapshot_every_slots` slots or `snapshot_every_bytes` bytes of commands applied, whichever
period ends first (`snapshot_due`): the slots bound the log in commands, the bytes in memory
and disk when the slots hold big batches.

The sequencer's periodic system command (the state machine's Tick) and the client commands
the server hands in are stamped by one `StampClock` per replica (`stamp_ms`): the wall clock,
but a step of it (an admin's `date`, a bad NTP step) is slewed in at 1 %, not taken at once,
which had expired every lease and session with the next Tick (consensus/runtime/
stamp_clock.py). Ticks are proposed only while those stamps agree with a majority of the
group's, as the peers' hellos said: a replica booted with a wrong clock withholds them
(consensus/runtime/clock_agreement.py), and each system period every driver tells its core
what it judged of the clocks, so that followers replace a sequencer whose clock is off.

A failure to persist stops the driver (and so the replica): after a failed fsync the state of
the page cache is unknown, and continuing could lose what was acknowledged.

Client commands are bounded in bytes as well as in count: `proposal_bytes_max` caps the bytes
of commands submitted and not yet executed, covered by a snapshot or refused, however long their
clients wait (consensus/runtime/proposal_budget.py), and reads' queries until answered; past it
a submit or a read is answered Overloaded. Watches, which may wait minutes, have a budget of
their own, `watch_bytes_max`, with a share for each principal (consensus/runtime/
watch_budget.py): one client's watches had held the budget commands share, and every other
client's commands were refused. Node agents' commands have a reserve in this budget and in the
queues' places, so their heartbeats go through a flood of other clients' commands (consensus/
runtime/proposal_budget.py).

Clients' commands and reads take at most half of the input queue's `inputs_max` places; past
that they are answered Overloaded (nothing proposed: safe to retry), and peers' frames keep the
other half. Under client load with the driver held up (a slow fsync), commands had taken every
place and the peers' acknowledgements, lease grants and heartbeats were dropped: the replica's
own commands stopped committing, and its clients' retries added to the load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import anyio.to_thread

from consensus.catchup import snapshot_state_bytes_max
from consensus.codec import (
    ENVELOPE_BYTES_MAX,
    MESSAGE_BYTES_MAX,
    RECORD_BYTES_MAX,
    encode_envelope,
)
from consensus.envelope import SYSTEM_PRINCIPAL, Envelope
from consensus.errors import ConsensusError
from consensus.leader import ProposalDropped
from consensus.messages import Message
from consensus.ready import Ready
from consensus.record_log import holds_snapshot
from consensus.records import Record
from consensus.replica import Replica
from consensus.runtime.clock_agreement import ClockAgreement
from consensus.runtime.deadlines import Doorbell, ExpiryHeap
from consensus.runtime.inbox import Inbox
from consensus.runtime.message_frames import frames_of
from consensus.runtime.metrics import Metrics
from consensus.runtime.proposal_budget import ProposalBudget, shared_places
from consensus.runtime.stamp_clock import BOOT_CLOCK, StampClock, wall_clock_ms
from consensus.runtime.watch_budget import WATCH_BYTES_MAX, WatchBudget
from consensus.state_machine import StateMachine

# The ticks' clock counts the time a suspended machine slept (CLOCK_BOOTTIME on Linux), which
# CLOCK_MONOTONIC does not: a sequencer resumed after a suspend would otherwise count its lease
# from before it, while its peers, counting the whole time, elected another and moved on.
TICK_CLOCK: Callable[[], float] = BOOT_CLOCK
# Missed ticks replayed one by one at most (10 s at 10 ms a tick); earlier ones pass at once
# (`Replica.pass_ticks`): a day's suspend would otherwise replay 8.6 million ticks, seconds of
# work on the loop and a heartbeat queued for every tenth of them.
TICKS_REPLAYED_MAX = 1000
# A wake-up for a tick is set this much after the tick is due: uvloop rounds a timer to the
# millisecond, so one set for the boundary could fire up to half a millisecond before it,
# find nothing due, and set the next for the rest, which rounds to nothing: the driver spun
# through several empty turns before each tick (9 a tick while commit notices were held)
WAKE_LATE_S = 0.001
PROPOSAL_BYTES_MAX = 256 << 20
# A snapshot's state must fit one log record with its metadata: a larger one could not be
# written, and the replica would stop at every start, at the same slot as its peers.
SNAPSHOT_STATE_BYTES_MAX = RECORD_BYTES_MAX - (1 << 20)
# Of commands applied, at most, between snapshots. Not lower: a snapshot holds up its replica
# for seconds at a state of a few hundred MB (encoded on the loop, written before the next
# records), and at 512 MiB the benchmark's sequencer took one in its busiest phase: 1 KB puts
# at 4,096 callers fell from about 94,000 a second to 33,000, at a p99 of 2.5 s.
SNAPSHOT_EVERY_BYTES = 4 << 30

logger = logging.getLogger("cellar.driver")


class RecordStore(Protocol):
    def append(self, records: Sequence[Record]) -> None: ...

    def sync(self) -> None: ...

    @property
    def sync_is_long(self) -> bool:
        """Whether the next `sync` does more than an fdatasync (it rewrites the whole log, or
        writes zeros ahead of the records), and so is too slow for the loop."""


class OutcomeUnknown(ConsensusError):
    """The command was handed to consensus but no result came in time: it may still run."""


class Overloaded(ConsensusError):
    """The replica's input queue (or its budget of command bytes) is full; nothing was
    proposed, so retrying is safe."""


class QueryFailed(ConsensusError):
    """The state machine raised on a query (a bug of the machine's, or state it cannot
    render): that query is answered with the error, and the replica serves on."""


@dataclass(frozen=True, slots=True)
class DriverConfig:
    tick_ms: int = 10
    idle_wake_ticks: int = 4  # ticks slept at a time while no input comes (module docstring)
    system_every_ms: int = 1000  # how often the sequencer proposes the system command
    inputs_max: int = 65_536
    # Bytes of peers' frames waiting in the input queue: past it a frame is dropped, as when
    # the queue is full (the protocol resends what matters). See consensus/runtime/inbox.py.
    inputs_bytes_max: int = 256 << 20
    drain_max: int = 8192  # inputs handled before the next Ready
    snapshot_every_slots: int = 20_000
    # ... or once this many bytes of commands were executed since the last, whatever their
    # slots: a slot holds a batch of up to `batch_bytes_max`, so 20,000 slots of busy
    # batches were gigabytes of log, held in memory by the core and the record log until
    # the next snapshot (1 KB puts at 4,096 callers fill slots of about 200 KiB).
    snapshot_every_bytes: int = SNAPSHOT_EVERY_BYTES
    frame_bytes_max: int = MESSAGE_BYTES_MAX // 4
    # Bytes of client commands submitted and not yet executed (module docstring)
    proposal_bytes_max: int = PROPOSAL_BYTES_MAX
    # Bytes of watches' queries while they wait, a budget of their own (module docstring)
    watch_bytes_max: int = WATCH_BYTES_MAX
    # Under load (the loop took several inputs at once), append and sync in a worker thread,
    # so the loop keeps serving the network meanwhile and the next Ready gathers a bigger
    # batch; a lone input is persisted right here, sparing two thread hand-offs of latency,
    # unless its sync is long (a compaction, zeros written ahead): that one always goes to the
    # thread.
    # (The process should lower sys.setswitchinterval, or the worker may wait up to 5 ms for
    # the interpreter lock after the sync returns.)
    persist_in_thread: bool = True

    def __post_init__(self) -> None:
        for name in ("tick_ms", "idle_wake_ticks", "inputs_max", "inputs_bytes_max",
                     "drain_max", "snapshot_every_slots", "snapshot_every_bytes",
                     "proposal_bytes_max", "watch_bytes_max"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


Done = Callable[[bytes | None, Exception | None], None]


class _Callback:
    """Where a command's or read's result goes: a function, called once from the driver's task
    (no task, event or cancel scope per command). The driver fails it once its deadline
    passes."""

    __slots__ = ("deadline", "done", "started")

    def __init__(self, done: Done, started: float, deadline: float) -> None:
        self.done = done
        self.started = started
        self.deadline = deadline

    def resolve(self, value: bytes) -> None:
        self.done(value, None)

    def fail(self, error: Exception) -> None:
        self.done(None, error)


class Driver:
    def __init__(self, replica: Replica, store: RecordStore, machine: StateMachine,
                 send: Callable[[int, bytes], bool], metrics: Metrics, *,
                 config: DriverConfig = DriverConfig(),
                 clock: Callable[[], float] = TICK_CLOCK,
                 system_command: Callable[[int], bytes] | None = None,
                 wall_ms: Callable[[], int] = wall_clock_ms,
                 clock_agreement: ClockAgreement | None = None) -> None:
        self.replica = replica
        self._store = store
        self._machine = machine
        self._send = send
        self.metrics = metrics
        self.config = config
        self._clock = clock
        self._inbox: Inbox[tuple[Any, ...]] = Inbox(config.inputs_max, config.inputs_bytes_max)
        self._client_inputs = 0  # clients' commands and reads in the inbox
        self._client_inputs_max = max(1, config.inputs_max // 2)  # module docstring
        # Past these, only reserved (node agents') commands: proposal_budget.py
        self._client_inputs_shared = shared_places(self._client_inputs_max)
        self._core_queue_shared = shared_places(replica.config.pending_proposals_max)
        self._proposals: dict[int, _Callback] = {}
        self._budget = ProposalBudget(config.proposal_bytes_max)
        self._watches = WatchBudget(config.watch_bytes_max)
        self._reads: dict[int, tuple[bytes, _Callback]] = {}
        # Deadlines of the commands' and the reads' callbacks, by tag and by read id: one heap
        # each, so that whether one still waits is a dict's own lookup, no call of ours per
        # entry when the heap compacts (every command is pushed once)
        self._proposal_deadlines: ExpiryHeap[int] = ExpiryHeap(self._proposals.__contains__)
        self._read_deadlines: ExpiryHeap[int] = ExpiryHeap(self._reads.__contains__)
        self._read_ids = 0
        self._ticks_done = 0
        self._origin = clock()
        self._last_snapshot = replica.executed_slots
        # Bytes of commands this driver applied, and their count at its last snapshot (or
        # install): a restart counts afresh, so its replayed log counts only in slots.
        self._applied_bytes = 0
        self._last_snapshot_bytes = 0
        # Slots the state machine holds. A restarted core counts the snapshot it replayed at
        # once, but the machine gets it only with the first Ready (may_compact is False while
        # an install waits): until then it holds nothing, and watches must not see it as more.
        self._machine_slots = replica.executed_slots if replica.may_compact else 0
        self._applied = anyio.Event()
        self.running = False
        self._system_command = system_command  # e.g. the state machine's Tick(now_ms)
        # This replica's stamps (the Ticks', and its clients' commands' through the server):
        # the wall clock `wall_ms`, its steps slewed on `clock` (consensus/runtime/
        # stamp_clock.py)
        self.stamp_clock = StampClock(wall_ms, clock)
        # The Ticks wait while the stamps disagree with the group's (consensus/runtime/
        # clock_agreement.py); None: no peers to ask (a lone driver in tests)
        self.clock_agreement = clock_agreement
        self._system_due = 0.0
        self._inputs_last_turn = 0  # inputs the loop took at once last time: a load gauge
        # Whose task runs the turn (module docstring): the driver's sleeps for inputs (and
        # how long: one tick, or `idle_wake_ticks`), another's runs one, what one raised
        self._parked = self._parked_short = self._turn_held = False
        self._turn_over = Doorbell()
        self._turn_failure: Exception | None = None

    # --- inputs, from other tasks -----------------------------------------------------------------

    def deliver(self, sender: int, frame: bytes) -> None:
        """A frame from a peer (transport callback); dropped and counted when the queue is full,
        in items or in bytes: the protocol resends what matters."""
        self._offer(("frame", sender, frame), "driver.frames_dropped_queue_full", len(frame))

    def _offer(self, item: tuple[Any, ...], dropped: str, size: int = 0) -> bool:
        if self._inbox.offer(item, size):
            return True
        self.metrics.count(dropped)
        return False

    def submit(self, command: bytes, timeout_s: float, done: Done, *,
               reserved: bool = False, released: Callable[[], None] | None = None) -> None:
        """Replicate `command`: `done(reply, None)` with the state machine's reply, or
        `done(None, error)` (Overloaded: nothing was proposed; OutcomeUnknown: no result within
        `timeout_s`, the command may still be applied), called exactly once, from the driver's
        task (or at once when the input queue or the budget of command bytes is full).
        `reserved`: a node agent's command, which may use the reserve kept for them
        (consensus/runtime/proposal_budget.py). `released`: called once this driver lets go
        of the command's bytes (executed, covered by a snapshot, or refused), which may be
        long after `done` (a node agent's share of the reserve: consensus/runtime/
        node_reserve.py)."""
        # The common case, a command any client may send with room for it everywhere, is
        # queued right here (one call, not six: this runs per command); anything else, refused
        # or reserved, takes `_queued`, which says why.
        size = len(command)
        if (not reserved and size <= ENVELOPE_BYTES_MAX
                and self._client_inputs < self._client_inputs_shared
                and self._budget.admit(size)):
            now = self._clock()
            if self._inbox.offer(("propose", command, _Callback(done, now, now + timeout_s),
                                  False, released)):
                self._client_inputs += 1
                return
            self._budget.refund(size)  # the queue is full: `_queued` counts and answers it
        if not self._queued(command, timeout_s, done, reserved, released) and \
                released is not None:  # refused: nothing held
            released()

    def _queued(self, command: bytes, timeout_s: float, done: Done, reserved: bool,
                released: Callable[[], None] | None) -> bool:
        """Whether `command` is queued for the core; if not, `done` has its refusal."""
        if len(command) > ENVELOPE_BYTES_MAX:  # the core refuses it (consensus/leader.py)
            self.metrics.count("driver.proposals_refused_size")
            done(None, ValueError(f"a command of {len(command)} bytes; at most "
                                  f"{ENVELOPE_BYTES_MAX}"))
            return False
        if not self._admit(len(command), done, "driver.proposals_refused_bytes", reserved):
            return False
        if not self._submit("propose", command, timeout_s, done, "driver.proposals_refused",
                            reserved=reserved, released=released):
            self._budget.refund(len(command))
            return False
        return True

    def submit_read(self, query: bytes, timeout_s: float, done: Done) -> None:
        """A linearizable read, answered through `done` as `submit` answers: the query runs once
        this replica executed every slot the sequencer had allocated when asked (its read
        index, under its lease). Its bytes count against the same budget as commands' until
        `done` is called (exactly once, whatever the outcome)."""
        size = len(query)
        if not self._admit(size, done, "driver.reads_refused_bytes"):
            return

        def answered(reply: bytes | None, error: Exception | None) -> None:
            self._budget.refund(size)
            done(reply, error)

        self._submit("read", query, timeout_s, answered, "driver.reads_refused")

    def _admit(self, size: int, done: Done, refused: str, reserved: bool = False) -> bool:
        """Take `size` bytes of the budget for a request, or answer it Overloaded at once."""
        if self._budget.admit(size, reserved):
            return True
        self.metrics.count(refused)
        done(None, self._over_budget())
        return False

    def _over_budget(self) -> Overloaded:
        return Overloaded(f"the replica holds {self._budget.held_bytes} bytes of requests not "
                          f"yet answered or executed (at most {self._budget.bytes_max})")

    def _submit(self, kind: str, payload: bytes, timeout_s: float, done: Done,
                refused: str, *, reserved: bool = False,
                released: Callable[[], None] | None = None) -> bool:
        places = self._client_inputs_max if reserved else self._client_inputs_shared
        if self._client_inputs >= places:  # the rest is for peers' frames (and node agents')
            self.metrics.count(refused)
            done(None, Overloaded("the replica's input queue holds all the client requests "
                                  "it takes"))
            return False
        now = self._clock()
        if not self._offer((kind, payload, _Callback(done, now, now + timeout_s), reserved,
                            released), refused):
            done(None, Overloaded("the replica's input queue is full"))
            return False
        self._client_inputs += 1
        return True

    async def local_read(self, query: bytes, after_slot: int, wait_s: float,
                         owner: Hashable = None) -> tuple[bytes, int]:
        """Run `query` on this replica's state, once it has executed past `after_slot` or after
        `wait_s` (long polling for watches); returns the result and the slot count the state
        machine holds (not the core's, which a restart's replayed snapshot runs ahead).

        The query's bytes count while it waits: a watch may wait minutes, and a connection's
        thousand watches of a megabyte each held a gigabyte that nothing bounded. They count
        against the watches' own budget, within `owner`'s share of it (the principal asking:
        consensus/runtime/watch_budget.py); past either it raises Overloaded at once."""
        size = len(query)
        refused = self._watches.admit(owner, size)
        if refused is not None:
            self.metrics.count(f"driver.watches_refused_{refused[0]}")
            raise Overloaded(refused[1])
        try:
            with anyio.move_on_after(wait_s):
                while self._machine_slots <= after_slot:
                    await self._applied.wait()
            return self._query(query), self._machine_slots
        finally:
            self._watches.release(owner, size)

    @property
    def proposal_bytes(self) -> int:
        """Bytes of client commands submitted and not yet executed (or refused)."""
        return self._budget.held_bytes

    def stamp_ms(self) -> int:
        """This replica's stamp for now, which a step of the wall clock does not move at once
        (consensus/runtime/stamp_clock.py): the Ticks' and the served commands' time."""
        return self.stamp_clock.now_ms()

    @property
    def watch_bytes(self) -> int:
        """Bytes of watches' queries waiting now."""
        return self._watches.held_bytes

    def status(self) -> dict[str, Any]:
        status = self.replica.status()
        return {
            "replica_id": status.replica_id, "view": status.view, "status": status.status,
            "sequencer": status.sequencer, "is_sequencer": status.is_sequencer,
            "executed_slots": status.executed_slots, "commit_prefix": status.commit_prefix,
            "log_base": status.log_base, "pending_proposals": status.pending_proposals,
            "proposal_bytes": self.proposal_bytes, "watch_bytes": self.watch_bytes,
            "running": self.running, "counters": dict(status.counters),
            "metrics": self.metrics.snapshot(),
        }

    # --- the loop -------------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        self.running = True
        self._origin = self._clock()
        task_status.started()
        try:
            await self._loop()
        finally:
            self.running = False
            self._fail_all(OutcomeUnknown("the replica stopped"))

    async def _loop(self) -> None:
        while True:
            await self._next_inputs()
            await self._turn()

    async def _turn(self) -> None:
        """Everything the inputs just taken, and the time, call for."""
        self._expire_callbacks()
        self._maybe_system_command()
        while self.replica.has_ready():
            ready = self.replica.ready()
            if ready.is_empty():
                break
            await self._handle(ready)

    # --- a turn on the task an input came on (module docstring) ------------------------------

    def claim_turn(self) -> bool:
        """Whether the caller, about to hand in its inputs, runs the turn that takes them: if
        so, they do not wake the driver's task, and the caller must then await `turn_here`."""
        if not self._parked or self._turn_held or self._inbox or self._inputs_last_turn > 1 \
                or len(self._proposals) + len(self._reads) > 1 \
                or self._turn_failure is not None:
            return False
        self._turn_held = True
        self._inbox.hold()
        return True

    async def turn_here(self) -> None:
        """The turn `claim_turn` gave the caller. What it raises stops the driver's task."""
        try:
            self._take_inputs()
            self.metrics.count("driver.turns_here")
            await self._turn()
        except Exception as error:  # the driver's failure, not the reader's
            self._turn_failure = error
        finally:
            self._turn_held = False
            self._inbox.release()  # rings for inputs offered meanwhile
            self._turn_over.ring()
            # The driver's task sleeps until a tick set before this turn: wake it to sleep
            # again for one tick if commit notices are now held for the next, or to fail
            if self._turn_failure is not None or \
                    (self.replica.holds_notices and not self._parked_short):
                self._inbox.wake()

    async def _next_inputs(self) -> None:
        """Wait for inputs or the next wake-up tick, whichever comes first, and for any turn
        another task runs to end, then take them (`_take_inputs`)."""
        # Held commit notices leave at the next tick (consensus/notice_hold.py)
        ticks = 1 if self.replica.holds_notices else self.config.idle_wake_ticks
        tick_s = self.config.tick_ms / 1000
        wake = self._origin + (self._ticks_done + ticks) * tick_s + WAKE_LATE_S
        self._parked, self._parked_short = True, ticks == 1
        try:
            await self._inbox.wait(min(ticks * tick_s, wake - self._clock()))
        finally:
            self._parked = False
        self.metrics.count("driver.wakeups")
        while self._turn_held:
            await self._turn_over.sleep()
        if self._turn_failure is not None:
            raise self._turn_failure
        self._take_inputs()

    def _take_inputs(self) -> None:
        """Catch up on the ticks due, and only then take what is queued, looking at the clock
        again before each input: a lease is never granted or judged on stale time, however
        long the task slept, was kept from running, or spent on the inputs before (the lease's
        margin is a few ticks; a look at the clock costs half a microsecond, an input tens)."""
        self._catch_up_ticks()
        items = self._inbox.take(self.config.drain_max)
        # `_catch_up_ticks` and `_take` per input, inline (once per command): the clock is
        # still read before each input, the ticks caught up on only when one is due.
        clock, origin, tick_ms = self._clock, self._origin, self.config.tick_ms
        proposed = 0
        for item in items:
            if int((clock() - origin) * 1000 // tick_ms) > self._ticks_done:
                self._catch_up_ticks()
            if item[0] == "propose":
                self._client_inputs -= 1
                proposed += self._take_proposal(item[1], item[2], item[3], item[4])
            else:
                self._take(item)
        if proposed:  # counted once per batch
            self.metrics.count("driver.proposals", proposed)
        self._inputs_last_turn = len(items)

    def _catch_up_ticks(self) -> None:
        due = int((self._clock() - self._origin) * 1000 // self.config.tick_ms)
        passed = due - TICKS_REPLAYED_MAX - self._ticks_done
        if passed > 0:
            self.metrics.count("driver.ticks_passed", passed)
            self.replica.pass_ticks(passed)
            self._ticks_done += passed
        while self._ticks_done < due:
            self._ticks_done += 1
            self.replica.tick()

    def _maybe_system_command(self) -> None:
        """The sequencer proposes the state machine's periodic system command (time enters
        the state machine only as data; one proposer keeps it to one command a period)."""
        now = self._clock()
        if self._system_command is None or now < self._system_due:
            return
        self._system_due = now + self.config.system_every_ms / 1000
        agreement = self.clock_agreement
        if agreement is not None:  # followers may replace a sequencer whose clock is off
            self.replica.judge_clocks(agreement.agrees(),
                                      agreement.is_off(self.replica.inspect.sequencer))
        if not self.replica.inspect.is_sequencer:
            return
        if agreement is not None and not agreement.may_tick(self.replica.config.replica_id):
            self.metrics.count("driver.system_commands_withheld")
            return
        now_ms = self.stamp_clock.now_ms()
        envelope = Envelope(principal=SYSTEM_PRINCIPAL, session="", sequence=0, now_ms=now_ms,
                            body=self._system_command(now_ms))
        try:
            self.replica.propose(encode_envelope(envelope))
            self.metrics.count("driver.system_commands")
        except ProposalDropped:
            self.metrics.count("driver.system_commands_dropped")

    def _take(self, item: tuple[Any, ...]) -> None:
        """A peer's frame or a read (a proposal is taken in `_next_inputs`)."""
        kind = item[0]
        if kind == "frame":
            self.metrics.count("driver.frames_received")
            self.replica.receive(item[2], item[1])
        elif kind == "read":
            self._client_inputs -= 1
            self._read_ids += 1
            self._reads[self._read_ids] = (item[1], item[2])
            self._read_deadlines.push(item[2].deadline, self._read_ids)
            self.replica.read(self._read_ids)

    def _expire_callbacks(self) -> None:
        """Fail the callbacks whose deadline passed: the commands', then the reads', each
        kind earliest first."""
        now = self._clock()
        for tag in self._proposal_deadlines.due(now):
            waiter = self._proposals.pop(tag, None)
            if waiter is not None:
                self._budget.deadline_passed(tag)
                waiter.fail(OutcomeUnknown("no result in time; the command may still be "
                                           "applied"))
        for read_id in self._read_deadlines.due(now):
            if (read := self._reads.pop(read_id, None)) is not None:
                self.replica.cancel_read(read_id)  # or the core keeps asking for it
                read[1].fail(OutcomeUnknown("no read index in time (no sequencer lease?)"))

    def _take_proposal(self, command: bytes, waiter: _Callback, reserved: bool,
                       released: Callable[[], None] | None) -> int:
        """1 if the core took `command` (counted by the caller, once per batch), else 0 (its
        waiter has the refusal)."""
        try:
            if not reserved and self.replica.pending_proposals >= self._core_queue_shared:
                raise ProposalDropped(f"{self.replica.pending_proposals} proposals already "
                                      f"queued; the rest of the queue is for node agents")
            tag = self.replica.propose(command)
        except ProposalDropped as error:
            self.metrics.count("driver.proposals_dropped")
            self._budget.refund(len(command))
            if released is not None:
                released()
            waiter.fail(Overloaded(str(error)))
            return 0
        self._budget.hold(tag, len(command), released)
        self._proposals[tag] = waiter
        self._proposal_deadlines.push(waiter.deadline, tag)
        return 1

    # --- one Ready ----------------------------------------------------------------------------

    async def _handle(self, ready: Ready) -> None:
        # Executed commands and reads are chosen whatever this replica persists, so when a
        # caller here awaits one, the results leave first: the client's answer is then not
        # queued behind the peers'. When none does (a replica executing its peers' commands),
        # its acknowledgements leave first, and the apply runs while they travel.
        awaited = self._awaited_here(ready)
        answered = False
        if awaited:
            waiting = len(self._proposals) + len(self._reads)
            self._install_and_apply(ready)
            answered = len(self._proposals) + len(self._reads) < waiting  # each pops its own
        self._send_messages(ready.messages)
        if ready.records:
            started = self._clock()
            await self._persist_records(ready, answered)
            self.metrics.observe("storage_persist_seconds", self._clock() - started)
            self.metrics.count("storage.records", len(ready.records))
            if ready.must_sync:
                self.metrics.count("storage.syncs")
        self._send_messages(ready.messages_after_persist)
        if not awaited:
            self._install_and_apply(ready)
        self._maybe_compact()  # before advance, which may execute what is not applied yet
        self.replica.advance()

    def _awaited_here(self, ready: Ready) -> bool:
        """Whether applying `ready` answers someone here: an own command, a read, or a
        snapshot (which may cover own commands in flight)."""
        if ready.snapshot_to_install is not None or ready.reads or ready.reads_refused:
            return True
        if not (self._proposals or self._budget):  # no own command waits, nor holds bytes
            return False
        if ready.covered:
            return True
        me = self.replica.config.replica_id
        return any(command.origin == me for item in ready.executed for command in item.commands)

    async def _persist_records(self, ready: Ready, answered: bool) -> None:
        """Append and sync `ready.records`: in the worker thread under load or when the sync
        is long (a compaction, zeros written ahead), else right here. Only the task running
        the turn touches the store, and it waits for the thread, so the store is never used by
        two threads at once. Its awaits are shielded: a turn on a reader's task (module
        docstring) ends whole even when that reader is cancelled."""
        snapshot = holds_snapshot(ready.records)
        if snapshot or (self.config.persist_in_thread and self._inputs_last_turn > 1):
            # The loop goes on reading, decrypting and queueing inputs while the disk syncs;
            # they join the next Ready (group commit). A snapshot record (the whole state,
            # up to a GiB: encoded, checksummed and written for a second or more) is never
            # written on the loop, which would leave peers and clients unserved past a lease.
            if snapshot:
                self.metrics.count("driver.snapshots_in_thread")
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._persist, ready.records, ready.must_sync)
            return
        if ready.must_sync and (ready.messages or answered):
            # Let the writers send what may leave before the sync blocks the loop. With
            # nothing queued, no yield: it would only let other tasks run first.
            with anyio.CancelScope(shield=True):
                await anyio.lowlevel.checkpoint()
        self._store.append(ready.records)
        if not ready.must_sync:
            return
        if self._store.sync_is_long:  # milliseconds or more: never on the loop
            self.metrics.count("driver.long_syncs_in_thread")
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._store.sync)
        else:
            self._store.sync()

    def _install_and_apply(self, ready: Ready) -> None:
        if ready.snapshot_to_install is not None:
            self._machine.restore(ready.snapshot_to_install.state)
            self._last_snapshot = ready.snapshot_to_install.meta.slot
            self._last_snapshot_bytes = self._applied_bytes
            self.metrics.count("driver.snapshots_installed")
        for tag in ready.covered:  # applied in the snapshot: the session's cache has the result
            self._budget.release(tag)
            waiter = self._proposals.pop(tag, None)
            if waiter is not None:
                self.metrics.count("driver.commands_covered_by_snapshot")
                waiter.fail(OutcomeUnknown(
                    "the command took effect in a snapshot from a peer; its result is not "
                    "here: ask again in the same session"))
        if ready.snapshot_to_install is not None:  # own commands in flight may be forgotten
            self._budget.forget_after_snapshot(self._proposals.__contains__)
        self._apply(ready)
        if self._machine_slots != self.replica.executed_slots:  # the core runs only in ready()
            self._machine_slots = self.replica.executed_slots
            self._applied.set()
            self._applied = anyio.Event()

    def _persist(self, records: list[Record], must_sync: bool) -> None:
        self._store.append(records)
        if must_sync:
            self._store.sync()

    def _send_messages(self, messages: list[tuple[int, Message]]) -> None:
        if not messages:  # twice a Ready, and one of the two is mostly empty
            return
        by_peer: dict[int, list[Message]] = {}
        for peer, message in messages:
            if peer in by_peer:
                by_peer[peer].append(message)
            else:
                by_peer[peer] = [message]
        sent = 0
        for peer in sorted(by_peer) if len(by_peer) > 1 else by_peer:
            for frame in frames_of(by_peer[peer], self.config.frame_bytes_max):
                if not self._send(peer, frame):
                    self.metrics.count("driver.frames_dropped_send_queue")
                sent += 1
        self.metrics.count("driver.frames_sent", sent)

    def _apply(self, ready: Ready) -> None:
        if ready.executed:
            self._apply_commands(ready)
        for read_id in ready.reads:
            read = self._reads.pop(read_id, None)  # None: its callback expired
            if read is not None:
                try:
                    result = self._query(read[0])
                except QueryFailed as error:
                    read[1].fail(error)
                else:
                    read[1].resolve(result)
        for read_id in ready.reads_refused:
            read = self._reads.pop(read_id, None)
            if read is not None:
                read[1].fail(Overloaded("too many reads pending"))
        self.metrics.count("driver.readied", len(ready.readied))

    def _apply_commands(self, ready: Ready) -> None:
        """Apply `ready`'s executed commands, and answer those proposed here, each once it is
        applied. Their latencies go into the histogram once per Ready
        (`Metrics.observe_many`), each read as it is answered."""
        apply, clock = self._machine.apply, self._clock
        me = self.replica.config.replica_id
        release, proposals = self._budget.release, self._proposals
        latencies: list[float] = []
        applied = applied_bytes = 0
        for item in ready.executed:
            commands = item.commands
            applied += len(commands)
            for command in commands:
                payload = command.payload
                applied_bytes += len(payload)
                reply = apply(payload)
                if command.origin == me:
                    tag = command.tag
                    release(tag)
                    waiter = proposals.pop(tag, None)
                    if waiter is not None:
                        latencies.append(clock() - waiter.started)
                        waiter.done(reply, None)  # `resolve`, with a call less
        if latencies:
            self.metrics.observe_many("command_latency_seconds", latencies)
        self.metrics.count("driver.commands_applied", applied)
        self._applied_bytes += applied_bytes

    def _query(self, query: bytes) -> bytes:
        """The machine's answer to `query`; QueryFailed (logged, counted) if it raises, which
        would otherwise end this driver's loop, and the replica, for one client's read."""
        try:
            return self._machine.query(query)
        except Exception as error:
            self.metrics.count("driver.queries_failed")
            logger.exception("replica %d: the state machine raised on a query of %d bytes",
                             self.replica.config.replica_id, len(query))
            raise QueryFailed(f"the state machine could not answer the query: "
                              f"{type(error).__name__}: {error}") from error

    def _maybe_compact(self) -> None:
        if self._snapshot_due() and self.replica.may_compact:
            executed = self.replica.executed_slots
            config = self.replica.config
            state = self._machine.snapshot()
            # too large: tried again a period later
            self._last_snapshot, self._last_snapshot_bytes = executed, self._applied_bytes
            limit = min(SNAPSHOT_STATE_BYTES_MAX, snapshot_state_bytes_max(config))
            if len(state) > limit:  # peers would refuse it too; the log goes on growing
                self.metrics.count("driver.snapshots_too_large")
                logger.error("replica %d: a snapshot of %d bytes is more than %d; the log is "
                             "not compacted (make the state machine hold less)",
                             self.replica.config.replica_id, len(state), limit)
                return
            self.replica.compact(state, executed)
            self.metrics.count("driver.snapshots_taken")

    def _snapshot_due(self) -> bool:
        """Whether a period of slots or of command bytes ended since the last snapshot."""
        config, core = self.config, self.replica.config
        return snapshot_due(self.replica.executed_slots, self._last_snapshot,
                            config.snapshot_every_slots, core.replica_id, core.replica_count) \
            or snapshot_due(self._applied_bytes, self._last_snapshot_bytes,
                            config.snapshot_every_bytes, core.replica_id, core.replica_count)

    def _fail_all(self, error: Exception) -> None:
        for waiter in self._proposals.values():
            waiter.fail(error)
        for _, waiter in self._reads.values():
            waiter.fail(error)
        self._proposals.clear()
        self._reads.clear()


def snapshot_due(executed: int, last_snapshot: int, period: int, replica_id: int,
                 replica_count: int) -> bool:
    """Whether a replica that took its last snapshot at `last_snapshot` slots (or command
    bytes) takes one at `executed`: once it passes a boundary of its period. Each replica's
    boundaries are shifted by its share of the period (replica i of n at i/n of it), so the
    replicas take their snapshots one at a time, not all at the same slot: each is the whole
    state encoded and written (a second at 150 MB on the busy 2-core VM), three at once
    slowed one another on the shared cores and stalled every client together."""
    shift = period * replica_id // replica_count
    return (executed + shift) // period > (last_snapshot + shift) // period
