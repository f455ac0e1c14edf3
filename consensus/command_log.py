"""C-instances: one space per command leader, each run as Multi-Paxos over its indexes.

Replica n proposes its clients' commands in its own space at its round-0 ballot (phase 1 is
taken as done, as the paper assumes). Another replica recovers a silent leader's space with a
higher ballot (phase 1 over the space, then phase 2 with the highest-ballot value or a no-op),
and the leader takes its space back the same way. A ballot packs (round, replica).

Invariants: a committed batch never changes (asserted); `promised` never decreases.
"""

from __future__ import annotations

from collections.abc import Iterator

from consensus.config import BALLOT_REPLICAS
from consensus.messages import NO_INDEX, Batch, CEntry


def initial_ballot(owner: int) -> int:
    return owner


def next_ballot(above: int, replica: int) -> int:
    """The lowest ballot of `replica` greater than `above`."""
    return (above // BALLOT_REPLICAS + 1) * BALLOT_REPLICAS + replica


def ballot_owner(ballot: int) -> int:
    return ballot % BALLOT_REPLICAS


class CSlot:
    __slots__ = ("ballot", "batch", "committed", "durable")

    def __init__(self, ballot: int, batch: Batch, *, committed: bool) -> None:
        self.ballot = ballot
        self.batch = batch
        self.committed = committed
        self.durable = False  # this replica's acceptance is on disk


class Space:
    __slots__ = ("base", "max_index", "owner", "promised", "slots")

    def __init__(self, owner: int) -> None:
        self.owner = owner
        self.promised = initial_ballot(owner)
        self.slots: dict[int, CSlot] = {}
        self.base = 0  # indexes below were executed and folded into a snapshot
        self.max_index = NO_INDEX  # highest index accepted or learned here

    def get(self, index: int) -> CSlot | None:
        return self.slots.get(index)

    def is_committed(self, index: int) -> bool:
        if index < self.base:
            return True
        slot = self.slots.get(index)
        return slot is not None and slot.committed

    def promise(self, ballot: int) -> bool:
        """Phase 1: promise `ballot` for the whole space; False if a higher one was promised."""
        if ballot < self.promised:
            return False
        self.promised = ballot
        return True

    def accept(self, index: int, ballot: int, batch: Batch) -> bool:
        """Phase 2: accept unless a higher ballot was promised. Re-accepting the same
        (ballot, batch) is allowed, so resent accepts are acknowledged again."""
        if ballot < self.promised or index < self.base:
            return False
        self.promised = ballot
        slot = self.slots.get(index)
        if slot is None:
            self.slots[index] = CSlot(ballot, batch, committed=False)
        elif slot.committed:
            assert slot.batch == batch, f"C-agreement: ({self.owner}, {index}) re-proposed"
            return True
        elif slot.ballot != ballot or slot.batch != batch:
            slot.ballot, slot.batch, slot.durable = ballot, batch, False
        self.max_index = max(self.max_index, index)
        return True

    def restore_accepted(self, index: int, ballot: int, batch: Batch) -> None:
        """Replay an acceptance from disk. It was valid when made, whatever was promised
        since (compaction moves promises ahead of it), so no promise check here."""
        if index < self.base:
            return
        slot = self.slots.get(index)
        if slot is None:
            slot = self.slots[index] = CSlot(ballot, batch, committed=False)
        elif not slot.committed and ballot >= slot.ballot:
            slot.ballot, slot.batch = ballot, batch
        slot.durable = True
        self.promised = max(self.promised, ballot)
        self.max_index = max(self.max_index, index)

    def commit(self, index: int, ballot: int, batch: Batch | None) -> bool | None:
        """Learn that (index) is chosen at ballot. True: news; False: already known;
        None: the batch is needed but this replica holds no value at that ballot."""
        if index < self.base:
            return False
        slot = self.slots.get(index)
        if slot is not None and slot.committed:
            assert batch is None or slot.batch == batch, (
                f"C-agreement violated at ({self.owner}, {index})")
            return False
        if batch is None:
            if slot is None or slot.ballot != ballot:
                return None
            batch = slot.batch
        if slot is None:
            self.slots[index] = CSlot(ballot, batch, committed=True)
        else:
            slot.ballot, slot.batch, slot.committed = ballot, batch, True
        self.max_index = max(self.max_index, index)
        # A majority promised `ballot` to choose this: so may this acceptor, which then
        # refuses an older round's accept (a leader's late resend, a recoverer that lost)
        # instead of meeting a second value for a chosen instance.
        self.promised = max(self.promised, ballot)
        return True

    def entries_from(self, start: int, limit: int) -> Iterator[CEntry]:
        for index in sorted(index for index in self.slots if index >= start)[:limit]:
            slot = self.slots[index]
            yield CEntry(index, slot.ballot, slot.batch, slot.committed)

    def truncate(self, new_base: int) -> None:
        for index in range(self.base, new_base):
            self.slots.pop(index, None)
        self.base = max(self.base, new_base)
        self.max_index = max(self.max_index, new_base - 1)


class CommandLog:
    __slots__ = ("spaces",)

    def __init__(self, replica_count: int) -> None:
        self.spaces = [Space(owner) for owner in range(replica_count)]

    def __getitem__(self, space: int) -> Space:
        return self.spaces[space]

    def max_indexes(self) -> tuple[int, ...]:
        return tuple(space.max_index for space in self.spaces)
