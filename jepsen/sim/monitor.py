"""Safety checks, run as the simulation goes, on everything the replicas execute.

- O-agreement: every replica executes the same replica id (or NO_CL) at each slot.
- C-agreement: every replica executes the same batch for each C-instance (n, k).
- Executed prefixes agree: slot j runs the same C-instance everywhere, slots strictly increase.
- Positional mapping: the slot that runs C(n, k) is the (k+1)-th slot for n, counted afresh
  from the replica's own O-log.
- Exactly once: no C-instance and no command tag runs twice in one replica's lifetime, and no
  command runs at two slots anywhere (a replica that ran it, installed a snapshot or
  restarted, and ran it again at a later slot applied it twice to its state).
- Equal state digests at equal executed prefixes.
- Ready commands keep their position: a command reported ready runs with the batch it was
  ready with, and every sequencer that establishes a view has at least k+1 slots for n in its
  log for every ready C(n, k) (invariant 8 of the reference).
- Ready order (invariant 7, the paper's linearizability): if command a was ready before
  command b was proposed, a runs before b. This is what the de-duplication guard and the
  5-replica prefix condition protect; clients answered only after execution would not see it.
A violation is recorded with the time and the details; the run reports them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from consensus.messages import NO_CL, Batch, SnapshotMeta
from consensus.ready import Executed
from consensus.replica import Inspection


@dataclass(frozen=True, slots=True)
class Violation:
    at_us: int
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.at_us} us] {self.invariant}: {self.detail}"


class _ReplicaCursor:
    __slots__ = ("counts", "executed", "slot", "tags")

    def __init__(self, slot: int, counts: list[int]) -> None:
        self.slot = slot  # next slot to account for
        self.counts = counts  # per replica id: slots for it in [0, slot)
        self.executed: set[tuple[int, int]] = set()
        self.tags: set[tuple[int, int]] = set()


class SafetyMonitor:
    def __init__(self, replica_count: int) -> None:
        self._replica_count = replica_count
        self._slot_values: dict[int, int] = {}
        self._slot_instances: dict[int, tuple[int, int]] = {}
        self._instances: dict[tuple[int, int], Batch] = {}
        self._digests: dict[int, bytes] = {}
        self._ready: dict[tuple[int, int], Batch] = {}
        self._max_ready = [-1] * replica_count
        self._cursors: dict[int, _ReplicaCursor] = {}
        self._proposed_us: dict[tuple[int, int], int] = {}
        self._ready_us: dict[tuple[int, int], int] = {}
        self._command_slots: dict[tuple[int, int], int] = {}
        self.violations: list[Violation] = []
        self.now_us = 0

    def _violate(self, invariant: str, detail: str) -> None:
        self.violations.append(Violation(self.now_us, invariant, detail))

    def started(self, replica: int, inspection: Inspection) -> None:
        """A replica (re)started: its execution restarts at its snapshot."""
        base = inspection.log_base
        counts = [inspection.o_count(space, base) for space in range(self._replica_count)]
        self._cursors[replica] = _ReplicaCursor(base, counts)

    def installed(self, replica: int, meta: SnapshotMeta) -> None:
        """A replica's state machine took a snapshot's state: its execution goes on from the
        snapshot's slot. (Not the replica's log base now: the core may have installed a newer
        snapshot since it handed out this one, while the driver persisted.)"""
        self._cursors[replica] = _ReplicaCursor(meta.slot, list(meta.o_counts))

    def executed(self, replica: int, inspection: Inspection, item: Executed) -> None:
        cursor = self._cursors[replica]
        if item.slot < cursor.slot:
            self._violate("executed prefixes", f"replica {replica} ran slot {item.slot} "
                          f"after slot {cursor.slot - 1}")
            return
        for slot in range(cursor.slot, item.slot):
            value = inspection.committed_o(slot)
            if value != NO_CL:
                self._violate("no gaps", f"replica {replica} skipped slot {slot} holding "
                              f"{value}")
            self._agree_on_slot(replica, slot, NO_CL)
        self._agree_on_slot(replica, item.slot, item.space)
        self._check_instance(replica, inspection, cursor, item)
        cursor.counts[item.space] += 1
        cursor.slot = item.slot + 1

    def _agree_on_slot(self, replica: int, slot: int, value: int) -> None:
        known = self._slot_values.setdefault(slot, value)
        if known != value:
            self._violate("O-agreement", f"slot {slot}: replica {replica} ran {value}, "
                          f"another ran {known}")

    def _check_instance(self, replica: int, inspection: Inspection, cursor: _ReplicaCursor,
                        item: Executed) -> None:
        instance = (item.space, item.index)
        if cursor.counts[item.space] != item.index:
            self._violate("positional mapping", f"replica {replica} ran C{instance} at slot "
                          f"{item.slot}, the slot for C({item.space}, "
                          f"{cursor.counts[item.space]})")
        known_instance = self._slot_instances.setdefault(item.slot, instance)
        if known_instance != instance:
            self._violate("executed prefixes", f"slot {item.slot}: C{instance} at replica "
                          f"{replica}, C{known_instance} elsewhere")
        if instance in cursor.executed:
            self._violate("exactly once", f"replica {replica} ran C{instance} twice")
        cursor.executed.add(instance)
        for command in item.commands:
            key = (command.origin, command.tag)
            first_slot = self._command_slots.setdefault(key, item.slot)
            if key in cursor.tags:
                self._violate("exactly once", f"replica {replica} ran command "
                              f"{command.origin}/{command.tag} twice")
            elif first_slot != item.slot:
                self._violate("exactly once", f"replica {replica} ran command "
                              f"{command.origin}/{command.tag} at slot {item.slot}, which "
                              f"ran at slot {first_slot}")
            cursor.tags.add(key)
        committed = inspection.committed_c(item.space, item.index)
        known_batch = self._instances.setdefault(instance, item.commands)
        if known_batch != item.commands:
            self._violate("C-agreement", f"C{instance} ran different batches")
        ready = self._ready.get(instance)
        if ready is not None and committed is not None and ready != committed:
            self._violate("ready position", f"C{instance} was ready with another batch")

    def digest(self, replica: int, executed_slots: int, digest: bytes) -> None:
        known = self._digests.setdefault(executed_slots, digest)
        if known != digest:
            self._violate("state digests", f"replica {replica} after {executed_slots} slots "
                          f"has digest {digest.hex()}, another {known.hex()}")

    def ready(self, replica: int, inspection: Inspection, index: int) -> None:
        batch = inspection.committed_c(replica, index)
        if batch is None and inspection.exec_count(replica) > index:
            batch = self._instances.get((replica, index))  # already run and truncated
        if batch is None:
            self._violate("ready position", f"C({replica}, {index}) ready but not committed")
            return
        self._ready[(replica, index)] = batch
        self._max_ready[replica] = max(self._max_ready[replica], index)

    def view_log_built(self, replica: int, inspection: Inspection) -> None:
        """A new sequencer's O-log (just rebuilt from a majority's votes) must give each
        replica a slot for every C-instance of its that was ready."""
        end = inspection.log_end
        for space, highest in enumerate(self._max_ready):
            if highest < 0:
                continue
            count = inspection.o_count(space, end)
            if count < highest + 1:
                self._violate("ready position", f"view {inspection.view} at replica "
                              f"{replica} has {count} slots for {space}, but C({space}, "
                              f"{highest}) was ready")

    def ready_instances(self) -> dict[tuple[int, int], Batch]:
        return self._ready

    def proposed(self, origin: int, tag: int) -> None:
        self._proposed_us[(origin, tag)] = self.now_us

    def readied(self, origin: int, tag: int) -> None:
        self._ready_us.setdefault((origin, tag), self.now_us)

    def check_ready_order(self) -> None:
        """Invariant 7: walking the executed commands in slot order, no command may have been
        ready before a command that runs ahead of it was even proposed."""
        latest_proposal, latest_key = -1, (0, 0)
        for slot, key in sorted((slot, key) for key, slot in self._command_slots.items()):
            ready = self._ready_us.get(key)
            if ready is not None and ready < latest_proposal:
                self._violate("ready order", f"command {key} at slot {slot} was ready at "
                              f"{ready} us, before command {latest_key} that runs ahead of "
                              f"it was proposed at {latest_proposal} us")
                return
            proposed = self._proposed_us.get(key, -1)
            if proposed > latest_proposal:
                latest_proposal, latest_key = proposed, key
