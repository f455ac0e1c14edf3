"""The acceptor role: Paxos acceptance for C-instances and O-instances, gated by view.

Every accept-phase message carries its sender's view; one from an older view is dropped (the
proof of Thm A.7 rests on it: a deposed sequencer, or a C-accept from before a view change, can
get nothing accepted). While a view change is under way only view-change messages count.

Acceptance is persisted before it is acknowledged: acknowledgements go in
`messages_after_persist`, and a replica's acknowledgement to itself (how it counts its own
acceptance) is delivered only once the driver reports the records durable.
"""

from __future__ import annotations

from collections.abc import Callable

from consensus.catchup import entries_that_fit
from consensus.config import Defect
from consensus.context import Context, Status
from consensus.learner import Learner
from consensus.messages import (
    NO_INDEX,
    CAccept,
    CAck,
    CCommit,
    CNack,
    CPrepare,
    CPromise,
    OAccept,
    OAck,
)
from consensus.records import CAcceptRecord, CCommitRecord, CPromiseRecord, OAcceptRecord
from consensus.sequencer import Sequencer


class Acceptor:
    __slots__ = ("_ctx", "_learner", "_sequencer", "blind", "missing_commits")

    def __init__(self, ctx: Context, learner: Learner, sequencer: Sequencer) -> None:
        self._ctx = ctx
        self._learner = learner
        self._sequencer = sequencer
        self.missing_commits = 0  # short commits for values not held here (repair fetches)
        # Whether this replica lost its disk and may not report on a space yet
        # (`consensus.rejoin`); its own rounds count its promise knowing that.
        self.blind: Callable[[int], bool] = lambda space: False

    def serving(self, view: int) -> bool:
        """Accept-phase messages count only in this replica's view, once it serves (or, for
        the new sequencer itself, while a majority accepts its rebuilt log: C-instances do
        not depend on the O-log)."""
        return view == self._ctx.view and self._ctx.status in (Status.NORMAL,
                                                                Status.ESTABLISHING)

    # --- C-instances -----------------------------------------------------------------------

    def on_c_accept(self, message: CAccept) -> None:
        ctx = self._ctx
        if not self.serving(message.view):
            ctx.count("dropped.c_accept_view")
            return
        space = ctx.clog[message.space]
        if not space.accept(message.index, message.ballot, message.batch):
            ctx.send(message.sender, CNack(ctx.id, ctx.view, message.space, message.index,
                                           space.promised))
            return
        ctx.persist(CAcceptRecord(message.space, message.index, message.ballot, message.batch))
        ctx.send(message.sender, CAck(ctx.id, ctx.view, message.space, message.index,
                                      message.ballot), after_persist=True)
        if message.sender == message.space:
            # The C-accept doubles as the trigger for ordering (paper §3.2).
            self._sequencer.request(message.space, message.index)

    def on_c_prepare(self, message: CPrepare) -> None:
        ctx = self._ctx
        if not self.serving(message.view):
            ctx.count("dropped.c_prepare_view")
            return
        if message.sender != ctx.id and self.blind(message.space):
            ctx.count("rejoin.prepare_withheld")
            return
        space = ctx.clog[message.space]
        if not space.promise(message.ballot):
            ctx.send(message.sender, CNack(ctx.id, ctx.view, message.space, message.from_index,
                                           space.promised))
            return
        ctx.persist(CPromiseRecord(message.space, message.ballot))
        entries = entries_that_fit(space.entries_from(message.from_index,
                                                      ctx.config.fetch_instances_max))
        # Requests below this ballot order nothing from now on (`Replica._on_c_request`):
        # this count is every O-instance for the space this view will ever allocate but for
        # those the promised ballot's leader asks for.
        ordered = self._sequencer.counts[message.space] if ctx.is_sequencer else NO_INDEX
        ctx.send(message.sender, CPromise(ctx.id, ctx.view, message.space, message.from_index,
                                          message.ballot, space.base, entries,
                                          space.max_index, ordered), after_persist=True)

    def on_c_commit(self, message: CCommit) -> None:
        """A chosen value is a fact: accepted from any view."""
        ctx = self._ctx
        space = ctx.clog[message.space]
        outcome = space.commit(message.index, message.ballot, message.batch)
        if outcome is None:
            self.missing_commits += 1
            ctx.count("acceptor.short_commit_without_value")
        elif outcome:
            ctx.persist(CCommitRecord(message.space, message.index, message.ballot,
                                      message.batch))

    # --- O-instances -----------------------------------------------------------------------

    def on_o_accept(self, message: OAccept) -> None:
        ctx = self._ctx
        end = message.start + len(message.values)
        if message.sender == ctx.id:
            # The sequencer's own allocation, looped back once persisted: its vote.
            if message.view == ctx.view:
                self._sequencer.on_durable(end)
                self._learner.on_ack(OAck(ctx.id, message.view, message.start, end))
            return
        refusal = self._o_accept_refusal(message)
        if refusal is not None:
            ctx.count(refusal)
            return
        changed = False
        for offset, value in enumerate(message.values):
            changed |= ctx.olog.accept(message.start + offset, value, ctx.view)
        if changed:
            ctx.persist(OAcceptRecord(ctx.view, message.start, message.values))
        self._learner.accepted(message.start, end, message.durable_end)
        self._acknowledge(message, end)

    def _o_accept_refusal(self, message: OAccept) -> str | None:
        """Why this replica may not accept the O-accept (a counter name), or None."""
        ctx = self._ctx
        if message.sender != ctx.config.sequencer_of(message.view):
            return "dropped.o_accept_view"
        if Defect.NO_VIEW_GATING in ctx.config.defects and ctx.status is Status.NORMAL:
            return None if message.view <= ctx.view else "dropped.o_accept_view"
        if message.view != ctx.view or ctx.status is not Status.NORMAL:
            return "dropped.o_accept_view"
        if ctx.olog.conflicts(message.start, message.values):
            # Catch-up taught this replica what a newer view chose: its sequencer is deposed.
            return "dropped.o_accept_superseded"
        return None

    def _acknowledge(self, message: OAccept, end: int) -> None:
        ctx = self._ctx
        ack = OAck(ctx.id, ctx.view, message.start, end)
        ctx.send(ctx.id, ack, after_persist=True)
        ctx.send(message.sender, ack, after_persist=True)
        if self._gap_before(message.start):
            self._ask_for_gap(message.sender, ctx.olog.accepted_prefix(ctx.view))
        if ctx.majority > 2:  # with 3 replicas learners need no acknowledgements
            for learner in sorted(set(message.values) - {ctx.id, message.sender, -1}):
                ctx.send(learner, ack, after_persist=True)

    def _gap_before(self, start: int) -> bool:
        olog = self._ctx.olog
        if start <= max(olog.base, olog.commit_prefix):
            return False
        previous = olog.slots.get(start - 1)
        return previous is None or not (previous.committed or previous.view == self._ctx.view)

    def _ask_for_gap(self, sequencer: int, accepted_upto: int) -> None:
        """A run arrived past a hole here: an empty acknowledgement at the hole makes the
        sequencer resend from it (the piggybacked prefix the 5-replica rule needs)."""
        ctx = self._ctx
        ctx.send(sequencer, OAck(ctx.id, ctx.view, accepted_upto, accepted_upto))
