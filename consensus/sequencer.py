"""The sequencer role: it orders C-instances by proposing replica ids in the O-log.

A C-accept from a command leader, or its C-request, names C(n, i). The de-duplication guard
(paper Fig. 5 l.13, in its robust form) allocates O-instances for n only while n's count is not
past i, so duplicated, resent or reordered triggers never add surplus slots for n (a surplus
slot would later carry a newer command ahead of older, answered ones).

Allocations are batched: at each flush one O-accept goes to each destination, carrying every
slot that destination was not yet sent (the paper's piggybacking, which the 5-replica ready
rule needs). Thrifty: destinations are the command leaders named in the new slots, and the
sequencer's nearest peers where those leaders alone do not make a majority with it. O-accepts
leave before the sequencer's own acceptance is on disk, so its sync and the acceptors' overlap
(as a Raft leader's and followers' do); its vote reaches learners explicitly: each O-accept
says how far its acceptance was durable when sent, and once a run is persisted an O-ack from
the sequencer follows it to the leaders the run names (the learners of its slots; the other
acceptors learn the outcome from O-commits). This is safe because a sequencer never proposes
twice in one view: a restarted one does not resume its view (after a restart it awaits a new
view: `Replica._rejoin`).

It also sends heartbeats, holds the read lease (granted by followers in answer to heartbeats,
counted from when each heartbeat was sent), and answers read-index requests.
"""

from __future__ import annotations

from collections.abc import Callable

from consensus.config import Defect
from consensus.context import Context, Status
from consensus.messages import NO_INDEX, Heartbeat, LeaseGrant, OAccept, OAck, ReadIndexReply
from consensus.quorum import majority_floor
from consensus.records import OAcceptRecord


class Sequencer:
    __slots__ = ("_ctx", "_flushed_upto", "_grants", "_lease_round", "_next_heartbeat",
                 "_progress_tick", "_progress_upto", "_round_sent_at", "_waiting", "counts",
                 "durable_upto", "next_slot", "on_deposed", "on_lease_renewed", "sent_upto")

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self.next_slot = 0
        self.counts = [0] * ctx.replica_count
        self.sent_upto = [0] * ctx.replica_count
        self._flushed_upto = 0
        self.durable_upto = 0  # own acceptances in this view are on disk below this slot
        self._lease_round = 0
        self._round_sent_at: dict[int, int] = {}
        self._grants = [-1] * ctx.replica_count
        self._next_heartbeat = 0
        self._progress_upto = 0
        self._progress_tick = 0
        self._waiting: dict[int, int] = {}  # requests that came while establishing
        self.on_deposed: Callable[[], None] = lambda: None
        self.on_lease_renewed: Callable[[], None] = lambda: None  # a grant came in

    def start_view(self, end: int, accepted: tuple[int, ...]) -> None:
        """Begin serving: the O-log is established up to `end` in the current view.
        `accepted` holds, per replica, the highest C-index the voters accepted; those
        C-instances are ordered at once, and so are requests that came while establishing."""
        ctx = self._ctx
        self.next_slot = self._flushed_upto = self._progress_upto = self.durable_upto = end
        self.counts = [ctx.olog.count(replica, end) for replica in range(ctx.replica_count)]
        self.sent_upto = [end] * ctx.replica_count
        self._grants = [-1] * ctx.replica_count
        self._round_sent_at.clear()
        self._next_heartbeat = ctx.now
        self._progress_tick = ctx.now
        waiting, self._waiting = self._waiting, {}
        for space in range(ctx.replica_count):
            highest = max(accepted[space], waiting.get(space, -1))
            if highest >= 0:
                self.request(space, highest)

    # --- allocation -------------------------------------------------------------------------

    def request(self, space: int, index: int) -> None:
        """C(space, 0..index) exist: give each an O-instance, at most once."""
        ctx = self._ctx
        if not ctx.is_sequencer:
            if ctx.status is Status.ESTABLISHING and len(self._waiting) < ctx.replica_count:
                self._waiting[space] = max(index, self._waiting.get(space, -1))
            return
        if ctx.olog.end > self.next_slot:
            # A slot past this view's log is known (committed by a newer view, learned
            # through catch-up or a commit): this sequencer was replaced without hearing it.
            self.leave_view()
            return
        if Defect.NO_DEDUP_GUARD in ctx.config.defects:
            self._allocate(space)
            return
        # At most a window a request: an index far ahead (a bad frame) costs no more than
        # that, and a leader that is really that far ahead asks again for the rest.
        upto = min(index, self.counts[space] + ctx.config.inflight_instances_max - 1)
        while self.counts[space] <= upto:
            self._allocate(space)

    def leave_view(self) -> None:
        """This replica learned that a newer view chose slots of this view's log (a commit or
        a snapshot): as sequencer it leaves its view, before a heartbeat could name them
        committed (followers would take them for their own view's values) or it allocates
        any more."""
        if self._ctx.is_sequencer:
            self._ctx.count("sequencer.deposed")
            self.on_deposed()

    def _allocate(self, space: int) -> None:
        slot = self.next_slot
        self.next_slot += 1
        self.counts[space] += 1
        self._ctx.olog.accept(slot, space, self._ctx.view)
        self._ctx.count("sequencer.allocated")

    def has_unflushed(self) -> bool:
        """Allocations wait for `flush` (a C-request allocates without queueing anything)."""
        return self.next_slot > self._flushed_upto and self._ctx.is_sequencer

    def flush(self) -> None:
        """Persist this step's allocations and send the O-accepts they need."""
        ctx = self._ctx
        start, end = self._flushed_upto, self.next_slot
        if start == end or not ctx.is_sequencer:
            return
        if ctx.olog.end > end or ctx.olog.base > start:
            # Since this step's allocations, this replica learned slots a newer view chose (a
            # commit, or a snapshot that replaced the allocated slots): nobody heard of the
            # allocations, and their leaders ask the newer view's sequencer again.
            self._flushed_upto = end
            self.leave_view()
            return
        values = ctx.olog.values(start, end)
        ctx.persist(OAcceptRecord(ctx.view, start, values))
        self._flushed_upto = end
        ctx.send(ctx.id, OAccept(ctx.id, ctx.view, start, values, self.durable_upto),
                 after_persist=True)
        vote = OAck(ctx.id, ctx.view, start, end)
        for peer in self._destinations(values):
            self._send_run(peer)
            if peer in values:  # a learner of these slots
                ctx.send(peer, vote, after_persist=True)

    def _destinations(self, values: tuple[int, ...]) -> list[int]:
        """Thrifty: the command leaders the run names, and nearest peers until those that
        answer make a majority with the sequencer (the paper's "at least a majority including
        R_n"). With 3 replicas a run for one other leader goes to that leader alone."""
        ctx = self._ctx
        if not ctx.config.thrifty:
            return list(ctx.config.peers)
        destinations = {value for value in values if value >= 0 and value != ctx.id}
        demoted = ctx.demoted_peers()
        counted = len(destinations - demoted)
        for peer in ctx.nearest_peers(len(ctx.config.peers), demoted):
            if counted >= ctx.config.faults_tolerated:
                break
            if peer not in destinations:
                destinations.add(peer)
                counted += 1
        return sorted(destinations)

    def on_durable(self, end: int) -> None:
        """Own acceptances below `end` are on disk (runs are persisted in order)."""
        self.durable_upto = max(self.durable_upto, end)

    def _send_run(self, peer: int) -> None:
        ctx = self._ctx
        start = max(self.sent_upto[peer], ctx.olog.base)  # below: committed, truncated
        end = min(self.next_slot, start + ctx.config.o_entries_per_message_max)
        if start >= end:
            return
        values = ctx.olog.values(start, end)
        ctx.send(peer, OAccept(ctx.id, ctx.view, start, values, self.durable_upto))
        self.sent_upto[peer] = end

    def on_ack_gap(self, peer: int, accepted_upto: int) -> None:
        """The peer lacks slots from `accepted_upto` on: resend from there."""
        if self._ctx.is_sequencer and accepted_upto < self.sent_upto[peer]:
            self.sent_upto[peer] = accepted_upto
            self._send_run(peer)

    # --- heartbeats, resends, the read lease ---------------------------------------------------

    def on_tick(self) -> None:
        ctx = self._ctx
        if not ctx.is_sequencer:
            return
        if ctx.olog.end > self.next_slot:  # a slot past this view's log: see `request`
            self.leave_view()
            return
        if ctx.now >= self._next_heartbeat:
            self._heartbeat()
        prefix = ctx.olog.commit_prefix
        if prefix != self._progress_upto:
            self._progress_upto, self._progress_tick = prefix, ctx.now
        elif prefix < self.next_slot and ctx.now - self._progress_tick >= ctx.config.resend_ticks:
            ctx.count("sequencer.resend")
            self._progress_tick = ctx.now
            for peer in ctx.peers():
                self.sent_upto[peer] = min(self.sent_upto[peer], prefix)
                self._send_run(peer)

    def _heartbeat(self) -> None:
        ctx = self._ctx
        self._lease_round += 1
        self._round_sent_at[self._lease_round] = ctx.now
        self._round_sent_at.pop(self._lease_round - 64, None)
        self._grants[ctx.id] = self._lease_round
        self._next_heartbeat = ctx.now + ctx.config.heartbeat_ticks
        ctx.broadcast(Heartbeat(ctx.id, ctx.view, ctx.olog.commit_prefix, self._lease_round))

    def on_lease_grant(self, message: LeaseGrant) -> None:
        ctx = self._ctx  # a grant from an earlier view answered another incarnation's round
        if ctx.is_sequencer and message.view == ctx.view and \
                message.lease_round <= self._lease_round:
            self._grants[message.sender] = max(self._grants[message.sender],
                                               message.lease_round)
            self.on_lease_renewed()

    def lease_valid(self) -> bool:
        """A majority promised, in answer to a heartbeat sent at tick t, to vote for no one
        else until t + lease_ticks (by their clocks); keep a margin for drift. Never once a
        slot past this view's log is known (a newer view chose it: this sequencer is deposed,
        whatever the lease says), should the clocks have broken the lease's bound."""
        ctx = self._ctx
        granted = majority_floor(self._grants)
        sent_at = self._round_sent_at.get(granted)
        if not ctx.is_sequencer or sent_at is None or ctx.olog.end > self.next_slot:
            return False
        return ctx.now < sent_at + ctx.config.lease_ticks - ctx.config.lease_drift_ticks

    def read_index(self, requester: int, read_id: int, epoch: int) -> None:
        ctx = self._ctx
        upto = self.next_slot if self.lease_valid() else NO_INDEX
        if upto == NO_INDEX:
            ctx.count("reads.refused_no_lease")
        ctx.send(requester, ReadIndexReply(ctx.id, ctx.view, read_id, epoch, upto))
