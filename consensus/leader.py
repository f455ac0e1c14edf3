"""The command-leader role: this replica's clients' commands, replicated in its own C-space.

Proposals queue (bounded) and leave in batches: every flush packs the queue into C-instances
(up to `batch_commands_max` commands and `batch_bytes_max` bytes each, at most
`inflight_instances_max` uncommitted). Thrifty: a C-accept goes to the nearest majority-1
peers; when the sequencer is not among them a small C-request asks it to order the instance.
A missing acknowledgement makes the C-accept go to every peer after `resend_ticks`.

Ready (the reply point in the paper) needs C(n, i) committed and, by group size:
- 3 replicas and 7 or more: at least i+1 O-instances for n committed;
- 5 replicas, not the sequencer: every O(k) up to n's (i+1)-th accepted here and by the
  sequencer (the prefix condition; the sequencer piggybacks the prefix on its O-accepts);
- 5 replicas, the sequencer itself: every O(k) up to its (i+1)-th accepted by a majority.

If another replica recovered this space (its ballot is higher), the leader takes the space
back with a higher ballot and proposes again, at new indexes, the commands that lost.

Own indexes are reserved on disk ahead of use (`reserved_indexes` at a time, renewed half way),
and a C-accept for an index leaves only once its reservation is durable: a restarted leader
then knows every index it may have sent, and decides them all before it proposes anew.

In the Multi-Paxos baseline only the sequencer proposes: others forward their commands to it
and forward again after a view change (the executor drops repeats).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from consensus.codec import ENVELOPE_BYTES_MAX
from consensus.command_log import initial_ballot
from consensus.config import Defect, Mode, ReplicaConfig
from consensus.context import Context, DiskMark, Status
from consensus.errors import ConsensusError
from consensus.learner import Learner
from consensus.messages import (
    NOOP,
    Batch,
    CAccept,
    CAck,
    CCommit,
    Command,
    CRequest,
    Forward,
    ReadyNotice,
)
from consensus.records import CCommitRecord, EpochRecord, ReserveRecord
from consensus.recovery import Retaken
from consensus.sequencer import Sequencer

TAG_COUNTER_BITS = 32
TAGS_PER_EPOCH = 1 << TAG_COUNTER_BITS


class ProposalDropped(ConsensusError):
    """The proposal queue is full; the caller should back off and try again."""


class Inflight:
    __slots__ = ("acks", "ballot", "batch", "sent_at")

    def __init__(self, ballot: int, batch: Batch, sent_at: int) -> None:
        self.ballot = ballot
        self.batch = batch
        self.sent_at = sent_at
        self.acks: set[int] = set()


class Leader:
    __slots__ = ("_counter", "_created_at", "_ctx", "_forwarded",
                 "_inflight", "_order_asked_at", "_own_committed", "_pending", "_prefix",
                 "_sequencer", "_surplus_upto", "_unready", "ballot", "lagging", "next_index",
                 "on_lost_index", "on_order_lagging", "on_ordered", "on_replicated",
                 "reserved", "reserved_upto", "retaking")

    def __init__(self, ctx: Context, sequencer: Sequencer, learner: Learner) -> None:
        self._ctx = ctx
        self._sequencer = sequencer
        self.ballot = initial_ballot(ctx.id)
        self.next_index = 0
        self.reserved_upto = 0  # own indexes below may be in use: a ReserveRecord says so
        self.reserved = DiskMark(0)  # how far the reservation is on disk
        self.retaking = False
        self._counter = 0
        self._pending: deque[Command] = deque()
        self._inflight: dict[int, Inflight] = {}
        self._unready: dict[int, Batch] = {}  # own instances not yet ready, by index
        # Multi-Paxos: own commands sent to the sequencer, by tag, with when each was last
        # sent, oldest first: each goes again on its own clock (one clock for all, restarted
        # by every Forward, held a lost one back while others went).
        self._forwarded: dict[int, tuple[Command, int]] = {}
        self._order_asked_at = 0
        self._own_committed = 0  # O-instances for this replica known committed
        self._surplus_upto = -1  # surplus own slots to fill once the retake is done
        self._prefix = _PrefixCounter(ctx, learner)
        self._created_at: dict[int, int] = {}  # own index -> tick proposed (straggler delays)
        self.on_replicated: Callable[[int], None] = lambda ticks: None
        self.on_lost_index: Callable[[], None] = lambda: None
        self.on_order_lagging: Callable[[], None] = lambda: None  # e.g. fetch from a peer
        # Far behind the committed prefix: new commands wait until this replica caught up,
        # or a snapshot could cover them before it ever executed them (no result to give).
        self.lagging: Callable[[], bool] = lambda: False
        self.on_ordered: Callable[[int], None] = lambda ticks: None

    # --- proposing -------------------------------------------------------------------------

    def propose(self, payload: bytes) -> int:
        ctx = self._ctx
        if len(payload) > ENVELOPE_BYTES_MAX:
            # Its C-accept would decode nowhere: peers drop it, and the replica's own log
            # refuses the record as corrupt at the next start.
            raise ValueError(f"a command of {len(payload)} bytes; at most {ENVELOPE_BYTES_MAX}")
        if len(self._pending) >= ctx.config.pending_proposals_max:
            raise ProposalDropped(f"{len(self._pending)} proposals already queued")
        if self._counter == TAGS_PER_EPOCH:
            self._new_epoch()
        tag = (ctx.epoch << TAG_COUNTER_BITS) | self._counter
        self._counter += 1
        self._pending.append(Command(ctx.id, tag, payload))
        return tag

    def _new_epoch(self) -> None:
        """Every tag of this epoch is used (2**32 proposals in one life): go on in the next,
        as a restart would. Its tags leave only once its record is on disk (`_send_accept`),
        or a crash could hand the same epoch out again, and the executor would drop a new
        command as a repeat of an old one with its tag."""
        ctx = self._ctx
        ctx.epoch += 1
        ctx.persist(EpochRecord(ctx.epoch))  # `ctx.epoch_durable` once the sync is done
        self._counter = 0
        ctx.count("leader.new_epoch")

    def enqueue_forwarded(self, commands: Batch) -> None:
        """Multi-Paxos: commands other replicas forwarded to this sequencer."""
        room = self._ctx.config.pending_proposals_max - len(self._pending)
        self._pending.extend(commands[:max(0, room)])
        if len(commands) > room:
            self._ctx.count("leader.forwarded_dropped", len(commands) - room)

    def flush(self) -> None:
        """Turn queued proposals into C-instances (or forward them, in Multi-Paxos)."""
        ctx = self._ctx
        if not self._pending or ctx.status is not Status.NORMAL:
            return  # nothing queued, the case of most Readies: the checks below are pure
        if ctx.config.mode is Mode.MULTIPAXOS and not ctx.is_sequencer:
            self._forward()
            return
        if self.retaking or self.lagging():
            return
        last = -1
        while self._pending and len(self._inflight) < ctx.config.inflight_instances_max:
            if self._index_used_elsewhere():
                self.on_lost_index()  # the retake moves next_index past what others decided
                break
            last = self._start_instance(self._take_batch())
        if last >= 0:
            self._ask_for_order(last)

    def _index_used_elsewhere(self) -> bool:
        """Whether this replica's space holds anything at or past the next own index, which it
        never proposed: a replica whose execution waited on an O-instance naming this replica
        ran recovery there (a no-op), and this replica learned of it. Proposing there would
        offer its own acceptor a second value for an instance perhaps chosen; checked before
        each instance, since a decided index may lie past the next one."""
        return self._ctx.clog[self._ctx.id].max_index >= self.next_index

    def _take_batch(self) -> Batch:
        pending = self._pending
        return tuple([pending.popleft()
                      for _ in range(_batch_length(pending, self._ctx.config))])

    def _start_instance(self, batch: Batch) -> int:
        ctx = self._ctx
        index = self.next_index
        self.next_index += 1
        self._reserve(index)
        accept = CAccept(ctx.id, ctx.view, ctx.id, index, self.ballot, batch)
        ctx.send(ctx.id, accept)  # this replica's own acceptor persists and acknowledges
        for peer in ctx.nearest_peers(ctx.config.faults_tolerated):
            self._send_accept(peer, accept)
        self._inflight[index] = Inflight(self.ballot, batch, ctx.now)
        self._unready[index] = batch
        if len(self._created_at) < ctx.config.inflight_instances_max * 4:
            self._created_at[index] = ctx.now
        return index

    # --- the index reservation ------------------------------------------------------------

    def _reserve(self, index: int) -> None:
        """Keep the reservation at least half a reservation past `index`."""
        reserved = self._ctx.config.reserved_indexes
        if index + reserved // 2 >= self.reserved_upto:
            self.reserve_upto(index + reserved)

    def reserve_upto(self, upto: int) -> None:
        """Own indexes below `upto` may be in use from now on: on disk with this Ready's sync
        (`reserved`, the DiskMark, follows it)."""
        self.reserved_upto = upto
        self._ctx.persist(ReserveRecord(upto))

    def _send_accept(self, peer: int, accept: CAccept) -> None:
        """A C-accept leaves once the reservation of its index (and the epoch of its tags) is
        on disk: at once, unless proposals outran the reservation since the last Ready, or a
        new epoch began (then with this Ready's sync)."""
        ctx = self._ctx
        ctx.send(peer, accept, after_persist=accept.index >= self.reserved.durable or
                 not ctx.epoch_durable)

    def restore_reservation(self, upto: int) -> None:
        """Replayed from the log after a restart (so, durable)."""
        self.reserved_upto = max(self.reserved_upto, upto)
        self.reserved = DiskMark(self.reserved_upto)

    def resume(self, index: int, ballot: int, batch: Batch) -> None:
        """After a restart: an own instance accepted before the crash, to finish (its client
        is gone, but execution needs it decided)."""
        inflight = Inflight(ballot, batch, sent_at=self._ctx.now - self._ctx.config.resend_ticks)
        inflight.acks.add(self._ctx.id)
        self._inflight[index] = inflight

    def fill_to(self, index: int) -> None:
        """O-instances exist for own indexes not proposed yet (a view change gave this
        replica surplus slots): fill them with no-ops at once. Never with a waiting command:
        a surplus slot may lie ahead of commands already ready, and a command proposed after
        they were ready must run after them (the paper's invariant 7)."""
        if self.retaking:
            self._surplus_upto = max(self._surplus_upto, index)
            return
        while self.next_index <= index and self._ctx.status is Status.NORMAL:
            self._ctx.count("leader.surplus_filled")
            self._start_instance(NOOP)

    def _ask_for_order(self, index: int) -> None:
        ctx = self._ctx
        self._order_asked_at = ctx.now
        if ctx.sequencer == ctx.id:
            self._sequencer.request(ctx.id, index)
        elif ctx.sequencer not in ctx.nearest_peers(ctx.config.faults_tolerated):
            ctx.send(ctx.sequencer, CRequest(ctx.id, ctx.view, ctx.id, index, self.ballot))

    def _forward(self) -> None:
        """Multi-Paxos: the queue goes to the sequencer. Only own commands are kept until
        they run: a deposed sequencer's queue may hold others' (forwarded to it), which
        their origins keep and forward again; kept here, by a tag another origin's command
        may share, nothing would ever clear them, and one could hide an own command."""
        ctx = self._ctx
        commands = tuple(self._pending)
        self._pending.clear()
        for command in commands:
            if command.origin == ctx.id:
                self._forwarded.pop(command.tag, None)  # moved to the end: the newest
                self._forwarded[command.tag] = (command, ctx.now)
        if commands:
            self._send_forward(commands)

    def _send_forward(self, commands: Batch) -> None:
        """In messages of at most a batch each (commands and bytes), as C-instances are."""
        ctx = self._ctx
        while commands:  # a new epoch's tags leave once its record is on disk (`_new_epoch`)
            length = _batch_length(commands, ctx.config)
            ctx.send(ctx.sequencer, Forward(ctx.id, ctx.view, commands[:length]),
                     after_persist=not ctx.epoch_durable)
            commands = commands[length:]

    # --- acknowledgements and commits --------------------------------------------------------

    def owns(self, index: int, ballot: int) -> bool:
        inflight = self._inflight.get(index)
        return inflight is not None and inflight.ballot == ballot

    def on_c_ack(self, message: CAck) -> None:
        ctx = self._ctx
        inflight = self._inflight.get(message.index)
        if inflight is None or message.ballot != inflight.ballot or message.view != ctx.view:
            return
        if message.sender not in inflight.acks and message.sender != ctx.id:
            ctx.note_delay(message.sender, ctx.now - inflight.sent_at)
        inflight.acks.add(message.sender)
        if len(inflight.acks) >= ctx.majority:
            self._commit(message.index, inflight)

    def _commit(self, index: int, inflight: Inflight) -> None:
        ctx = self._ctx
        own = ctx.clog[ctx.id].get(index)
        # A short record replays only where its ballot's acceptance is on disk here: this
        # replica's acceptor may hold the index at a recoverer's ballot by now (same value).
        replayable = own is not None and own.ballot == inflight.ballot
        ctx.clog[ctx.id].commit(index, inflight.ballot, inflight.batch)
        ctx.persist(CCommitRecord(ctx.id, index, inflight.ballot,
                                  None if replayable else inflight.batch))
        short = CCommit(ctx.id, ctx.view, ctx.id, index, inflight.ballot, None)
        full = CCommit(ctx.id, ctx.view, ctx.id, index, inflight.ballot, inflight.batch)
        notices = ctx.notices
        for peer in ctx.peers():
            notices.send(peer, short if peer in inflight.acks else full, ctx.now)
        del self._inflight[index]
        created = self._created_at.get(index)
        if created is not None:
            self.on_replicated(ctx.now - created)

    def on_own_o_committed(self, slot: int) -> None:
        """The own_committed-th own O-instance orders C(self, own_committed) (positional)."""
        created = self._created_at.pop(self._own_committed, None)
        if created is not None:
            self.on_ordered(self._ctx.now - created)
        self._own_committed += 1

    def recount(self) -> None:
        """After a restart or a snapshot install: recount own committed O-instances."""
        olog, me = self._ctx.olog, self._ctx.id
        self._own_committed = olog.count_base[me] + sum(
            1 for entry in olog.slots.values() if entry.committed and entry.value == me)
        self._prefix.reset()

    # --- ready -----------------------------------------------------------------------------

    def check_ready(self) -> None:
        """Report own commands whose position is now fixed (the paper's ready)."""
        if not self._unready:
            return
        ctx = self._ctx
        ordered = self._ordered_count()
        space = ctx.clog[ctx.id]
        for index in sorted(self._unready):
            if index >= ordered:
                break
            slot = space.get(index)
            if slot is None or not slot.committed:
                continue
            if slot.batch != self._unready[index]:
                # Another replica recovered this index with another value (a no-op): these
                # commands lost it, and this replica knows it now. They go back to the queue
                # at once (a snapshot truncating the index would leave their fate unknown)
                # and are proposed again once the space is taken back.
                self._requeue(self._take([index]), "leader.requeued_lost")
                self.on_lost_index()
                continue
            ctx.outbox.pending.readied_instances.append(index)
            self._report_ready(self._unready.pop(index))

    def requeue_lost(self) -> None:
        """Before a snapshot truncates this space (a compaction or a peer's snapshot): own
        commands whose index is committed here with another value are queued again now.
        Past the truncation only the snapshot's counts remain, and `forget_below` would drop
        them as of unknown outcome, though this replica knows they did not run. A command
        whose index is not committed here stays unknown: it may have been chosen."""
        lost = self._lost_indexes({})
        if lost:
            self._requeue(self._take(lost), "leader.requeued_lost")
            self.on_lost_index()

    def _lost_indexes(self, chosen: dict[int, Batch]) -> list[int]:
        """Own indexes proposed and decided with another value (chosen in a round, or
        committed here): their commands were not chosen there, nor anywhere else (a command
        is in one proposal at a time)."""
        space, lost = self._ctx.clog[self._ctx.id], []
        for index in sorted({*self._inflight, *self._unready}):
            decided = chosen.get(index)
            if decided is None:
                slot = space.get(index)
                decided = slot.batch if slot is not None and slot.committed else None
            inflight = self._inflight.get(index)
            proposed = inflight.batch if inflight is not None else self._unready[index]
            if decided is not None and decided != proposed:
                lost.append(index)
        return lost

    def _take(self, indexes: list[int]) -> list[Command]:
        """Forget the proposals at `indexes` (in flight, or kept for readiness; one resumed
        after a restart is only in flight); return their commands, in index order."""
        commands: list[Command] = []
        for index in indexes:
            inflight = self._inflight.pop(index, None)
            batch = self._unready.pop(index, None)
            if batch is None:
                batch = inflight.batch if inflight is not None else ()
            commands.extend(batch)
        return commands

    def _requeue(self, commands: list[Command], counter: str) -> None:
        """Commands known to have lost their index go back to the front of the queue."""
        self._pending.extendleft(reversed(commands))
        self._ctx.count(counter, len(commands))

    def _ordered_count(self) -> int:
        """How many own O-instances meet the O condition of the ready rule."""
        ctx = self._ctx
        if ctx.replica_count != 5:
            return self._own_committed
        if ctx.is_sequencer:
            return self._prefix.own_in_commit_prefix()
        if Defect.NO_PREFIX_CONDITION in ctx.config.defects:
            return self._prefix.own_accepted_anywhere()
        return self._prefix.own_in_accepted_prefix()

    def _report_ready(self, batch: Batch) -> None:
        ctx = self._ctx
        notices: dict[int, list[int]] = {}
        for command in batch:
            if command.origin == ctx.id:
                ctx.outbox.pending.readied.append(command.tag)
            else:
                notices.setdefault(command.origin, []).append(command.tag)
        for origin in sorted(notices):
            ctx.send(origin, ReadyNotice(ctx.id, ctx.view, tuple(notices[origin])))

    def on_ready_notice(self, message: ReadyNotice) -> None:
        self._ctx.outbox.pending.readied.extend(
            tag for tag in message.tags if tag in self._forwarded)

    def forget_forwarded(self, repeat: Callable[[int], bool]) -> list[int]:
        """Forget the forwarded commands every executor drops as repeats; returns their tags."""
        tags = [tag for tag in sorted(self._forwarded) if repeat(tag)]
        for tag in tags:
            del self._forwarded[tag]
        return tags

    def on_executed_own(self, tags: list[int]) -> None:
        for tag in tags:
            self._forwarded.pop(tag, None)

    # --- resends, view changes, taking the space back -------------------------------------------

    def on_tick(self) -> None:
        ctx = self._ctx
        if ctx.status is not Status.NORMAL or self.retaking:
            return
        resend_ticks = ctx.config.resend_ticks
        for index in sorted(self._inflight):
            inflight = self._inflight[index]
            if ctx.now - inflight.sent_at >= resend_ticks:
                self._resend(index, inflight)
        if self._unready and ctx.now - self._order_asked_at >= resend_ticks:
            self._ask_for_order_again(lagging=True)
        if self._forwarded and \
                ctx.now - next(iter(self._forwarded.values()))[1] >= resend_ticks * 4:
            self._forward_again(waited_ticks=resend_ticks * 4)

    def _resend(self, index: int, inflight: Inflight) -> None:
        ctx = self._ctx
        ctx.count("leader.resend")
        inflight.sent_at = ctx.now
        accept = CAccept(ctx.id, ctx.view, ctx.id, index, inflight.ballot, inflight.batch)
        for peer in ctx.peers():
            if peer not in inflight.acks:
                self._send_accept(peer, accept)
        if ctx.id not in inflight.acks:
            ctx.send(ctx.id, accept)

    def _ask_for_order_again(self, *, lagging: bool = False) -> None:
        ctx = self._ctx
        self._order_asked_at = ctx.now
        last = self.next_index - 1
        if ctx.sequencer == ctx.id:
            self._sequencer.request(ctx.id, last)
            return
        request = CRequest(ctx.id, ctx.view, ctx.id, last, self.ballot)
        ctx.send(ctx.sequencer, request)
        if lagging:
            # Ordering lags a resend period: ask through every peer as well (they pass it on),
            # should the link from here to the sequencer be down while theirs work; and fetch,
            # should the orders have been made and their commits lost on the way here.
            for peer in ctx.peers():
                if peer != ctx.sequencer:
                    ctx.send(peer, request)
            self.on_order_lagging()

    def _forward_again(self, waited_ticks: int = 0) -> None:
        """Forward again the own commands last sent at least `waited_ticks` ago (all of them
        by default: a new view's sequencer may never have heard of them)."""
        ctx = self._ctx
        if ctx.config.mode is not Mode.MULTIPAXOS or ctx.is_sequencer:
            self._pending.extendleft(reversed([self._forwarded[tag][0]
                                               for tag in sorted(self._forwarded)]))
            self._forwarded.clear()
            return
        due = sorted(tag for tag, (_, at) in self._forwarded.items()
                     if ctx.now - at >= waited_ticks)
        commands = tuple(self._forwarded.pop(tag)[0] for tag in due)
        for command in commands:  # moved to the end: the newest
            self._forwarded[command.tag] = (command, ctx.now)
        self._send_forward(commands)

    def on_view_started(self) -> None:
        """A new view serves: resend what is unfinished under it (paper §3.3)."""
        self._prefix.reset()
        for index in sorted(self._inflight):
            self._resend(index, self._inflight[index])
        if self.next_index > 0:
            self._ask_for_order_again()
        if self._forwarded:
            self._forward_again()

    def on_retaken(self, retaken: Retaken) -> None:
        """The space is this replica's again at `retaken.ballot`. Commands that lost their
        index are proposed again; unfinished proposals past what the round settled move to
        the new ballot (acceptors promised it and will refuse the old one); those below
        where the round started (an acceptor truncated there) are decided, and settled from
        what this replica knows. A round that could not see to the end of the space (its
        promises were capped) is followed by another from past what it settled, before
        anything is proposed or filled: acceptors may hold values past `top`, perhaps
        chosen, that no round of this ballot has seen, and proposing there without phase 1
        could choose a second value."""
        self.ballot = retaken.ballot
        self.retaking = False
        self.next_index = max(self.next_index, retaken.start, retaken.top + 1)
        self._requeue(self._take(self._lost_indexes(retaken.chosen)),
                      "leader.requeued_after_retake")
        for index in [index for index in sorted(self._inflight)
                      if index in retaken.chosen or index < retaken.start]:
            # Decided with this value, or below where the round could start (an acceptor
            # executed it and truncated there): left to execution, like any committed
            # instance (the value comes with catch-up; should a snapshot cover it first,
            # the outcome stays unknown).
            del self._inflight[index]
        if not retaken.complete:
            self._ctx.count("leader.retake_continued")
            self.on_lost_index()
            return
        stale = [index for index, inflight in sorted(self._inflight.items())
                 if inflight.ballot != retaken.ballot]
        for index in stale:
            inflight = self._inflight[index]
            inflight.ballot, inflight.acks = retaken.ballot, set()
            self._resend(index, inflight)
        if self._surplus_upto >= 0:
            surplus, self._surplus_upto = self._surplus_upto, -1
            self.fill_to(surplus)

    def highest_queued_tag(self, origin: int) -> int:
        """The highest tag of `origin` among commands queued here, not yet proposed (-1:
        none): Multi-Paxos's sequencer queues other origins' forwarded commands."""
        return max((command.tag for command in self._pending if command.origin == origin),
                   default=-1)

    def lowest_unfinished(self) -> int:
        """Where a retake starts: the lowest own index in flight, or accepted here and not
        committed. The latter may hold a proposal of an earlier retake cut short by a crash,
        at a ballot a restart does not resume: left below the retake, it waits for other
        replicas to recover it, one stalled index per recovery period when their quorum
        misses it, and every replica's execution (and so every proposal) waits with it."""
        space = self._ctx.clog[self._ctx.id]
        undecided = [index for index, slot in space.slots.items() if not slot.committed]
        return max(min([self.next_index, *self._inflight, *undecided]), space.base)

    def forget_below(self, base: int) -> None:
        """A snapshot covers own indexes below `base`: they were decided elsewhere, with a
        value this replica cannot see any more, so their clients' outcome stays unknown.
        (Those committed here with another value were queued again before the truncation.)"""
        for index in [index for index in self._inflight if index < base]:
            del self._inflight[index]
            self._ctx.count("leader.outcome_unknown")
        for known in (self._unready, self._created_at):  # committed, not yet ordered, too
            for index in [index for index in known if index < base]:
                del known[index]
        self.next_index = max(self.next_index, base)

    def pending_count(self) -> int:
        return len(self._pending)


def _batch_length(commands: Iterable[Command], config: ReplicaConfig) -> int:
    """How many of the leading `commands` make one batch: at most `batch_commands_max`, and
    `batch_bytes_max` of payload unless a single command is larger."""
    length = size = 0
    for command in commands:
        size += len(command.payload)
        if length == config.batch_commands_max or (length and size > config.batch_bytes_max):
            break
        length += 1
    return length


class _PrefixCounter:
    """Counts own O-instances in the committed prefix and in the prefix accepted in the
    current view (5 replicas), incrementally."""

    __slots__ = ("_accepted_count", "_accepted_cursor", "_accepted_view", "_commit_count",
                 "_commit_cursor", "_ctx", "_learner")

    def __init__(self, ctx: Context, learner: Learner) -> None:
        self._ctx = ctx
        self._learner = learner
        self.reset()

    def reset(self) -> None:
        olog = self._ctx.olog
        self._commit_cursor = self._accepted_cursor = olog.base
        self._commit_count = self._accepted_count = olog.count_base[self._ctx.id]
        self._accepted_view = self._ctx.view

    def own_in_commit_prefix(self) -> int:
        olog, me = self._ctx.olog, self._ctx.id
        if self._commit_cursor < olog.base:
            self.reset()
        while self._commit_cursor < olog.commit_prefix:
            if olog.slots[self._commit_cursor].value == me:
                self._commit_count += 1
            self._commit_cursor += 1
        return self._commit_count

    def own_in_accepted_prefix(self) -> int:
        ctx = self._ctx
        if self._accepted_view != ctx.view or self._accepted_cursor < ctx.olog.base:
            self.reset()
        prefix = self.accepted_prefix()
        while self._accepted_cursor < prefix:
            if ctx.olog.slots[self._accepted_cursor].value == ctx.id:
                self._accepted_count += 1
            self._accepted_cursor += 1
        return self._accepted_count

    def accepted_prefix(self) -> int:
        """Slots below are committed, or accepted durably in this view both here and by the
        sequencer (whose O-accepts leave before its own sync)."""
        olog, view = self._ctx.olog, self._ctx.view
        prefix = olog.accepted_prefix(view)
        vouched = self._learner.sequencer_durable_end
        return prefix if prefix <= vouched else max(vouched, olog.commit_prefix)

    def own_accepted_anywhere(self) -> int:
        """The defective rule: own slots accepted here, whatever precedes them."""
        ctx = self._ctx
        return ctx.olog.count_base[ctx.id] + sum(
            1 for entry in ctx.olog.slots.values()
            if entry.value == ctx.id and (entry.committed or (
                entry.view == ctx.view and entry.durable)))
