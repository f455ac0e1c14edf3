"""The SDPaxos replica: a sans-IO state machine fed messages, proposals and ticks.

Inputs: `receive(frame)` or `step(message)` for peer messages, `propose(payload)` for client
commands, `read(read_id)` for linearizable reads, `tick()` for time. Output: `ready()` hands
out a `Ready` (see `consensus.ready` for what the driver must do, and in which order), and
`advance()` tells the core the Ready was handled. The core never blocks, reads no clock and
draws randomness only from the `Prng` it was given, so the same inputs give the same outputs.

Roles live in their own modules (leader, acceptor, learner, sequencer, executor, election,
recovery, catch-up, reads); this module only dispatches and orders their work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from consensus.acceptor import Acceptor
from consensus.catchup import CatchUp
from consensus.codec import decode_messages
from consensus.command_log import ballot_owner
from consensus.config import Defect, Mode, ReplicaConfig
from consensus.context import Context, Status
from consensus.election import Election
from consensus.errors import InvalidMessage
from consensus.executor import Executor
from consensus.leader import TAG_COUNTER_BITS, Leader, ProposalDropped
from consensus.learner import Learner
from consensus.messages import (
    NO_CL,
    TAG_EPOCH_MAX,
    Batch,
    CAccept,
    CAck,
    CCommit,
    CNack,
    CPrepare,
    CPromise,
    CRequest,
    FetchReply,
    FetchRequest,
    Forward,
    Heartbeat,
    LeaseGrant,
    Message,
    NewView,
    NewViewAck,
    NewViewRelay,
    OAccept,
    OAck,
    OCommit,
    PreVote,
    PreVoteRequest,
    ReadIndexReply,
    ReadIndexRequest,
    ReadyNotice,
    RejoinQuery,
    RejoinReport,
    SnapshotChunk,
    Suspect,
    ViewLogRequest,
    Vote,
    VoteRequest,
    check_message,
)
from consensus.notice_hold import WAITS_ON_COMMITS
from consensus.prng import Prng
from consensus.reads import Reads
from consensus.ready import Ready
from consensus.records import (
    CAcceptRecord,
    CCommitRecord,
    CPromiseRecord,
    EpochRecord,
    InstallRecord,
    OAcceptRecord,
    OCommitRecord,
    Record,
    RejoinRecord,
    ReserveRecord,
    SnapshotRecord,
    ViewRecord,
)
from consensus.recovery import Recovery
from consensus.rejoin import Rejoin
from consensus.sequencer import Sequencer

# Messages that state facts (chosen values, catch-up data) or run the view change itself;
# every other message from a newer view makes this replica join that view first.
_VIEW_INDEPENDENT = (OCommit, CCommit, FetchReply, FetchRequest, SnapshotChunk, VoteRequest,
                     NewView, NewViewRelay, Vote, NewViewAck, PreVoteRequest, PreVote)


def _promised_newer_view(message: Message, view: int) -> bool:
    """Whether the sender of a vote or pre-vote request promised a view above `view`: a
    candidate has; one asking for pre-votes only if it was in such a view already."""
    if isinstance(message, PreVoteRequest):
        return message.current_view > view
    return isinstance(message, VoteRequest)


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    replica_id: int
    view: int
    status: str
    sequencer: int
    is_sequencer: bool
    executed_slots: int
    commit_prefix: int
    log_base: int
    pending_proposals: int
    counters: tuple[tuple[str, int], ...]


class Inspection:
    """Read-only access to a replica's logs, for the simulator's checks and for tests."""

    __slots__ = ("_ctx", "_executor")

    def __init__(self, ctx: Context, executor: Executor) -> None:
        self._ctx = ctx
        self._executor = executor

    @property
    def now(self) -> int:
        """The replica's clock, in ticks."""
        return self._ctx.now

    @property
    def view(self) -> int:
        return self._ctx.view

    @property
    def is_sequencer(self) -> bool:
        return self._ctx.is_sequencer

    @property
    def sequencer(self) -> int:
        """The sequencer of the view this replica is in."""
        return self._ctx.sequencer

    @property
    def holds_view_log(self) -> bool:
        """Whether this replica is its view's sequencer and holds the view's O-log: rebuilt
        from the votes (being established) or serving."""
        ctx = self._ctx
        return ctx.sequencer == ctx.id and ctx.status in (Status.ESTABLISHING, Status.NORMAL)

    @property
    def log_base(self) -> int:
        return self._ctx.olog.base

    @property
    def log_end(self) -> int:
        return self._ctx.olog.end

    def committed_o(self, slot: int) -> int | None:
        entry = self._ctx.olog.get(slot)
        return entry.value if entry is not None and entry.committed else None

    def o_value(self, slot: int) -> int | None:
        return self._ctx.olog.value(slot)

    def o_count(self, space: int, end: int) -> int:
        """Slots in [0, end) holding `space`, counted afresh (every slot must be known)."""
        return self._ctx.olog.count(space, end)

    def committed_c(self, space: int, index: int) -> Batch | None:
        slot = self._ctx.clog[space].get(index)
        return slot.batch if slot is not None and slot.committed else None

    def exec_count(self, space: int) -> int:
        return self._executor.exec_counts[space]


class Replica:
    def __init__(self, config: ReplicaConfig, prng: Prng) -> None:
        self.config = config.validate()
        ctx = self._ctx = Context(config, prng)
        self._sequencer = Sequencer(ctx)
        self._learner = Learner(ctx)
        self._executor = Executor(ctx)
        self._leader = Leader(ctx, self._sequencer, self._learner)
        self._acceptor = Acceptor(ctx, self._learner, self._sequencer)
        self._election = Election(ctx, self._sequencer, self._learner, self._leader)
        self._recovery = Recovery(ctx, self._leader.on_retaken)
        self._catchup = CatchUp(ctx, self._executor, self._learner)
        self._reads = Reads(ctx, self._executor, self._sequencer)
        self._rejoin_gate = Rejoin(ctx, self._on_rejoin_reported)
        self._acceptor.blind = self._recovery.blind = self._rejoin_gate.blind
        self._election.may_vote = self._rejoin_gate.may_vote
        self._learner.on_own_commit = self._on_own_commit
        self._catchup.on_install = self._on_snapshot_installed
        self._catchup.before_truncation = self._leader.requeue_lost
        self._leader.on_replicated = self._election.on_replicated
        self._leader.on_ordered = self._election.on_ordered
        self._leader.on_lost_index = self._start_retake
        self._leader.on_order_lagging = self._catchup.maybe_ask
        self._leader.lagging = self._lagging
        self._sequencer.on_deposed = self._election.on_deposed
        self._learner.on_view_overruled = self._sequencer.leave_view
        self._sequencer.on_lease_renewed = self._reads.on_lease_renewed
        self._handlers = self._handler_table()
        self.inspect = Inspection(ctx, self._executor)

    def _handler_table(self) -> dict[type[Message], Callable[[Any], None]]:
        return {
            CAccept: self._acceptor.on_c_accept, CAck: self._on_c_ack,
            CNack: self._on_c_nack, CCommit: self._acceptor.on_c_commit,
            CRequest: self._on_c_request, CPrepare: self._acceptor.on_c_prepare,
            CPromise: self._recovery.on_promise, OAccept: self._acceptor.on_o_accept,
            OAck: self._on_o_ack, OCommit: self._learner.on_commit_message,
            PreVoteRequest: self._election.on_pre_vote_request,
            PreVote: self._election.on_pre_vote,
            VoteRequest: self._election.on_vote_request, Vote: self._election.on_vote,
            NewView: self._election.on_new_view, NewViewAck: self._election.on_new_view_ack,
            NewViewRelay: self._on_new_view_relay,
            ViewLogRequest: self._election.on_view_log_request,
            Heartbeat: self._on_heartbeat, LeaseGrant: self._sequencer.on_lease_grant,
            Suspect: self._election.on_suspect,
            ReadIndexRequest: self._on_read_index_request, ReadIndexReply: self._reads.on_reply,
            Forward: self._on_forward, ReadyNotice: self._leader.on_ready_notice,
            FetchRequest: self._catchup.on_request, FetchReply: self._catchup.on_reply,
            SnapshotChunk: self._catchup.on_chunk,
            RejoinQuery: self._on_rejoin_query, RejoinReport: self._rejoin_gate.on_report,
        }

    # --- inputs -------------------------------------------------------------------------------

    def receive(self, frame: bytes, sender: int | None = None) -> None:
        """Decode, validate and handle one frame from a peer; an invalid one is dropped and
        counted, never trusted. `sender`: the peer the transport authenticated, if known: a
        message that names another sender is dropped (no replica speaks for another)."""
        try:
            messages = decode_messages(frame)
        except InvalidMessage:
            self._ctx.count("dropped.invalid_frame")
            return
        for message in messages:
            if sender is not None and message.sender != sender:
                self._ctx.count("dropped.wrong_sender")
                continue
            self.step(message)

    def step(self, message: Message) -> None:
        ctx = self._ctx
        reason = check_message(message, ctx.replica_count)
        if reason is not None or message.sender == ctx.id:
            ctx.count("dropped.invalid_message")
            return
        ctx.heard_at[message.sender] = ctx.now
        if type(message) in WAITS_ON_COMMITS:
            ctx.notices.waits(message.sender, ctx.now)
        self._handle(message)
        if ctx.outbox.loopback_now:  # seldom: looked at, not called, after every input
            self._run_loopback()

    def _handle(self, message: Message) -> None:
        ctx = self._ctx
        if self._rejoin_gate.collecting and not isinstance(message, RejoinReport | RejoinQuery):
            ctx.count("rejoin.dropped_while_asking")  # it knows no promise to keep yet
            return
        if message.view > ctx.view:
            if ctx.is_sequencer and _promised_newer_view(message, ctx.view) and \
                    self._sequencer.lease_valid():
                # A replica promised a view this healthy sequencer's lease keeps it from
                # winning, and it ignores this view meanwhile: move everyone past it. (One
                # still in this view or an older one gets this view's log relayed instead.)
                # Without a lease (a majority stopped renewing it: they suspect a straggler,
                # or cannot hear it) the candidate can win, and must: bumping re-elected the
                # suspected straggler itself.
                self._election.bump(message.view)
            elif not isinstance(message, _VIEW_INDEPENDENT):
                self._election.on_newer_view(message.view)
        self._handlers[type(message)](message)

    def _run_loopback(self) -> None:
        outbox = self._ctx.outbox
        while outbox.loopback_now:
            for message in outbox.take_loopback_now():
                self._handle(message)

    def propose(self, payload: bytes) -> int:
        """Queue a client command; returns its tag (raises ProposalDropped when full, or
        while a replica that lost its disk waits for the others' reports: its tags' epoch
        must be above every one its old life used, which the reports tell)."""
        if self._rejoin_gate.collecting:
            raise ProposalDropped("rejoining after a lost disk: waiting for every other "
                                  "replica's report")
        return self._leader.propose(payload)

    def read(self, read_id: int) -> None:
        self._reads.read(read_id)

    def cancel_read(self, read_id: int) -> None:
        self._reads.cancel(read_id)

    def pass_ticks(self, ticks: int) -> None:
        """Time passed in which this replica ran nothing (its machine suspended, its process
        stopped): the clock moves on by `ticks` at once. Every timer here compares tick stamps,
        so the ticks then replayed with `tick` do the round of work the missed ones would each
        have repeated (heartbeats, resends, timeouts) once."""
        if ticks < 0:
            raise ValueError(f"ticks passed must be at least 0, got {ticks}")
        self._ctx.now += ticks

    def judge_clocks(self, agrees: bool, sequencer_off: bool) -> None:
        """What the runtime judged of the clocks (consensus/election.py): whether this
        replica's agrees with a majority of its group's, and whether its view's sequencer's
        is off this one's. The core reads no clock, so this is its only word of them."""
        self._election.judge_clocks(agrees, sequencer_off)

    def tick(self) -> None:
        ctx = self._ctx
        ctx.now += 1
        if ctx.notices.holding:
            ctx.notices.release_all()
        if self._rejoin_gate.collecting:
            self._rejoin_gate.on_tick()
            return
        self._sequencer.on_tick()
        self._leader.on_tick()
        self._election.on_tick()
        self._recovery.on_tick()
        self._reads.on_tick()
        self._rejoin_gate.on_tick()
        self._repair()
        self._retake_if_stuck()
        self._run_loopback()

    # --- outputs ------------------------------------------------------------------------------

    def ready(self) -> Ready:
        self._leader.flush()
        if self._ctx.outbox.loopback_now:
            self._run_loopback()
        self._sequencer.flush()
        self._executor.run()
        if self._executor.executed_tags:
            self._leader.on_executed_own(self._executor.executed_tags)
            self._executor.executed_tags = []
        if self._executor.dropped_tags:
            # Multi-Paxos: an own command still forwarded that every executor drops as a
            # repeat (its tag fell below the dedup window while it waited: it never ran) is
            # forwarded no more; it would be dropped again for ever. Its client's wait ends
            # with the outcome unknown, and a retry in the same session runs it once.
            self._leader.forget_forwarded(set(self._executor.dropped_tags).__contains__)
            self._executor.dropped_tags = []
        self._leader.check_ready()
        self._reads.serve()
        self._learner.flush()
        self._leader.reserved.drained(self._leader.reserved_upto)
        self._ctx.epoch_on_disk.drained(self._ctx.epoch)  # its record, if new, is in it
        if self._ctx.notices.holding:
            self._ctx.notices.release_riding()
        return self._ctx.outbox.drain()

    @property
    def holds_notices(self) -> bool:
        """Whether commit notices wait for the next tick (a driver that sleeps several ticks
        when idle should wake at the next one)."""
        return self._ctx.notices.holding

    def has_ready(self) -> bool:
        """Whether `ready()` would hand out anything (cheap; drivers poll it after ticks)."""
        ctx = self._ctx
        if not ctx.outbox.pending.is_empty() or self._learner.has_pending():
            return True
        if self._leader.pending_count() and ctx.status is Status.NORMAL:
            return True
        if self._sequencer.has_unflushed():
            return True
        return self._executor.runnable() or self._reads.has_servable()

    def advance(self) -> None:
        """The last Ready is handled: its records are durable; count own acceptances."""
        self._ctx.epoch_on_disk.persisted()
        self._leader.reserved.persisted()
        outbox = self._ctx.outbox
        for message in outbox.take_persisted_loopback():
            self._handle(message)
        if outbox.loopback_now:
            self._run_loopback()

    @property
    def may_compact(self) -> bool:
        """Whether everything executed was handed over (the driver's state machine then holds
        exactly `executed_slots` slots): nothing executed or installed waits to be drained."""
        pending = self._ctx.outbox.pending
        return not pending.executed and pending.snapshot_to_install is None

    def compact(self, state: bytes, executed_slots: int) -> None:
        """Fold the executed prefix into a state-machine snapshot taken after exactly
        `executed_slots` slots were applied; both logs are truncated below it. Call it after
        applying a drained Ready and before `advance`, which may execute more."""
        if not self.may_compact:
            raise ValueError("a snapshot must follow the Ready it covers: executed slots "
                             "or an install are still waiting to be drained")
        if executed_slots != self._executor.exec_slot:
            raise ValueError(f"snapshot taken at {executed_slots} slots, but "
                             f"{self._executor.exec_slot} are executed")
        self._catchup.compact(state)

    # --- role glue ----------------------------------------------------------------------------

    def _on_c_ack(self, message: CAck) -> None:
        if message.space == self._ctx.id and self._leader.owns(message.index, message.ballot):
            self._leader.on_c_ack(message)
        else:
            self._recovery.on_ack(message)

    def _on_c_nack(self, message: CNack) -> None:
        if self._recovery.on_nack(message):
            return
        if message.space == self._ctx.id and message.promised > self._leader.ballot:
            self._start_retake()

    def _lagging(self) -> bool:
        """Too far behind to propose: the others may run a new command and compact past it
        before this replica executes it, and then no result reaches its client. After a
        restart or a view change it waits for the first heartbeat of the view's sequencer and
        executes up to the committed prefix that names; after a peer's snapshot, up to the
        prefix known then."""
        catchup, executed = self._catchup, self._executor.exec_slot
        if not catchup.knows_how_far_behind() and not self._ctx.is_sequencer:
            return True
        if executed < catchup.settle_upto:
            return True
        return catchup.commit_hint - executed > self.config.lead_lag_slots_max

    def _start_retake(self) -> None:
        """Another replica recovered part of this replica's space: take it back."""
        if self._leader.retaking:
            return
        self._leader.retaking = True
        self._ctx.count("leader.retake")
        self._recovery.start(self._ctx.id, self._leader.lowest_unfinished())

    def _on_c_request(self, message: CRequest) -> None:
        ctx = self._ctx
        if not self._acceptor.serving(message.view):
            return
        if ctx.sequencer == ctx.id or message.sender != message.space:
            promised = ctx.clog[message.space].promised
            if message.ballot < promised:
                # From before a retake this sequencer promised (its promise counted the
                # space's O-instances, and the leader may reuse any index past them): it
                # orders nothing. The leader hears of the ballot and takes its space back.
                ctx.count("sequencer.stale_c_request")
                ctx.send(message.space, CNack(ctx.id, ctx.view, message.space,
                                              message.index, promised))
                return
            self._sequencer.request(message.space, message.index)
            return
        # A leader asked this replica because it may not reach the sequencer itself (a lost
        # link): pass the request on, once (the copy names this replica as its sender).
        ctx.count("relay.c_requests")
        ctx.send(ctx.sequencer, CRequest(ctx.id, ctx.view, message.space, message.index,
                                         message.ballot))

    def _on_o_ack(self, message: OAck) -> None:
        if message.start == message.end:
            if message.view == self._ctx.view:
                self._sequencer.on_ack_gap(message.sender, message.start)
            return
        self._learner.on_ack(message)

    def _on_heartbeat(self, message: Heartbeat) -> None:
        ctx = self._ctx
        if message.view == ctx.view and message.sender == ctx.sequencer:
            self._catchup.on_commit_hint(message.commit_prefix)
            if ctx.status is Status.NORMAL:
                self._learner.commit_prefix_of_view(message.commit_prefix)
        self._election.on_heartbeat(message)

    def _on_new_view_relay(self, message: NewViewRelay) -> None:
        if self._election.on_new_view_relay(message):
            # The sender serves this view and hears its sequencer: as good a word on how far
            # it is committed as a heartbeat (this replica may hear none).
            self._catchup.on_commit_hint(message.commit_prefix)

    def _on_read_index_request(self, message: ReadIndexRequest) -> None:
        if message.view == self._ctx.view:
            self._sequencer.read_index(message.sender, message.read_id, message.epoch)

    def _on_forward(self, message: Forward) -> None:
        if self._ctx.is_sequencer and self.config.mode is Mode.MULTIPAXOS:
            self._leader.enqueue_forwarded(message.commands)

    def _on_snapshot_installed(self) -> None:
        self._leader.forget_below(self._ctx.clog[self._ctx.id].base)
        self._leader.recount()
        if self.config.mode is Mode.MULTIPAXOS:
            # Forwarded commands the snapshot drops as repeats: forwarded again and again,
            # each would be dropped for ever. Those its dedup window holds ran (no slot here
            # will report them executed); below the window a tag counts as run whether it ran
            # or its Forward was lost: the outcome stays unknown, as `forget_below` leaves it.
            me, executor = self._ctx.id, self._executor
            covered = self._ctx.outbox.pending.covered
            forgotten = self._leader.forget_forwarded(lambda tag: executor.repeat(me, tag))
            ran = [tag for tag in forgotten if executor.ran(me, tag)]
            covered.extend(sorted(set(ran) - set(covered)))
            if len(ran) < len(forgotten):
                self._ctx.count("leader.outcome_unknown", len(forgotten) - len(ran))

    def _on_own_commit(self, slot: int) -> None:
        self._leader.on_own_o_committed(slot)

    def _retake_if_stuck(self) -> None:
        """An own-space retake with no round under way (one given up, waiting out its
        backoff) starts over."""
        ctx, leader = self._ctx, self._leader
        if leader.retaking and ctx.id not in self._recovery.rounds and \
                ctx.now % ctx.config.resend_ticks == 0:
            leader.forget_below(ctx.clog[ctx.id].base)
            self._recovery.start(ctx.id, leader.lowest_unfinished())

    def _repair(self) -> None:
        """Execution stalled: fetch what is missing, fill own slots, recover silent leaders."""
        ctx, executor = self._ctx, self._executor
        if not self._catchup.behind():
            executor.stalled_since = ctx.now
            return
        waited = ctx.now - executor.stalled_since
        if waited < ctx.config.repair_ticks:
            return
        self._catchup.maybe_ask()
        stall = executor.stall()
        if stall is None or stall.space == NO_CL:
            return
        if stall.space == ctx.id:
            if stall.index >= self._leader.next_index:
                self._leader.fill_to(stall.index)
            return
        turn = (ctx.id - stall.space - 1) % ctx.replica_count
        if waited >= ctx.config.recovery_ticks * (2 + turn) // 2:
            self._recovery.start(stall.space, stall.index)

    # --- introspection and restart -------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """This life's number: one more at every start on the same log."""
        return self._ctx.epoch

    def status(self) -> ReplicaStatus:
        ctx = self._ctx
        return ReplicaStatus(
            replica_id=ctx.id, view=ctx.view, status=ctx.status.value,
            sequencer=ctx.sequencer, is_sequencer=ctx.is_sequencer,
            executed_slots=self._executor.exec_slot, commit_prefix=ctx.olog.commit_prefix,
            log_base=ctx.olog.base, pending_proposals=self._leader.pending_count(),
            counters=tuple(sorted(ctx.stats.items())),
        )

    @property
    def executed_slots(self) -> int:
        return self._executor.exec_slot

    @property
    def pending_proposals(self) -> int:
        """Own proposals queued behind the in-flight window (at most pending_proposals_max)."""
        return self._leader.pending_count()

    @classmethod
    def restore(cls, config: ReplicaConfig, prng: Prng, records: Iterable[Record]) -> Replica:
        """Rebuild a replica from everything it persisted before a crash."""
        replica = cls(config, prng)
        replica._replay(records)
        if replica._rejoin_gate.collecting:
            ctx = replica._ctx  # it asks again, in a new life: nothing else until answered
            ctx.epoch += 1
            ctx.persist(EpochRecord(ctx.epoch))
            ctx.status = Status.AWAITING
            replica._rejoin_gate.begin()
        else:
            replica._rejoin()
        return replica

    @classmethod
    def rejoining(cls, config: ReplicaConfig, prng: Prng, *, epoch_floor: int = 0) -> Replica:
        """A replica that lived before, started over on an empty disk (`consensus.rejoin`):
        it takes part in nothing until every other replica has told it what it holds.
        `epoch_floor`: the highest epoch of its old life that the driver knows of (the
        runtime: the life its peers' hellos say they heard). Its command tags start in an
        epoch above it and above every tag the others report: commands of the old life that
        ran and were compacted everywhere leave no tag to report."""
        replica = cls(config, prng)
        ctx = replica._ctx
        ctx.epoch = epoch_floor
        if epoch_floor:  # kept should it crash while it asks
            ctx.persist(EpochRecord(epoch_floor))
        if Defect.FORGETFUL_REJOIN in replica.config.defects:
            # Starts as a new replica would, its tags above the old life's (so what goes
            # wrong is the promises it forgot, not a tag used twice).
            ctx.epoch += 1
            ctx.persist(EpochRecord(ctx.epoch))
            return replica
        ctx.status = Status.AWAITING
        replica._rejoin_gate.begin()
        return replica

    def heard_old_life(self, peer: int, epoch: int) -> None:
        """The driver took `peer` back on a new disk (it rejoins); its lost life had reached
        `epoch`, which this replica reports to it (`consensus.rejoin`)."""
        self._rejoin_gate.heard_old_life(peer, epoch)

    def raise_epoch_floor(self, epoch: int) -> None:
        """While it waits for the reports, its driver learned that its old life reached
        `epoch` (a peer's hello named it): its tags will start above it."""
        if self._rejoin_gate.collecting and self._ctx.epoch < epoch <= TAG_EPOCH_MAX:
            self._ctx.epoch = epoch

    @property
    def rejoining_now(self) -> bool:
        """Whether this replica still waits for every other replica's report."""
        return self._rejoin_gate.collecting

    def rejoin_state(self) -> str | None:
        """Where a rejoin after a lost disk stands, in words; None where there is none."""
        return self._rejoin_gate.describe()

    @property
    def rejoin_cleared(self) -> bool:
        """Whether this replica knows decided everything its life before a lost disk may
        have voted on (always, for a replica that never lost one)."""
        return self._rejoin_gate.may_vote()

    def _on_rejoin_query(self, message: RejoinQuery) -> None:
        def forget(replica: int) -> None:
            self._recovery.forget(replica)
            self._election.forget(replica)
            self._learner.forget_voter(replica)

        self._rejoin_gate.on_query(message, forget, self._tag_epoch_of)

    def _tag_epoch_of(self, origin: int) -> int:
        """The highest epoch of `origin`'s command tags this replica holds or executed."""
        ctx = self._ctx
        highest = max(self._executor.highest_tag_seen(origin),
                      self._leader.highest_queued_tag(origin))
        for space in range(ctx.replica_count):
            for slot in ctx.clog[space].slots.values():
                for command in slot.batch or ():
                    if command.origin == origin and command.tag > highest:
                        highest = command.tag
        return max(0, highest) >> TAG_COUNTER_BITS

    def _on_rejoin_reported(self, reports: list[RejoinReport]) -> None:
        """Every other replica answered: keep their promises as its own, reserve every own
        index anyone holds, and start as a restart does (the owner's retake first)."""
        ctx, gate = self._ctx, self._rejoin_gate
        view = max(report.view for report in reports)
        if view > ctx.view:
            ctx.view = view
            ctx.persist(ViewRecord(view))
        for space in range(ctx.replica_count):
            promised = max(report.c_promised[space] for report in reports)
            if promised > ctx.clog[space].promised:
                ctx.clog[space].promise(promised)
                ctx.persist(CPromiseRecord(space, promised))
        ctx.epoch = max(ctx.epoch, *(report.tag_epoch for report in reports))
        own_end = gate.c_ends[ctx.id]
        if own_end > self._leader.reserved_upto:
            self._leader.reserve_upto(own_end)
        self._rejoin()

    def _reserve_after_upgrade(self) -> None:
        """A log written before reservations (format 1 or 2) says nothing of the own indexes
        sent before the crash. That build sent a C-accept before its own acceptance was on
        disk, but every Ready's records were durable before the next Ready was made, and a
        Ready started at most `inflight_instances_max` own instances: so no index past two
        Readys' worth beyond the last one on disk ever left. Reserve those, so the retake
        decides them (no-ops where nobody holds a value) before a new command takes one."""
        leader = self._leader
        leader.reserve_upto(leader.next_index + 2 * self._ctx.config.inflight_instances_max)
        self._ctx.count("recovery.reserved_after_upgrade")

    def _replay(self, records: Iterable[Record]) -> None:
        ctx = self._ctx
        for record in records:
            if isinstance(record, EpochRecord):
                ctx.epoch = max(ctx.epoch, record.epoch)
            elif isinstance(record, ViewRecord):
                ctx.view = max(ctx.view, record.view)
            elif isinstance(record, SnapshotRecord):
                self._catchup.install(record.meta, record.state, from_peer=False)
            elif isinstance(record, ReserveRecord):
                self._leader.restore_reservation(record.upto)
            elif isinstance(record, RejoinRecord):
                self._rejoin_gate.restore(record)
            else:
                self._replay_log_record(record)

    def _replay_log_record(self, record: Record) -> None:
        ctx = self._ctx
        if isinstance(record, CPromiseRecord):
            ctx.clog[record.space].promise(record.ballot)
        elif isinstance(record, CAcceptRecord):
            ctx.clog[record.space].restore_accepted(record.index, record.ballot, record.batch)
        elif isinstance(record, CCommitRecord):
            ctx.clog[record.space].commit(record.index, record.ballot, record.batch)
        elif isinstance(record, OAcceptRecord):
            for offset, value in enumerate(record.values):
                ctx.olog.accept(record.start + offset, value, record.view)
            ctx.olog.mark_durable(record.start, record.start + len(record.values), record.view)
        elif isinstance(record, OCommitRecord):
            for slot, value in zip(record.slots, record.values, strict=True):
                ctx.olog.commit(slot, value)
        elif isinstance(record, InstallRecord):
            end = ctx.olog.install(record.view, record.start, record.values)
            ctx.olog.mark_durable(record.start, end, record.view)

    def _rejoin(self) -> None:
        ctx, leader = self._ctx, self._leader
        ctx.epoch += 1
        ctx.persist(EpochRecord(ctx.epoch))
        ctx.status = Status.AWAITING if ctx.sequencer == ctx.id else Status.NORMAL
        ctx.lease_until = ctx.now + ctx.config.lease_ticks  # it may have granted a lease before
        self._election.highest_view_seen = ctx.view
        self._reads.life_epoch = ctx.epoch
        self._learner.reset_view()
        self._catchup.on_restart()
        own = ctx.clog[ctx.id]
        leader.next_index = own.max_index + 1
        if leader.reserved_upto == 0 and leader.next_index > 0:
            self._reserve_after_upgrade()
        if ballot_owner(own.promised) == ctx.id:
            leader.ballot = own.promised
        for index in sorted(own.slots):
            slot = own.slots[index]
            if not slot.committed and slot.ballot == leader.ballot:
                leader.resume(index, slot.ballot, slot.batch)
        leader.recount()
        # A C-accept may have left before its record was on disk: take the space back with a
        # higher ballot before proposing, so no index is ever reused with another value.
        leader.retaking = True
        self._recovery.order_unknown = True  # it may have asked for orders before the crash
        self._recovery.reserved_top = leader.reserved_upto - 1  # and sent C-accepts there
        self._recovery.start(ctx.id, leader.lowest_unfinished())
