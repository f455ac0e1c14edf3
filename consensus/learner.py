"""Learning which O-instances are committed, and announcing one's own.

An O-instance is committed once a majority accepted it in one view. A replica counts the
acceptances of the slots it holds from the sequencer of its view: its own (once persisted),
the O-ACKs acceptors send to the sequencer and to the command leaders named in the slots, and
the sequencer's, which is explicit: O-accepts leave the sequencer before its own sync, so
each carries the end of its durable prefix, and an O-ack from the sequencer raises it once a
run is persisted. With 3 replicas the sequencer and one acceptor are a majority, so
acceptance alone commits (one round trip, the two syncs side by side).

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
    __slots__ = ("_acks", "_acks_view", "_announce", "_committed", "_ctx", "_sequencer_durable",
                 "on_own_commit", "on_view_overruled")

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._acks: dict[int, set[int]] = {}
        self._acks_view = 0
        self._sequencer_durable = 0  # the sequencer of this view vouched for slots below
        self._announce: list[int] = []
        self._committed: list[tuple[int, int]] = []  # (slot, value) committed this step
        self.on_own_commit: Callable[[int], None] = lambda slot: None
        self.on_view_overruled: Callable[[], None] = lambda: None

    def reset_view(self) -> None:
        """Acceptances count only within one view."""
        self._acks.clear()
        self._acks_view = self._ctx.view
        self._sequencer_durable = 0

    @property
    def sequencer_durable_end(self) -> int:
        """Slots below this are durably accepted by the sequencer of this view (as far as this
        replica heard)."""
        return self._sequencer_durable if self._acks_view == self._ctx.view else 0

    def accepted(self, start: int, end: int, sequencer_durable_end: int) -> None:
        """This replica accepted O[start:end] from the sequencer of its view, which was durable
        below `sequencer_durable_end` when it sent them."""
        self._fresh_view()
        sequencer = self._ctx.sequencer
        for slot in range(start, min(end, self._sequencer_durable)):
            self._count(slot, sequencer)
        self._sequencer_durable_upto(sequencer_durable_end)

    def on_ack(self, message: OAck) -> None:
        ctx = self._ctx
        if message.view != ctx.view:
            return
        self._fresh_view()
        if message.sender == ctx.id:
            ctx.olog.mark_durable(message.start, message.end, ctx.view)
        if message.sender == ctx.sequencer:
            self._sequencer_durable_upto(message.end)
            return
        # Only the slots held here can be counted (`_count`): a peer's range is a claim, and
        # one naming [0, 2**62) would hold this replica's task for ever (so would one over a
        # log a peer's commit of slot 2**62 stretched: `OrderLog.held`).
        for slot in ctx.olog.held(max(message.start, ctx.olog.commit_prefix),
                                  min(message.end, ctx.olog.end)):
            self._count(slot, message.sender)

    def _fresh_view(self) -> None:
        if self._acks_view != self._ctx.view:
            self.reset_view()

    def _sequencer_durable_upto(self, end: int) -> None:
        """The sequencer's vote for every slot below `end` (it persists its runs in order)."""
        ctx = self._ctx
        if end <= self._sequencer_durable:
            return
        first = max(self._sequencer_durable, ctx.olog.commit_prefix)
        self._sequencer_durable = end
        for slot in ctx.olog.held(first, min(end, ctx.olog.end)):
            self._count(slot, ctx.sequencer)

    def _count(self, slot: int, voter: int) -> None:
        """`voter` accepted this view's value for `slot`; held here, it commits on a majority."""
        ctx = self._ctx
        entry = ctx.olog.slots.get(slot)
        if entry is None or entry.committed or entry.view != ctx.view:
            return
        acks = self._acks.get(slot)
        if acks is None:
            acks = self._acks[slot] = set()
        acks.add(voter)
        if len(acks) >= ctx.majority:
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
        entry = ctx.olog.slots.get(slot)  # this view's value, replaced by another view's?
        overwritten = entry is not None and entry.value != value and not entry.committed \
            and entry.view == ctx.view
        if not ctx.olog.commit(slot, value):
            return
        if overwritten and ctx.is_sequencer:
            self.on_view_overruled()
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
