"""The O-log: O-instances, the global slots the sequencer assigns by proposing replica ids.

Slot j holds a replica id n (the k-th slot for n orders n's k-th C-instance: the positional
mapping) or NO_CL (a hole the view change filled; execution skips it). Each slot remembers the
view it was accepted in and whether it is known to be committed; a committed value never
changes (asserted). Slots below `base` were executed and folded into a snapshot; `count_base`
keeps how many of them each replica had, so counts stay exact after truncation.

Invariant: base <= commit_prefix, and every slot in [base, commit_prefix) is committed.

`installed_view` and `installed_end` are the newest view whose rebuilt log was installed here
and that log's end. Past that end no value accepted in an older view can be chosen: the view's
voters, a majority, would have reported it to its rebuild. A replica forgets its own such values
when it installs the log (`install`), and a later rebuild ignores those other voters still hold
(`consensus/view_change.py`), which may not have installed it.
"""

from __future__ import annotations

from collections.abc import Iterator

from consensus.messages import NO_CL, OEntry


class OSlot:
    __slots__ = ("committed", "durable", "value", "view")

    def __init__(self, value: int, view: int, *, committed: bool, durable: bool) -> None:
        self.value = value
        self.view = view
        self.committed = committed
        self.durable = durable  # this replica's acceptance is on disk


class OrderLog:
    __slots__ = ("_accepted_prefix", "_accepted_prefix_view", "base", "commit_prefix",
                 "count_base", "end", "installed_end", "installed_view", "slots")

    def __init__(self, replica_count: int) -> None:
        self.slots: dict[int, OSlot] = {}
        self.base = 0
        self.commit_prefix = 0
        self.count_base = [0] * replica_count
        self.end = 0  # one past the highest slot known here
        self._accepted_prefix = 0
        self._accepted_prefix_view = 0
        self.installed_view = 0  # view 0 starts with the empty log, ended at slot 0
        self.installed_end = 0

    def get(self, slot: int) -> OSlot | None:
        return self.slots.get(slot)

    def value(self, slot: int) -> int | None:
        entry = self.slots.get(slot)
        return None if entry is None else entry.value

    def values(self, start: int, end: int) -> tuple[int, ...]:
        """The values of slots [start, end), every one held here."""
        slots = self.slots
        return tuple([slots[slot].value for slot in range(start, end)])

    def accept(self, slot: int, value: int, view: int) -> bool:
        """Accept value for slot in view; False when the slot already holds it in a view at
        least as new, or is committed (then the value must agree)."""
        if slot < self.base:
            return False
        entry = self.slots.get(slot)
        if entry is None:
            self.slots[slot] = OSlot(value, view, committed=False, durable=False)
            self.end = max(self.end, slot + 1)
            return True
        if entry.committed:
            assert entry.value == value, (
                f"O-agreement: slot {slot} committed to {entry.value}, offered {value}")
            return False
        if entry.view >= view and entry.value == value:
            return False
        entry.value, entry.view, entry.durable = value, view, False
        return True

    def install(self, view: int, start: int, values: tuple[int, ...]) -> int:
        """Accept view `view`'s rebuilt log (`values` from `start`) and forget the uncommitted
        values of older views past its end; returns that end. Slots past it known committed
        stay: the view committed them before its log reached here."""
        end = start + len(values)
        for offset, value in enumerate(values):
            self.accept(start + offset, value, view)
        stale = [slot for slot, entry in self.slots.items()
                 if slot >= end and not entry.committed and entry.view < view]
        for slot in stale:
            del self.slots[slot]
        self.end = max([end, self.base, *(slot + 1 for slot in self.slots if slot >= end)])
        if view >= self.installed_view:
            self.installed_view, self.installed_end = view, end
        return end

    def conflicts(self, start: int, values: tuple[int, ...]) -> bool:
        """Whether an offer for slots from `start` differs from a value known committed. Such
        an offer comes from a view older than the one that chose the slot."""
        for offset, value in enumerate(values):
            entry = self.slots.get(start + offset)
            if entry is not None and entry.committed and entry.value != value:
                return True
        return False

    def mark_durable(self, start: int, end: int, view: int) -> None:
        for slot in range(max(start, self.base), end):
            entry = self.slots.get(slot)
            if entry is not None and entry.view == view:
                entry.durable = True

    def commit(self, slot: int, value: int) -> bool:
        """Record that slot is chosen with value; True when this is news."""
        if slot < self.base:
            return False
        entry = self.slots.get(slot)
        if entry is None:
            self.slots[slot] = OSlot(value, -1, committed=True, durable=False)
            self.end = max(self.end, slot + 1)
        elif entry.committed:
            assert entry.value == value, (
                f"O-agreement violated: slot {slot} committed to {entry.value} and {value}")
            return False
        else:
            entry.value, entry.committed = value, True
        self._advance_commit_prefix()
        return True

    def _advance_commit_prefix(self) -> None:
        prefix = self.commit_prefix
        slots = self.slots
        while True:
            entry = slots.get(prefix)
            if entry is None or not entry.committed:
                break
            prefix += 1
        self.commit_prefix = prefix

    def accepted_prefix(self, view: int) -> int:
        """Slots [base, result) are all committed, or accepted durably here in `view`."""
        if view != self._accepted_prefix_view:
            self._accepted_prefix_view = view
            self._accepted_prefix = self.commit_prefix
        prefix = max(self._accepted_prefix, self.commit_prefix)
        slots = self.slots
        while True:
            entry = slots.get(prefix)
            if entry is None or not (entry.committed or (entry.view == view and entry.durable)):
                break
            prefix += 1
        self._accepted_prefix = prefix
        return prefix

    def held(self, start: int, end: int) -> list[int]:
        """The slots in [start, end) held here, in order: a range a peer names may be far wider
        than this log (a peer's commit can name any slot), so it costs at most the slots held."""
        if end - start <= len(self.slots):
            return [slot for slot in range(start, end) if slot in self.slots]
        return sorted(slot for slot in self.slots if start <= slot < end)

    def entries_from(self, start: int) -> Iterator[OEntry]:
        """Every slot known here from `start` on, in slot order (for votes). A slot known only
        as committed (an O-commit or catch-up for a slot never accepted here) has no view, -1,
        which no message may carry (the codec dropped such a vote's whole frame, and a
        candidate that needed it never won): it is reported in view 0, which changes no
        rebuild (a committed entry wins whatever its view, and installed views are >= 0)."""
        for slot in sorted(slot for slot in self.slots if slot >= start):
            entry = self.slots[slot]
            yield OEntry(slot, entry.value, max(entry.view, 0), entry.committed)

    def count(self, replica: int, end: int) -> int:
        """How many slots in [0, end) hold `replica`; every slot below end must be known."""
        total = self.count_base[replica]
        for slot in range(self.base, end):
            entry = self.slots.get(slot)
            assert entry is not None, f"counting over unknown slot {slot}"
            if entry.value == replica:
                total += 1
        return total

    def truncate(self, new_base: int) -> None:
        """Drop slots below new_base (executed, folded into a snapshot)."""
        assert new_base <= self.commit_prefix, "only committed slots are truncated"
        for slot in range(self.base, new_base):
            entry = self.slots.pop(slot)
            if entry.value != NO_CL:
                self.count_base[entry.value] += 1
        self.base = max(self.base, new_base)

    def reset_to_snapshot(self, slot: int, counts: tuple[int, ...]) -> None:
        """Start over at a snapshot taken at `slot` (catch-up from a peer)."""
        for known in [known for known in self.slots if known < slot]:
            del self.slots[known]
        self.base = slot
        self.end = max(self.end, slot)
        self.count_base = list(counts)
        self.commit_prefix = max(self.commit_prefix, slot)
        self._advance_commit_prefix()
        self._accepted_prefix = max(self._accepted_prefix, slot)
