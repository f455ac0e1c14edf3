"""Rejoining after a lost disk: a replica started over on an empty directory takes part again
without breaking a promise it no longer remembers.

A replica's promises and acceptances count in quorums; one that lost them could report
"nothing accepted" where its old self's vote chose a value, or accept a ballot below one it
promised. So a rejoining replica (`Replica.rejoining`) first asks every other replica what it
holds (`RejoinQuery`), and does nothing else until all of them have answered
(`RejoinReport`): any quorum its old life was part of has a member among them, so

- the highest ballot each space was promised, and the highest view, are at least what any
  completed phase 1 with its old vote promised: it adopts them (and will accept nothing
  older);
- every value its old vote may have helped choose is held by some reporter, at an index below
  the highest one reported for its space, or an O-slot below the highest reported end: until
  it knows each of those decided, it answers no other replica's prepare in that space
  (`blind`), counts its own promise in its own rounds only beside a majority of others
  (`consensus.recovery`), and votes for no sequencer and stands for none (`may_vote`);
- its own space resumes above every index anyone holds, with a ballot above every promise,
  through the owner's retake a restart runs (reserving the reported indexes), and its
  command tags in an epoch above every one the others hold of it: in the tags of commands
  they hold (or, Multi-Paxos, deduplicate), and the epoch their drivers heard its lost life
  start in (`heard_old_life`; the runtime's peers name it in their hellos). A lost life that
  moved to a new epoch mid-way (after 2**32 proposals) and whose every command of that epoch
  ran and was compacted everywhere is the one case this misses.

A replica asked first forgets every promise and vote it holds from the asker's past life in
a phase 1 still under way (`Recovery.forget`, `Election.forget`): with a vote of the old life,
a round could complete after it reported, on a promise the new life does not keep. (The
runtime closes the old life's connection before the new one's first frame, and the simulator
drops an older life's frames once a newer one spoke: nothing of the old life arrives later.)

Asking all the others, not a majority, is what makes the forgetting sound: a replica that
missed the query could still complete a round on the old life's promise. So a replica rejoins
only while every other replica is up. One that lost its disk too answers as well, saying it
knows too little (`RejoinReport.cleared` False: while it asks it holds nothing, and until it
is cleared it may lack its own lost life's votes); the asker completes only once fewer than f
of them know too little (it still takes every report's bounds and promises: what a replica
not yet cleared leads or accepted in its new life may be all that records a value chosen
with the asker's lost vote), so that every quorum of f + 1 that held its lost life still has
a member among them that knows all it voted on: in 5 replicas two rejoin together, in 3 one
at a time (two lost at once in 3 wait for ever: a quorum that chose a value may have no
member left that knows it). The gate is on disk (`RejoinRecord`) from the start, so a
rejoining replica that crashes before it is done asks again after its restart.
"""

from __future__ import annotations

from collections.abc import Callable

from consensus.context import Context
from consensus.messages import TAG_EPOCH_MAX, RejoinQuery, RejoinReport
from consensus.records import RejoinRecord

_NONCES = 1 << 62


class Rejoin:
    __slots__ = ("_ctx", "_cursors", "_nonce", "_old_epochs", "_on_reported", "_reports",
                 "c_ends", "cleared", "collecting", "o_end")

    def __init__(self, ctx: Context,
                 on_reported: Callable[[list[RejoinReport]], None]) -> None:
        self._ctx = ctx
        self._on_reported = on_reported
        self._reports: dict[int, RejoinReport] = {}
        self.collecting = False  # asked the others; waiting for all of them
        self.cleared = True  # knows every index and slot its old life may have voted on
        self.c_ends: tuple[int, ...] = ()
        self.o_end = 0
        self._cursors = [0] * ctx.replica_count  # per space: no unknown index below
        # This asking's: a report answering another (a query of a life since lost, slow, and
        # answered after that life went on) says nothing of what that life did since.
        self._nonce = 0
        # Per peer that rejoined: the epoch its lost life had reached, as the driver heard it
        self._old_epochs: dict[int, int] = {}

    def heard_old_life(self, peer: int, epoch: int) -> None:
        """The driver took `peer` back on a new disk; its lost life had reached `epoch`:
        reported to it, so that its tags start above (its own compacted commands leave none)."""
        if epoch <= TAG_EPOCH_MAX:  # beyond, no tag could carry it: not a life of ours
            self._old_epochs[peer] = max(epoch, self._old_epochs.get(peer, 0))

    # --- the rejoining replica ----------------------------------------------------------------

    def begin(self) -> None:
        """A fresh start on an empty disk, by a replica that lived before: ask everyone."""
        self.collecting, self.cleared = True, False
        self._nonce = 1 + self._ctx.prng.below(_NONCES)
        self._reports = {}
        self._ctx.persist(RejoinRecord(False, 0, ()))
        self._ctx.count("rejoin.began")
        self._ask(self._ctx.peers())

    def restore(self, record: RejoinRecord) -> None:
        """Replayed from the log: the last one rules."""
        self.collecting, self.cleared = not record.reported, False
        self.o_end, self.c_ends = record.o_end, record.c_ends

    def _ask(self, peers: tuple[int, ...] | list[int]) -> None:
        ctx = self._ctx
        for peer in peers:  # after the record's sync: a crash before it asks nobody
            ctx.send(peer, RejoinQuery(ctx.id, ctx.view, self._nonce), after_persist=True)

    def on_tick(self) -> None:
        ctx = self._ctx
        if self.cleared or ctx.now % ctx.config.resend_ticks:
            return
        if self.collecting:
            self._ask([peer for peer in ctx.peers() if peer not in self._reports])
        else:
            self.may_vote()  # counts `rejoin.cleared` once it is, for the operator to see

    def on_report(self, message: RejoinReport) -> None:
        if not self.collecting or message.nonce != self._nonce:
            self._ctx.count("rejoin.stale_report")
            return
        ctx = self._ctx
        self._reports[message.sender] = message
        if len(self._reports) < ctx.replica_count - 1:
            return
        reports = [self._reports[sender] for sender in sorted(self._reports)]
        informative = [report for report in reports if report.cleared]
        if ctx.replica_count - 1 - len(informative) >= ctx.config.faults_tolerated:
            # Too many of the others lost their disks too: some quorum its lost life was in
            # may have no member left that knows what it chose. Ask them again until enough
            # of them know all their own lost lives voted on.
            ctx.count("rejoin.waiting_for_others_rejoining")
            self._reports = {report.sender: report for report in informative}
            return
        # The bounds, promises and view come from every report, cleared or not: one not yet
        # cleared may lack its own lost life's votes, but what its new life holds (the
        # instances it leads, what it accepted above its bounds) may be all that records a
        # value chosen with this replica's lost vote.
        count = ctx.replica_count
        self.c_ends = tuple(max(report.c_max_index[space] for report in reports) + 1
                            for space in range(count))
        self.o_end = max(report.o_end for report in reports)
        self.collecting = False
        self._reports = {}
        ctx.count("rejoin.reported")
        self._on_reported(reports)
        # Last, after the promises, view and epoch it adopted: a write torn in this Ready
        # keeps a prefix of its records, and one that kept this record but lost those
        # would restart as if it held them.
        ctx.persist(RejoinRecord(True, self.o_end, self.c_ends))

    def describe(self) -> str | None:
        """Where a rejoin stands, for an operator; None where there is none."""
        if self.collecting:
            waiting = [peer for peer in self._ctx.peers() if peer not in self._reports]
            return ("lost its data directory: it asks every other replica what its lost life "
                    "promised and takes part in nothing meanwhile; no report yet from replicas "
                    f"{', '.join(map(str, waiting))} (each must be up, and know all its own "
                    "lost life voted on if it lost its directory too)")
        if not self.may_vote():
            return ("rejoined after a lost data directory: it serves, but votes for no "
                    "sequencer until it knows decided all its lost life may have voted on")
        return None

    def blind(self, space: int) -> bool:
        """Whether this replica may not report on `space` yet: some index its old life may
        have accepted there is not known decided here."""
        if self.cleared:
            return False
        if self.collecting:
            return True
        self._advance(space)
        return self._cursors[space] < self.c_ends[space]

    def may_vote(self) -> bool:
        """Whether this replica may vote for a sequencer, or stand: it knows every index and
        slot its old life may have voted on decided."""
        if not self.cleared and not self.collecting:
            ctx = self._ctx
            if ctx.olog.commit_prefix >= self.o_end and not any(
                    self.blind(space) for space in range(ctx.replica_count)):
                self.cleared = True
                ctx.count("rejoin.cleared")
        return self.cleared

    def _advance(self, space: int) -> None:
        clog = self._ctx.clog[space]
        cursor, end = max(self._cursors[space], clog.base), self.c_ends[space]
        while cursor < end and clog.is_committed(cursor):
            cursor += 1
        self._cursors[space] = cursor

    # --- every other replica ------------------------------------------------------------------

    def on_query(self, message: RejoinQuery, forget: Callable[[int], None],
                 tag_epoch: Callable[[int], int]) -> None:
        """Forget the asker's old life's votes in rounds under way, then report. A replica
        rejoining itself says so (`cleared` False): while it asks it holds nothing (no
        promise of anyone's, it took part in nothing), and until it is cleared what it holds
        may lack its own lost life's votes."""
        ctx, asker = self._ctx, message.sender
        count = ctx.replica_count
        epoch = self._old_epochs.get(asker, 0)
        if self.collecting:
            promised, max_indexes, o_end = (0,) * count, (-1,) * count, 0
        else:
            forget(asker)
            promised = tuple(ctx.clog[space].promised for space in range(count))
            max_indexes, o_end = ctx.clog.max_indexes(), ctx.olog.end
            epoch = max(epoch, tag_epoch(asker))
        ctx.count("rejoin.reported_to_peer")
        ctx.send(asker, RejoinReport(ctx.id, ctx.view, promised, max_indexes, o_end, epoch,
                                     message.nonce, cleared=self.may_vote()))
