"""Command-leader recovery: finishing a silent leader's C-instances, so execution never waits
on a dead replica (paper §3.3).

A replica whose execution is stuck on C(n, k) runs Paxos over n's space with a higher ballot:
phase 1 from k (every acceptor reports what it accepted there and the highest index it holds),
then phase 2 for every index from k up to the highest reported (and at least k): the value with
the highest ballot, or a no-op where nobody accepted anything. Values reported committed are
learned directly. The owner uses the same rounds to take its space back after someone recovered
it; it then learns which of its commands lost their index and proposes them again. After a
restart the owner's first complete round also waits for the sequencer's promise, which
counts the O-instances naming the owner (only the sequencer knows them all): every index
they order is decided in the round (a no-op where nobody holds a value), so that no new
command takes an index ordered before it was proposed (the restarted owner may have asked
for orders it has no record of). From that promise on, the sequencer refuses C-requests
below the promised ballot (sent before the restart, still on the way). The same round decides
every index the owner had reserved on disk before the crash: a C-accept may have reached an
acceptor outside the round's quorum, and a later view orders any index a voter accepted.

A round that meets a higher ballot gives up (another recoverer, or the owner, is at work); a
recoverer's round that meets an acceptor which truncated past `k` gives up too: this replica
is behind and must catch up from a snapshot instead. The owner's round goes on from the
highest truncation point its promises report: the indexes below it are decided (executed
there), so no round may propose there, and the owner settles its own proposals there from
what it knows (giving up had it retry from the same index until it compacted past it, its
proposals held back all the while). After giving up, a replica waits a random backoff
(drawn from a window that doubles with each failure in a row) before it tries that space
again: recoverers that retried at once preempted each other forever (a simulated 5-replica
cluster stalled for seconds with four recoverers and the owner dueling over one index).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from consensus.command_log import next_ballot
from consensus.context import Context
from consensus.messages import (
    NO_INDEX,
    NOOP,
    Batch,
    CAccept,
    CAck,
    CCommit,
    CNack,
    CPrepare,
    CPromise,
)
from consensus.records import CCommitRecord

_BACKOFF_DOUBLINGS_MAX = 4  # the backoff window grows to recovery_ticks * 4 at most


@dataclass(frozen=True, slots=True)
class Retaken:
    """What an owner's round settled: every index in [start, top] is decided, with `chosen`
    holding its value. `start` is where the round began, or past it where an acceptor had
    executed and truncated the indexes between (decided, their values perhaps unknown
    here). `complete` when no acceptor reported anything accepted past `top` (then the
    ballot may carry the owner's own unfinished proposals there as they are). An incomplete
    round (a promise held as many instances as a promise may carry) says nothing past `top`:
    the owner runs another round from there before it proposes anything."""
    ballot: int
    chosen: dict[int, Batch]
    start: int
    top: int
    complete: bool


@dataclass(slots=True)
class Round:
    space: int
    from_index: int  # an owner's round moves it up past what an acceptor truncated
    ballot: int
    started: int
    owner: bool
    promises: dict[int, CPromise] = field(default_factory=dict)
    proposals: dict[int, Batch] = field(default_factory=dict)
    acks: dict[int, set[int]] = field(default_factory=dict)
    chosen: dict[int, Batch] = field(default_factory=dict)
    top: int = -1
    complete: bool = True


class Recovery:
    __slots__ = ("_ctx", "_failures", "_highest_seen", "_not_before", "_on_retaken",
                 "_owner_retry_from", "blind", "order_unknown", "reserved_top", "rounds")

    def __init__(self, ctx: Context, on_retaken: Callable[[Retaken], None]) -> None:
        self._ctx = ctx
        self._on_retaken = on_retaken
        self._highest_seen = [0] * ctx.replica_count
        self._failures = [0] * ctx.replica_count  # rounds given up in a row, per space
        self._not_before = [0] * ctx.replica_count  # backoff: no round before this tick
        self._owner_retry_from: int | None = None  # the owner's retake, waiting its backoff
        # After a restart: how many O-instances name this replica is unknown (it may have
        # asked for orders it has no record of), until an owner's round hears the sequencer.
        self.order_unknown = False
        # After a restart: the highest own index reserved on disk (a C-accept may have left
        # for it, its own acceptance lost in the crash), until an owner's round decides it.
        self.reserved_top = -1
        self.rounds: dict[int, Round] = {}
        # Whether this replica's own promise in a space says too little (`consensus.rejoin`:
        # it lost its disk): then a round needs a majority of promises besides its own.
        self.blind: Callable[[int], bool] = lambda space: False

    def forget(self, replica: int) -> None:
        """`replica` started over on an empty disk: its old promises in rounds still in phase
        1 no longer hold (`consensus.rejoin`)."""
        for space in sorted(self.rounds):
            round_ = self.rounds[space]
            if not round_.proposals and round_.promises.pop(replica, None) is not None:
                self._ctx.count("rejoin.promise_forgotten")

    def start(self, space: int, from_index: int) -> None:
        ctx = self._ctx
        if space in self.rounds:
            return
        if ctx.now < self._not_before[space]:
            if space == ctx.id:  # the owner must retake its space: once the backoff ends
                self._owner_retry_from = from_index
            return
        base = max(ctx.clog[space].promised, self._highest_seen[space])
        ballot = next_ballot(base, ctx.id)
        self.rounds[space] = Round(space, from_index, ballot, ctx.now, space == ctx.id)
        ctx.count("recovery.started")
        prepare = CPrepare(ctx.id, ctx.view, space, from_index, ballot)
        ctx.send(ctx.id, prepare)
        ctx.broadcast(prepare)

    def on_promise(self, message: CPromise) -> None:
        round_ = self.rounds.get(message.space)
        if round_ is None or message.ballot != round_.ballot or round_.proposals:
            return
        if message.log_base > round_.from_index:
            if not round_.owner:
                self._give_up(round_, "recovery.behind_truncation")
                return
            # Decided below: the promises already in still cover every index from here.
            round_.from_index = message.log_base
            self._ctx.count("recovery.owner_past_truncation")
        round_.promises[message.sender] = message
        # Its own promise comes only once its record is durable (and never while this replica
        # does not serve): without it the ballot is on no disk here, and a restart could pick
        # it again for another value.
        needed = self._ctx.majority + (1 if self.blind(round_.space) else 0)
        if len(round_.promises) >= needed and self._ctx.id in round_.promises \
                and not self._awaits_order(round_):
            self._propose(round_)

    def _awaits_order(self, round_: Round) -> bool:
        """A restarted owner's round waits for the sequencer's promise: only the sequencer
        knows every O-instance naming this replica (thrifty O-accepts skip acceptors), and
        an index one names must never take a new command (it may run ahead of commands ready
        before that command was proposed: the paper's invariant 7)."""
        return round_.owner and self.order_unknown and all(
            promise.ordered == NO_INDEX for promise in round_.promises.values())

    def _propose(self, round_: Round) -> None:
        promises = [round_.promises[sender] for sender in sorted(round_.promises)]
        # A stalled replica must decide the index it waits on; an owner taking its space
        # back need only decide what someone reports accepted.
        floor = -1 if round_.owner else round_.from_index
        top = max([floor, *(promise.max_index for promise in promises)])
        for promise in promises:
            if promise.entries and promise.entries[-1].index < promise.max_index:
                # Cut (by count or by bytes): the rest in a later round.
                top = min(top, promise.entries[-1].index)
                round_.complete = False
        if round_.owner and round_.complete:
            # Indexes the sequencer ordered are decided too (a no-op where nobody holds a
            # value), so that the owner's next index is past every one of them.
            # So are the indexes reserved before a restart: a C-accept may have left for any
            # of them, and a later view may order it for that value, ahead of commands
            # ready by then: a new command must never take it.
            top = max([top, self.reserved_top, *(promise.ordered - 1 for promise in promises)])
        round_.top = top
        best: dict[int, tuple[bool, int, Batch]] = {}
        for promise in promises:
            for entry in promise.entries:
                current = best.get(entry.index)
                candidate = (entry.committed, entry.ballot, entry.batch)
                if current is None or candidate[:2] > current[:2]:
                    best[entry.index] = candidate
        for index in range(round_.from_index, top + 1):
            committed, _, batch = best.get(index, (False, 0, NOOP))
            if committed:
                self._learn(round_, index, batch)
            else:
                self._accept(round_, index, batch)
        self._maybe_finish(round_)

    def _accept(self, round_: Round, index: int, batch: Batch) -> None:
        ctx = self._ctx
        round_.proposals[index] = batch
        round_.acks[index] = set()
        accept = CAccept(ctx.id, ctx.view, round_.space, index, round_.ballot, batch)
        ctx.send(ctx.id, accept)
        ctx.broadcast(accept)

    def _learn(self, round_: Round, index: int, batch: Batch) -> None:
        ctx = self._ctx
        if ctx.clog[round_.space].commit(index, round_.ballot, batch):
            ctx.persist(CCommitRecord(round_.space, index, round_.ballot, batch))
        round_.chosen[index] = batch

    def on_ack(self, message: CAck) -> bool:
        """Count an acknowledgement; False when it belongs to no recovery round."""
        round_ = self.rounds.get(message.space)
        if round_ is None or message.ballot != round_.ballot:
            return False
        acks = round_.acks.get(message.index)
        if acks is None:
            return True
        acks.add(message.sender)
        if len(acks) >= self._ctx.majority:
            self._chosen(round_, message.index)
        return True

    def _chosen(self, round_: Round, index: int) -> None:
        ctx = self._ctx
        batch = round_.proposals[index]
        del round_.acks[index]
        self._learn(round_, index, batch)
        ctx.broadcast(CCommit(ctx.id, ctx.view, round_.space, index, round_.ballot, batch))
        self._maybe_finish(round_)

    def _maybe_finish(self, round_: Round) -> None:
        if round_.acks:
            return
        del self.rounds[round_.space]
        self._failures[round_.space] = 0
        self._ctx.count("recovery.finished")
        if round_.owner:
            if round_.complete:
                self.order_unknown = False
                self.reserved_top = -1
            self._on_retaken(Retaken(round_.ballot, round_.chosen, round_.from_index,
                                     round_.top, round_.complete))

    def on_nack(self, message: CNack) -> bool:
        """A higher ballot was promised; False when no round of ours is concerned."""
        space = message.space
        self._highest_seen[space] = max(self._highest_seen[space], message.promised)
        round_ = self.rounds.get(space)
        if round_ is None or message.promised <= round_.ballot:
            return round_ is not None
        self._give_up(round_, "recovery.preempted")
        if round_.owner:
            self.start(space, round_.from_index)
        return True

    def _give_up(self, round_: Round, reason: str) -> None:
        ctx, space = self._ctx, round_.space
        self.rounds.pop(space, None)
        ctx.count(reason)
        self._failures[space] = min(self._failures[space] + 1, _BACKOFF_DOUBLINGS_MAX)
        window_ticks = max(1, ctx.config.recovery_ticks // 4) << self._failures[space]
        self._not_before[space] = ctx.now + 1 + ctx.prng.below(window_ticks)

    def on_tick(self) -> None:
        ctx = self._ctx
        if self._owner_retry_from is not None and ctx.now >= self._not_before[ctx.id]:
            from_index, self._owner_retry_from = self._owner_retry_from, None
            self.start(ctx.id, from_index)
        for space in sorted(self.rounds):
            round_ = self.rounds[space]
            if ctx.now - round_.started >= ctx.config.recovery_ticks:
                self._give_up(round_, "recovery.timed_out")
                if round_.owner:
                    self.start(space, round_.from_index)
