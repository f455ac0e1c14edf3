"""Replacing the sequencer: failure detection, votes, the rebuilt log, and straggler detection.

The sequencer of view v is replica v mod N, so a candidate picks the next view it owns; views
double as O-instance ballots. A follower that hears nothing from the sequencer for a randomized
timeout (and whose read lease to it has expired) becomes a candidate: it promises the new view
and asks for votes, which also O-prepare every slot from its committed prefix on. A voter
promises the view (it will accept nothing older), and reports its O-entries and, per replica,
the highest C-index it accepted. A replica that learned of the view from another message first
(and so awaits its log) still votes for its candidate. With a majority of votes the candidate
rebuilds the log (`consensus.view_change`), has a majority accept it in the new view, and only
then serves.
Replicas that missed the new view get the rebuilt log again until they acknowledge it. One
that cannot hear the sequencer (a lost link) gets it from a peer instead: a replica serving the
view passes its copy on when it refuses that replica's pre-vote (`NewViewRelay`), with how far
it knows the view committed; a peer that restarted since it installed the log (the copy is in
memory only) asks the sequencer for it again (`ViewLogRequest`) and passes it on next time.

A follower also grants the sequencer a read lease with every heartbeat it answers: until the
lease runs out it votes for no one, so a deposed sequencer cannot answer reads.

Straggler detection (paper §4): a replica measures, per window, how long its C-instances wait
to be replicated (C committed) and to be ordered (own O-instance committed). The paper compares
the count ordered with the demand, but under closed-loop clients demand shrinks to what a slow
sequencer serves and that measure never fires; the delays do not adapt. When ordering takes
more than twice as long as replication (and `straggler_margin_ticks` more) for
`straggler_rounds` windows in a row, the replica tells the others; once a majority agree, they
stop renewing the lease and elect a new sequencer, at most once per `straggler_cooldown_ticks`.
A replica still finding the sequencer slow says so again every `straggler_rounds` windows, so
only suspicions heard within twice that count towards the majority: two slow patches an hour
apart are no majority.

A sequencer whose clock is off is replaced the same way (`judge_clocks`). Its Ticks carry the
state machine's time, so it withholds them while its clock disagrees with a majority's
(consensus/runtime/clock_agreement.py), and then no lease expires anywhere. The runtime tells
the core what it judged of the clocks from the peers' hellos, since the core reads none. A
follower whose own clock agrees with a majority's, but finds the sequencer's off, suspects it
once a window while that lasts. A majority suspecting, for this reason or for straggling,
replaces it. A replica whose own clock is off lets the others stand first: it waits two more
election timeouts before each pre-vote. It still stands after that wait, so a group in which no
clock agrees still elects a sequencer.
"""

from __future__ import annotations

from collections.abc import Callable

from consensus.config import Defect
from consensus.context import Context, Status
from consensus.leader import Leader
from consensus.learner import Learner
from consensus.messages import (
    Heartbeat,
    LeaseGrant,
    NewView,
    NewViewAck,
    NewViewRelay,
    PreVote,
    PreVoteRequest,
    Suspect,
    ViewLogRequest,
    Vote,
    VoteRequest,
)
from consensus.records import InstallRecord, ViewRecord
from consensus.sequencer import Sequencer
from consensus.view_change import rebuild_log


class Election:
    __slots__ = (
        "_clock_off",
        "_ctx",
        "_deadline",
        "_demand",
        "_established",
        "_last_change",
        "_last_heard",
        "_leader",
        "_learner",
        "_new_view",
        "_new_view_acks",
        "_new_view_sent_at",
        "_pre_vote_view",
        "_pre_votes",
        "_samples",
        "_sequencer",
        "_served",
        "_slow_rounds",
        "_stand_delayed",
        "_suspecting",
        "_suspicions",
        "_view_log",
        "_vote_from",
        "_votes",
        "_window_start",
        "highest_view_seen",
        "may_vote",
    )

    def __init__(self, ctx: Context, sequencer: Sequencer, learner: Learner,
                 leader: Leader) -> None:
        self._ctx = ctx
        self._sequencer = sequencer
        self._learner = learner
        self._leader = leader
        self._votes: dict[int, Vote] = {}
        self._vote_from = 0  # the from_index of this candidacy's vote request
        self._new_view: NewView | None = None
        self._view_log: NewView | None = None  # the log of the view installed here, to relay
        self._new_view_acks: set[int] = set()
        self._new_view_sent_at = 0
        self._established = False
        self._deadline = 0
        self._last_heard = 0
        self._pre_votes: set[int] = set()
        self._pre_vote_view = -1
        self._last_change = 0
        self.highest_view_seen = 0
        self._window_start = 0
        self._demand = self._served = self._slow_rounds = self._samples = 0
        self._suspicions: dict[int, int] = {}  # replica -> tick its suspicion was heard
        self._suspecting = False
        self._clock_off = False  # this replica's clock is off its group's (`judge_clocks`)
        self._stand_delayed = False  # whether this timeout's pre-vote was put off for it
        # False while this replica, started over on an empty disk, does not yet know every
        # slot its old life may have voted on (`consensus.rejoin`): it votes for no one.
        self.may_vote: Callable[[], bool] = lambda: True
        self.heard_from_sequencer()

    def forget(self, replica: int) -> None:
        """`replica` started over on an empty disk: its votes, pre-votes and suspicions from
        its old life count no more (`consensus.rejoin`). An acknowledgement of a rebuilt log
        goes too: the new life accepts the log again when it is sent again."""
        if self._ctx.status is Status.CANDIDATE:
            self._votes.pop(replica, None)
        self._pre_votes.discard(replica)
        self._new_view_acks.discard(replica)
        self._suspicions.pop(replica, None)

    # --- failure detection ------------------------------------------------------------------

    def heard_from_sequencer(self) -> None:
        ctx = self._ctx
        base = ctx.config.election_ticks
        self._last_heard = ctx.now
        self._deadline = ctx.now + base + ctx.prng.below(base)
        self._stand_delayed = False

    def on_tick(self) -> None:
        ctx = self._ctx
        self._straggler_window()
        if ctx.status is Status.ESTABLISHING or (self._established and ctx.is_sequencer):
            self._resend_new_view()
        if ctx.is_sequencer or ctx.now < self._deadline:
            return
        if self._leased_elsewhere(ctx.id):
            self._deadline = ctx.lease_until
            return
        if not self.may_vote():
            self.heard_from_sequencer()  # try again after another timeout
            ctx.count("rejoin.candidacy_withheld")
            return
        if self._clock_off and not self._stand_delayed:
            self._stand_delayed = True  # replicas whose clocks agree stand first
            self._deadline = ctx.now + 2 * ctx.config.election_ticks
            ctx.count("election.candidacy_delayed")
            return
        self._stand_delayed = False
        self._start_pre_vote()

    def on_heartbeat(self, message: Heartbeat) -> None:
        ctx = self._ctx
        if message.view != ctx.view or ctx.status is not Status.NORMAL or \
                message.sender != ctx.sequencer or self._suspecting:
            return
        self.heard_from_sequencer()
        ctx.lease_until = max(ctx.lease_until, ctx.now + ctx.config.lease_ticks)
        ctx.lease_holder = message.sender
        self._pre_votes = set()  # a pre-vote under way must not outlive the lease just granted
        ctx.send(message.sender, LeaseGrant(ctx.id, ctx.view, message.lease_round))

    # --- pre-vote and candidacy ----------------------------------------------------------------

    def _next_own_view(self) -> int:
        ctx = self._ctx
        floor = max(ctx.view, self.highest_view_seen) + 1
        return floor + (ctx.id - floor) % ctx.replica_count

    def _start_pre_vote(self) -> None:
        ctx = self._ctx
        self._pre_vote_view = self._next_own_view()
        self._pre_votes = {ctx.id}
        base = ctx.config.election_ticks
        self._deadline = ctx.now + base + ctx.prng.below(base)  # try again if this fails
        ctx.count("election.pre_votes")
        ctx.broadcast(PreVoteRequest(ctx.id, self._pre_vote_view, ctx.view))

    def _leased_elsewhere(self, candidate: int) -> bool:
        """This replica promised its lease holder not to vote for anyone else yet; voting for
        the holder itself keeps the promise (no other replica can serve reads meanwhile)."""
        ctx = self._ctx
        return ctx.now < ctx.lease_until and candidate != ctx.lease_holder

    def bump(self, seen_view: int) -> None:
        """Another replica is stuck in `seen_view`, which this sequencer's lease keeps it from
        winning: re-elect this sequencer in a view above it (the lease holders vote for it)."""
        self.highest_view_seen = max(self.highest_view_seen, seen_view)
        self._ctx.count("election.bumps")
        self.start_candidacy()

    def _would_vote(self, candidate: int) -> bool:
        """Whether this replica would vote `candidate` in now."""
        ctx = self._ctx
        if self._leased_elsewhere(candidate) or not self.may_vote():
            return False
        if ctx.is_sequencer:
            return not self._sequencer.lease_valid()
        return self._suspecting or ctx.status is not Status.NORMAL or \
            ctx.now - self._last_heard >= ctx.config.election_ticks

    def on_pre_vote_request(self, message: PreVoteRequest) -> None:
        ctx = self._ctx
        granted = message.view > ctx.view and self._would_vote(message.sender)
        ctx.send(message.sender, PreVote(ctx.id, message.view, granted))
        if not granted and ctx.status is Status.NORMAL and message.current_view <= ctx.view:
            # The asker may have missed this view's log and be unable to hear its sequencer.
            self._pass_on_view_log(message.sender)

    def _pass_on_view_log(self, asker: int) -> None:
        """Relay this view's log to `asker`; with no copy (a restart since it was installed),
        ask the sequencer for one, to relay at the asker's next pre-vote."""
        ctx, log = self._ctx, self._view_log
        if log is not None and log.view == ctx.view:
            ctx.count("election.view_log_relayed")
            ctx.send(asker, NewViewRelay(ctx.id, ctx.view, log.start, log.values,
                                         log.o_counts, ctx.olog.commit_prefix))
        elif not ctx.is_sequencer and ctx.view > 0:  # view 0 has no log: every replica starts in it
            ctx.count("election.view_log_requested")
            ctx.send(ctx.sequencer, ViewLogRequest(ctx.id, ctx.view))

    def on_view_log_request(self, message: ViewLogRequest) -> None:
        new_view = self._new_view
        if self._ctx.is_sequencer and new_view is not None and \
                new_view.view == message.view == self._ctx.view:
            self._ctx.send(message.sender, new_view)  # installed again there (idempotent)

    def on_new_view_relay(self, message: NewViewRelay) -> bool:
        """A peer passed on its view's log: install it as if the view's sequencer had sent it.
        True when this replica now serves that view."""
        ctx = self._ctx
        sequencer = ctx.config.sequencer_of(message.view)
        if sequencer == ctx.id:
            return False  # this replica's own view, left by a restart: it must stand again
        self.on_new_view(NewView(sequencer, message.view, message.start, message.values,
                                 message.o_counts))
        return message.view == ctx.view and ctx.status is Status.NORMAL

    def on_pre_vote(self, message: PreVote) -> None:
        ctx = self._ctx
        if not message.granted or message.view != self._pre_vote_view or \
                self._pre_vote_view <= ctx.view:
            return
        if ctx.id not in self._pre_votes or self._leased_elsewhere(ctx.id):
            return  # given up, or this replica granted a lease since: it may not stand now
        self._pre_votes.add(message.sender)
        if len(self._pre_votes) >= ctx.majority:
            self._pre_votes = set()
            self.start_candidacy()

    def start_candidacy(self) -> None:
        ctx = self._ctx
        view = self._next_own_view()
        self._adopt_view(view, Status.CANDIDATE)
        self._votes = {}
        self._vote_from = ctx.olog.commit_prefix
        ctx.count("election.candidacies")
        request = VoteRequest(ctx.id, view, self._vote_from)
        ctx.send(ctx.id, request)
        ctx.broadcast(request, after_persist=True)

    def _adopt_view(self, view: int, status: Status) -> None:
        ctx = self._ctx
        assert view > ctx.view or (view == ctx.view and status is not Status.CANDIDATE)
        if view > ctx.view:
            ctx.persist(ViewRecord(view))
            self._last_change = ctx.now
        ctx.view = view
        ctx.status = status
        self.highest_view_seen = max(self.highest_view_seen, view)
        self._established = False
        self._suspicions.clear()
        self._suspecting = False
        self._learner.reset_view()
        self.heard_from_sequencer()

    def on_vote_request(self, message: VoteRequest) -> None:
        ctx = self._ctx
        self.highest_view_seen = max(self.highest_view_seen, message.view)
        own_candidacy = message.sender == ctx.id and message.view == ctx.view
        # A replica that joined this view from another of its messages (a recovery prepare
        # leaves before the vote request, which waits for the candidate's view record) has
        # promised it but not voted: it votes for the view's own sequencer, the only one that
        # may stand in it (a vote given twice to it reports the same: nothing is accepted
        # in a view before its log is installed).
        joined = message.view == ctx.view and ctx.status is Status.AWAITING and \
            message.sender == ctx.sequencer
        if not own_candidacy:
            if (message.view <= ctx.view and not joined) or \
                    self._leased_elsewhere(message.sender) or (
                    ctx.is_sequencer and self._sequencer.lease_valid()) or (
                    self._suspecting and message.sender == ctx.sequencer) or (
                    not self.may_vote()):
                ctx.count("election.vote_withheld")
                return
            self._adopt_view(message.view, Status.AWAITING)
        start = max(message.from_index, ctx.olog.base)
        olog = ctx.olog
        vote = Vote(ctx.id, ctx.view, message.from_index, olog.base,
                    tuple(olog.entries_from(start)), ctx.clog.max_indexes(),
                    olog.installed_view, olog.installed_end)
        ctx.send(message.sender, vote, after_persist=True)

    def on_vote(self, message: Vote) -> None:
        ctx = self._ctx
        if ctx.status is not Status.CANDIDATE or message.view != ctx.view:
            return
        if message.from_index != self._vote_from:
            # Every voter echoes the request's; another is a peer's claim, and as the rebuild's
            # start it had the candidate count (assert) over slots it does not hold.
            ctx.count("election.vote_from_mismatch")
            return
        self._votes[message.sender] = message
        if len(self._votes) >= ctx.majority:
            self._rebuild()

    def _rebuild(self) -> None:
        ctx = self._ctx
        votes = [self._votes[sender] for sender in sorted(self._votes)]
        if Defect.OWN_VOTE_ONLY in ctx.config.defects:
            votes = [vote for vote in votes if vote.sender == ctx.id]
        start = votes[0].from_index
        if any(vote.log_base > start for vote in votes):
            ctx.count("election.candidate_behind")
            ctx.status = Status.AWAITING  # let a replica that is not behind win instead
            return
        start = max(start, ctx.olog.base)  # a snapshot installed since covers [start, base)
        counts = [ctx.olog.count(replica, start) for replica in range(ctx.replica_count)]
        values = rebuild_log(votes, start, ctx.replica_count, counts)
        if values is None:
            ctx.count("election.rebuild_too_long")  # no NewView could carry it
            ctx.status = Status.AWAITING
            return
        if ctx.olog.conflicts(start, values):
            ctx.count("election.rebuild_superseded")  # learned since: a newer view chose
            ctx.status = Status.AWAITING
            return
        totals = tuple(count + values.count(replica) for replica, count in enumerate(counts))
        self._new_view = NewView(ctx.id, ctx.view, start, values, totals)
        self._install(self._new_view)
        ctx.status = Status.ESTABLISHING
        self._new_view_acks = set()
        self._new_view_sent_at = ctx.now
        ctx.broadcast(self._new_view, after_persist=True)

    def _install(self, message: NewView) -> None:
        """Accept the rebuilt log in this view and forget stale slots past it, on disk too
        (`OrderLog.install`)."""
        ctx = self._ctx
        installed_before = self._view_log == message  # in this life: its record is durable
        self._view_log = message
        end = ctx.olog.install(ctx.view, message.start, message.values)
        if not installed_before:  # not again at every resend of the same log
            ctx.persist(InstallRecord(ctx.view, message.start, message.values))
        ctx.send(ctx.id, NewViewAck(ctx.id, ctx.view, end), after_persist=True)

    # --- establishing the new view -------------------------------------------------------------

    def on_new_view(self, message: NewView) -> None:
        ctx = self._ctx
        if message.sender != ctx.config.sequencer_of(message.view) or message.view < ctx.view:
            return
        if ctx.olog.conflicts(message.start, message.values):
            ctx.count("election.new_view_superseded")  # a newer view chose otherwise
            return
        if message.view == ctx.view and ctx.status is Status.NORMAL:
            if message.sender != ctx.id:
                # Installed again (it is idempotent) before the ack vouches for it: a replica
                # that voted, restarted and came back NORMAL in this view may never have had it.
                self._install(message)
                self._leader.fill_to(message.o_counts[ctx.id] - 1)
            end = message.start + len(message.values)
            ctx.send(message.sender, NewViewAck(ctx.id, ctx.view, end), after_persist=True)
            return
        if message.sender == ctx.id:
            return
        self._adopt_view(message.view, Status.NORMAL)
        self._install(message)
        end = message.start + len(message.values)
        ctx.send(message.sender, NewViewAck(ctx.id, ctx.view, end), after_persist=True)
        self._leader.fill_to(message.o_counts[ctx.id] - 1)
        self._leader.on_view_started()

    def on_new_view_ack(self, message: NewViewAck) -> None:
        ctx = self._ctx
        new_view = self._new_view
        if new_view is None or message.view != ctx.view or new_view.view != ctx.view:
            return
        self._new_view_acks.add(message.sender)
        if message.sender == ctx.id:
            end = new_view.start + len(new_view.values)
            ctx.olog.mark_durable(new_view.start, end, ctx.view)
        if ctx.status is Status.ESTABLISHING and len(self._new_view_acks) >= ctx.majority:
            self._serve(new_view)

    def _serve(self, new_view: NewView) -> None:
        ctx = self._ctx
        ctx.status = Status.NORMAL
        self._established = True
        ctx.count("election.views_established")
        for offset, value in enumerate(new_view.values):
            self._learner.commit(new_view.start + offset, value)
        accepted = tuple(max(vote.c_max_index[replica] for vote in self._votes.values())
                         for replica in range(ctx.replica_count))
        self._sequencer.start_view(new_view.start + len(new_view.values), accepted)
        self._leader.fill_to(new_view.o_counts[ctx.id] - 1)
        self._leader.on_view_started()

    def _resend_new_view(self) -> None:
        ctx = self._ctx
        new_view = self._new_view
        if new_view is None or ctx.now - self._new_view_sent_at < ctx.config.resend_ticks:
            return
        self._new_view_sent_at = ctx.now
        for peer in ctx.peers():
            if peer not in self._new_view_acks:
                ctx.send(peer, new_view)

    def on_newer_view(self, view: int) -> None:
        """Some message comes from a view this replica never joined: promise it and wait for
        that view's sequencer to send its log."""
        if view > self._ctx.view:
            self._adopt_view(view, Status.AWAITING)

    def on_deposed(self) -> None:
        """This sequencer learned of slots a newer view chose: leave its view and wait to hear
        the newer one (or elect one)."""
        self._adopt_view(self._ctx.view + 1, Status.AWAITING)

    # --- straggler detection ------------------------------------------------------------------

    def on_replicated(self, waited_ticks: int) -> None:
        self._demand += waited_ticks  # total replication delay this window
        self._samples += 1

    def on_ordered(self, waited_ticks: int) -> None:
        self._served += waited_ticks  # total ordering delay this window

    def _straggler_window(self) -> None:
        ctx = self._ctx
        config = ctx.config
        if ctx.now - self._window_start < config.straggler_window_ticks:
            return
        replicated, ordered, samples = self._demand, self._served, self._samples
        slow = samples >= 2 and ordered > 2 * replicated and \
            ordered - replicated >= config.straggler_margin_ticks * samples
        self._slow_rounds = self._slow_rounds + 1 if slow else 0
        self._window_start, self._demand, self._served, self._samples = ctx.now, 0, 0, 0
        if (config.straggler_enabled and self._slow_rounds >= config.straggler_rounds
                and not ctx.is_sequencer and ctx.status is Status.NORMAL
                and ctx.now - self._last_change >= config.straggler_cooldown_ticks):
            self._slow_rounds = 0
            self._suspect("election.straggler_suspected")

    def judge_clocks(self, agrees: bool, sequencer_off: bool) -> None:
        """The runtime's judgement of the clocks, from the peers' hellos: whether this
        replica's agrees with a majority of its group's, and whether the sequencer's is off
        this one's (module docstring). A follower that agrees and finds the sequencer off
        suspects it, once a straggler window while that lasts, and not within the cooldown
        after a view change."""
        ctx = self._ctx
        self._clock_off = not agrees
        if not (agrees and sequencer_off) or ctx.is_sequencer or \
                ctx.status is not Status.NORMAL or self._suspecting or \
                ctx.now - self._last_change < ctx.config.straggler_cooldown_ticks:
            return
        said = self._suspicions.get(ctx.id)
        if said is None or ctx.now - said >= ctx.config.straggler_window_ticks:
            self._suspect("election.clock_suspected")

    def _suspect(self, counter: str) -> None:
        """This replica suspects the sequencer: it says so, and counts its own suspicion."""
        ctx = self._ctx
        ctx.count(counter)
        self._suspicions[ctx.id] = ctx.now
        ctx.broadcast(Suspect(ctx.id, ctx.view))
        self._check_suspicions()

    def on_suspect(self, message: Suspect) -> None:
        if message.view == self._ctx.view and self._ctx.status is Status.NORMAL:
            self._suspicions[message.sender] = self._ctx.now
            self._check_suspicions()

    def _check_suspicions(self) -> None:
        ctx = self._ctx
        config = ctx.config
        fresh_ticks = 2 * config.straggler_rounds * config.straggler_window_ticks
        self._suspicions = {replica: heard for replica, heard in self._suspicions.items()
                            if ctx.now - heard <= fresh_ticks}
        if ctx.id in self._suspicions and len(self._suspicions) >= ctx.majority and \
                not self._suspecting:
            self._suspecting = True  # no more lease renewals; elect once the lease ends
            ctx.count("election.straggler_replacing")
            self._deadline = max(ctx.now, ctx.lease_until) + ctx.prng.below(
                ctx.config.election_ticks)
