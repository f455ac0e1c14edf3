"""Learning which O-instances are committed, and announcing one's own.

An O-instance is committed once a majority accepted it in one view. A replica counts the
acceptances of the slots it holds from the sequencer of its view: its own (once persisted),
the O-ACKs acceptors send to the sequencer and to the command leaders named in the slots, and
the sequencer's, which is explicit: O-accepts leave the sequencer before its own sync, so
each carries the end of its durable prefix, and an O-ack from the sequencer raises it once a
run is persisted. With 3 replicas the sequencer and one acceptor are a majority, so
acceptance alone commits (one round trip, the two syncs side by side).

An acceptor's O-ack can reach a command leader before the sequencer's O-accept for its slots
(with 5 or more replicas its path can be the faster one). Such an early ack is kept, per voter
and for this view only, and counted when the slots arrive (`accepted`); otherwise the slot
would wait for the next heartbeat's commit prefix, and with 7 replicas the command for the
ready rule. An ack names no value: it counts for the value this replica later accepts in the
same view because one view's sequencer proposes each slot once (a restarted one never resumes
its view, a rejoining one adopts the highest view reported). Kept claims are bounded: at most
`EARLY_ACK_RANGES_MAX` ranges a voter, clipped to `EARLY_ACK_WINDOW_SLOTS` past the commit
prefix (an ack naming [0, 2**62) keeps a window's worth of claim and costs no more). A voter
that asks to rejoin after a lost disk (`forget_voter`) loses its kept claims: its old life's
votes for slots this replica does not hold are not covered by the log end this replica
reports to it, so counting them after the report could choose a value no reporter told it of
(the phase-1 votes of an old life are forgotten for the same reason: `consensus.rejoin`).

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

EARLY_ACK_RANGES_MAX = 8  # kept ranges of slots a voter acknowledged before they arrived here
EARLY_ACK_WINDOW_SLOTS = 1 << 14  # past the commit prefix; claims beyond are not kept


class Learner:
    __slots__ = ("_acks", "_acks_view", "_announce", "_committed", "_ctx", "_early",
                 "_sequencer_durable", "on_own_commit", "on_view_overruled")

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._acks: dict[int, set[int]] = {}
        # Per voter: ranges [start, end) it acknowledged in this view past this log's end
        self._early: dict[int, list[tuple[int, int]]] = {}
        self._acks_view = 0
        self._sequencer_durable = 0  # the sequencer of this view vouched for slots below
        self._announce: list[int] = []
        self._committed: list[tuple[int, int]] = []  # (slot, value) committed this step
        self.on_own_commit: Callable[[int], None] = lambda slot: None
        self.on_view_overruled: Callable[[], None] = lambda: None

    def reset_view(self) -> None:
        """Acceptances count only within one view."""
        self._acks.clear()
        self._early.clear()
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
        self._count_early(start, end)

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
        if message.sender != ctx.id:
            self._keep_early(message.sender, message.start, message.end)

    def _keep_early(self, voter: int, start: int, end: int) -> None:
        """Keep the part of `voter`'s ack past this log's end, within the window: the slots
        it names that have not arrived here yet (`_count_early` counts them when they do)."""
        olog = self._ctx.olog
        start = max(start, olog.end, olog.commit_prefix)
        end = min(end, olog.commit_prefix + EARLY_ACK_WINDOW_SLOTS)
        if start >= end:
            return
        ranges = self._early.setdefault(voter, [])
        if ranges and ranges[-1][0] <= end and start <= ranges[-1][1]:  # overlaps the last
            start, end = min(start, ranges[-1][0]), max(end, ranges[-1][1])
            ranges.pop()
        ranges.append((start, end))
        if len(ranges) > EARLY_ACK_RANGES_MAX:
            del ranges[0]  # the oldest claim: its slot then waits for a heartbeat, as before

    def _count_early(self, start: int, end: int) -> None:
        """O[start:end] arrived here in this view: count the acks that came before them, and
        drop the kept ranges the commit prefix passed."""
        prefix = self._ctx.olog.commit_prefix
        for voter in sorted(self._early):
            ranges = self._early[voter]
            for low, high in ranges:
                for slot in range(max(low, start), min(high, end)):
                    self._count(slot, voter)
            ranges[:] = [(low, high) for low, high in ranges if high > prefix]
            if not ranges:
                del self._early[voter]

    def forget_voter(self, voter: int) -> None:
        """`voter` asks to rejoin after a lost disk: its old life's acks for slots not held
        here are not covered by the log end this replica reports to it; they count no more."""
        self._early.pop(voter, None)

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
            slots, values = zip(*self._committed, strict=True)  # no generator frames
            ctx.persist(OCommitRecord(slots, values))
            self._committed.clear()
        if self._announce:
            slots = tuple(self._announce)
            ctx.notices.broadcast(ctx.peers(), OCommit(ctx.id, ctx.view, slots,
                                                       (ctx.id,) * len(slots)), ctx.now)
            self._announce.clear()

    def forget_slots_below(self, slot: int) -> None:
        for known in [known for known in self._acks if known < slot]:
            del self._acks[known]
