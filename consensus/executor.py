"""Execution: commands leave the core strictly in slot order, each exactly once, with no gaps.

Slot j runs once O(j) is committed and, when O(j) names replica n, once C(n, k) is committed,
where k counts the C-instances of n executed so far (the positional mapping: the k-th slot for
n runs n's k-th C-instance). NO_CL slots are skipped. A stall has two causes, an O-instance not
yet committed or a C-instance not yet committed; `stalled_on` says which, for repair and
recovery.

In the Multi-Paxos baseline a replica may forward a command again after a view change, so the
executor drops any (origin, tag) it already ran; the window of remembered tags is part of the
snapshot so every replica drops the same ones.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from consensus.config import Mode
from consensus.context import Context
from consensus.messages import NO_CL, Batch, SnapshotMeta
from consensus.ready import Executed


@dataclass(frozen=True, slots=True)
class Stall:
    slot: int
    space: int  # NO_CL when the O-instance itself is missing or uncommitted
    index: int


class Executor:
    __slots__ = ("_ctx", "_dedup_heaps", "_dedup_low", "_dedup_tags", "_deduplicating",
                 "dropped_tags", "exec_counts", "exec_slot", "executed_tags", "stalled_since")

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self.exec_slot = 0
        self.exec_counts = [0] * ctx.replica_count
        self._dedup_low = [0] * ctx.replica_count
        self._dedup_tags: list[set[int]] = [set() for _ in range(ctx.replica_count)]
        self._dedup_heaps: list[list[int]] = [[] for _ in range(ctx.replica_count)]
        self._deduplicating = ctx.config.mode is Mode.MULTIPAXOS
        self.stalled_since = 0  # tick at which execution last advanced
        self.executed_tags: list[int] = []  # own tags executed in this step (for the leader)
        self.dropped_tags: list[int] = []  # own tags dropped as repeats in this step (likewise)

    def run(self) -> None:
        """Execute every slot that can run now."""
        ctx = self._ctx
        o_slots, spaces, executed = ctx.olog.slots, ctx.clog.spaces, ctx.outbox.pending.executed
        exec_counts, slot = self.exec_counts, self.exec_slot
        while True:
            entry = o_slots.get(slot)
            if entry is None or not entry.committed:
                break
            space = entry.value
            if space != NO_CL:
                index = exec_counts[space]
                c_slot = spaces[space].slots.get(index)
                if c_slot is None or not c_slot.committed:
                    break
                commands = self._deduplicated(c_slot.batch) if self._deduplicating \
                    else c_slot.batch
                executed.append(Executed(slot, space, index, commands))
                exec_counts[space] = index + 1
            slot += 1
        if slot != self.exec_slot:
            self.exec_slot = slot
            self.stalled_since = ctx.now

    def _deduplicated(self, batch: Batch) -> Batch:
        """Multi-Paxos (`run` calls it only then): the batch less the commands already run."""
        if not batch:
            return batch
        window = self._ctx.config.dedup_window_per_origin
        kept = []
        for command in batch:
            origin, tag = command.origin, command.tag
            tags = self._dedup_tags[origin]
            if tag < self._dedup_low[origin] or tag in tags:
                self._ctx.count("executor.duplicate_dropped")
                if origin == self._ctx.id:
                    self.dropped_tags.append(tag)
                continue
            tags.add(tag)
            heapq.heappush(self._dedup_heaps[origin], tag)
            if len(tags) > window:
                lowest = heapq.heappop(self._dedup_heaps[origin])
                tags.discard(lowest)
                self._dedup_low[origin] = lowest + 1
            if origin == self._ctx.id:
                self.executed_tags.append(tag)
            kept.append(command)
        return tuple(kept) if len(kept) != len(batch) else batch

    def highest_tag_seen(self, origin: int) -> int:
        """The highest tag of `origin` the dedup window holds or passed (-1: none); a new
        command of that origin below it would be dropped as a repeat."""
        tags = self._dedup_tags[origin]
        return max(self._dedup_low[origin] - 1, max(tags, default=-1))

    def ran(self, origin: int, tag: int) -> bool:
        """Whether (origin, tag) is known executed (Multi-Paxos: inside the dedup window)."""
        return tag in self._dedup_tags[origin]

    def repeat(self, origin: int, tag: int) -> bool:
        """Whether (origin, tag) would be dropped as a repeat (Multi-Paxos): it ran, or its
        tag is below the dedup window, where whether it ran is not known."""
        return tag < self._dedup_low[origin] or self.ran(origin, tag)

    def runnable(self) -> bool:
        """Whether the next slot can execute now."""
        entry = self._ctx.olog.slots.get(self.exec_slot)
        if entry is None or not entry.committed:
            return False
        return entry.value == NO_CL or self._ctx.clog[entry.value].is_committed(
            self.exec_counts[entry.value])

    def stall(self) -> Stall | None:
        """What the next slot waits for, or None when nothing is known to wait."""
        ctx = self._ctx
        entry = ctx.olog.slots.get(self.exec_slot)
        if entry is None or not entry.committed:
            if ctx.olog.end > self.exec_slot:
                return Stall(self.exec_slot, NO_CL, 0)
            return None
        if entry.value == NO_CL:
            return None
        index = self.exec_counts[entry.value]
        if ctx.clog[entry.value].is_committed(index):
            return None  # runs at the next ready()
        return Stall(self.exec_slot, entry.value, index)

    def snapshot_meta(self) -> SnapshotMeta:
        olog = self._ctx.olog
        counts = tuple(olog.count(replica, self.exec_slot)
                       for replica in range(self._ctx.replica_count))
        return SnapshotMeta(
            slot=self.exec_slot,
            exec_counts=tuple(self.exec_counts),
            o_counts=counts,
            dedup_low=tuple(self._dedup_low),
            dedup_tags=tuple(tuple(sorted(tags)) for tags in self._dedup_tags),
        )

    def reset_to(self, meta: SnapshotMeta) -> None:
        self.exec_slot = meta.slot
        self.exec_counts = list(meta.exec_counts)
        self._dedup_low = list(meta.dedup_low)
        self._dedup_tags = [set(tags) for tags in meta.dedup_tags]
        self._dedup_heaps = [sorted(tags) for tags in meta.dedup_tags]
        self.stalled_since = self._ctx.now
