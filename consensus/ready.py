"""`Ready`: the batch of work the core hands its driver, and the order the driver must follow.

The driver (the runtime, the simulator, a golden script) drains `replica.ready()` and then:

1. appends `records` to durable storage, and syncs them when `must_sync` is set;
2. sends `messages` (these may leave before step 1 finishes) and, only once step 1 is done,
   `messages_after_persist` (acknowledgements and proposals that promise what was persisted);
3. if `snapshot_to_install` is set, restores the state machine from it before anything else
   is executed, and tells the clients of the commands in `covered` (tags of this replica's
   commands the snapshot applied where this replica did not: their results are gone with the
   state it replaced) that their command took effect without a result here; with exactly-once
   sessions the client asks again in its session for the result;
4. applies `executed` to the state machine in order, handing each command's result to the
   waiting client when `command.origin` is this replica;
5. runs the reads in `reads` (read ids whose read index is now executed) on the state machine,
   and fails those in `reads_refused`;
6. may call `replica.compact(snapshot, executed_slots)` when `replica.may_compact` says the
   state machine holds exactly what the core executed (not after `advance`, which may
   execute more), once step 1 is done;
7. calls `replica.advance()`: the core then counts its own persisted acceptances (messages it
   addressed to itself after persisting) and may have more work.

Steps 3 to 5 do not wait for steps 1 and 2: what executes is chosen by a majority already,
and a read's index is the sequencer's, so a driver may answer its clients first.

`readied` lists the tags of this replica's commands that became ready in the paper's sense
(their global position is fixed): the latency the paper measures; `readied_instances` the
indexes of the own C-instances they are in. The reply to a client waits
for execution, which also yields the state machine's result.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from consensus.messages import Batch, Message, SnapshotMeta
from consensus.records import Record


@dataclass(frozen=True, slots=True)
class Executed:
    slot: int
    space: int
    index: int
    commands: Batch


@dataclass(frozen=True, slots=True)
class SnapshotInstall:
    meta: SnapshotMeta
    state: bytes


@dataclass(slots=True)
class Ready:
    records: list[Record] = field(default_factory=list)
    must_sync: bool = False
    messages: list[tuple[int, Message]] = field(default_factory=list)
    messages_after_persist: list[tuple[int, Message]] = field(default_factory=list)
    snapshot_to_install: SnapshotInstall | None = None
    covered: list[int] = field(default_factory=list)  # own tags applied inside that snapshot
    executed: list[Executed] = field(default_factory=list)
    readied: list[int] = field(default_factory=list)
    readied_instances: list[int] = field(default_factory=list)  # own C-indexes now ready
    reads: list[int] = field(default_factory=list)
    reads_refused: list[int] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.records or self.messages or self.messages_after_persist
                    or self.snapshot_to_install or self.covered or self.executed
                    or self.readied or self.reads or self.reads_refused)


class Outbox:
    """Accumulates a Ready while the core handles inputs; messages to itself are looped back
    (immediately, or after persistence on `advance`)."""

    __slots__ = ("_loopback_after_persist", "_replica_id", "_waiting_advance", "loopback_now",
                 "pending")

    def __init__(self, replica_id: int) -> None:
        self._replica_id = replica_id
        self.pending = Ready()  # the Ready being accumulated (`drain` hands it out)
        # Messages to itself to handle now; read (not taken) to see whether there are any:
        # the core looks after every input and every Ready, and there seldom are.
        self.loopback_now: list[Message] = []
        self._loopback_after_persist: list[Message] = []
        self._waiting_advance: list[Message] = []

    def persist(self, record: Record) -> None:
        self.pending.records.append(record)
        if record.SYNC:
            self.pending.must_sync = True

    def send(self, to: int, message: Message, *, after_persist: bool = False) -> None:
        if to == self._replica_id:
            queue = self._loopback_after_persist if after_persist else self.loopback_now
            queue.append(message)
        elif after_persist:
            self.pending.messages_after_persist.append((to, message))
        else:
            self.pending.messages.append((to, message))

    def take_loopback_now(self) -> list[Message]:
        taken, self.loopback_now = self.loopback_now, []
        return taken

    def drain(self) -> Ready:
        """Hand the accumulated work out; loopback-after-persist waits for `advance`."""
        ready, self.pending = self.pending, Ready()
        self._waiting_advance.extend(self._loopback_after_persist)
        self._loopback_after_persist = []
        return ready

    def take_persisted_loopback(self) -> list[Message]:
        taken, self._waiting_advance = self._waiting_advance, []
        return taken

    def forget_unpersisted(self) -> None:
        """A crash: nothing that waited for persistence will happen."""
        self._loopback_after_persist.clear()
        self._waiting_advance.clear()
