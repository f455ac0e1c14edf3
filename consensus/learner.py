"""Learning which O-instances are committed, and announcing one's own.

An O-instance is committed once a majority accepted it in one view. A replica counts the
acceptances of every slot it accepted from the sequencer of its view: the sequencer itself
(implicitly: it persisted before sending), its own (once persisted), and the O-ACKs acceptors
send to the sequencer and to the command leaders named in the slots. With 3 replicas the
sequencer and one acceptor are a majority, so acceptance alone commits (one round trip).

Every commit, from counting, from an O-commit message, from a heartbeat's commit prefix, from
catch-up or from an established view, goes through `commit`, which persists it, tells the
command leader about its own slots, and queues the O-commit announcement a command leader
broadcasts for the slots that name it.
"""

from __future__ import annotations

from collections.abc import Callable

from consensus.context import Context
from consensus.messages import OAck, OCommit
from consensus.records import OCommitRecord


class Learner:
    __slots__ = ("_acks", "_acks_view", "_announce", "_committed", "_ctx", "on_own_commit")

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._acks: dict[int, set[int]] = {}
        self._acks_view = 0
        self._announce: list[int] = []
        self._committed: list[tuple[int, int]] = []  # (slot, value) committed this step
        self.on_own_commit: Callable[[int], None] = lambda slot: None

    def reset_view(self) -> None:
        """Acceptances count only within one view."""
        self._acks.clear()
        self._acks_view = self._ctx.view

    def accepted(self, start: int, end: int, sequencer: int) -> None:
        """This replica accepted O[start:end] from `sequencer` in the current view."""
        olog = self._ctx.olog
        if self._acks_view != self._ctx.view:
            self.reset_view()
        for slot in range(start, end):
            entry = olog.slots.get(slot)
            if entry is not None and not entry.committed:
                self._acks.setdefault(slot, {sequencer})

    def on_ack(self, message: OAck) -> None:
        ctx = self._ctx
        if message.view != ctx.view or self._acks_view != ctx.view:
            return
        if message.sender == ctx.id:
            ctx.olog.mark_durable(message.start, message.end, ctx.view)
        majority = ctx.majority
        for slot in range(message.start, message.end):
            acks = self._acks.get(slot)
            if acks is None:
                continue
            acks.add(message.sender)
            if len(acks) >= majority:
                entry = ctx.olog.slots[slot]
                self.commit(slot, entry.value)

    def on_commit_message(self, message: OCommit) -> None:
        for slot, value in zip(message.slots, message.values, strict=True):
            self.commit(slot, value)

    def commit_prefix_of_view(self, prefix: int) -> None:
        """The sequencer of this view says slots below `prefix` are committed: the ones held
        here from this view carry the values it proposed."""
        ctx = self._ctx
        for slot in range(ctx.olog.commit_prefix, prefix):
            entry = ctx.olog.slots.get(slot)
            if entry is None:
                break
            if entry.view == ctx.view and not entry.committed:
                self.commit(slot, entry.value)

    def commit(self, slot: int, value: int) -> None:
        ctx = self._ctx
        if not ctx.olog.commit(slot, value):
            return
        self._acks.pop(slot, None)
        self._committed.append((slot, value))
        if value == ctx.id:
            self._announce.append(slot)
            self.on_own_commit(slot)

    def has_pending(self) -> bool:
        return bool(self._committed or self._announce)

    def flush(self) -> None:
        """Persist this step's commits and announce the ones that name this replica."""
        ctx = self._ctx
        if self._committed:
            slots = tuple(slot for slot, _ in self._committed)
            values = tuple(value for _, value in self._committed)
            ctx.persist(OCommitRecord(slots, values))
            self._committed.clear()
        if self._announce:
            slots = tuple(self._announce)
            ctx.broadcast(OCommit(ctx.id, ctx.view, slots, (ctx.id,) * len(slots)))
            self._announce.clear()

    def forget_slots_below(self, slot: int) -> None:
        for known in [known for known in self._acks if known < slot]:
            del self._acks[known]
