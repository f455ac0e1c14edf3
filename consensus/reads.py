"""Linearizable reads through the sequencer's read index, under its lease (paper §3.5).

A replica asks the sequencer for a read index; the sequencer answers, while it holds a lease
from a majority, with the number of slots it had allocated (the paper's iG: every update that
was ready when the read arrived lies below it). The replica runs the read on its own state once
it has executed that far. Commands are opaque to consensus, so the per-object index iA of the
paper (which needs the key of every command) is not used: iG is always safe.

A lost request is asked again after `resend_ticks`; the driver cancels reads it has given up
on. A refused one (NO_INDEX: the sequencer holds no lease, as after a gap in its grants) is
asked again sooner, with the others refused meanwhile, in rounds that back off: the first
`RETRY_TICKS_MIN` after a refusal, each next one twice as long after the one before, never
longer than `resend_ticks`, from the start again once a read is granted or the view changes.
A sequencer that regains its lease a tick later is asked again a tick later, not 25; one that
keeps refusing is asked five more times in the first 31 ticks, then once every `resend_ticks`
as before (all counted in ticks: deterministic).
Pending reads are bounded. The sequencer's own reads wait for its lease instead: they are
granted when a lease grant renews it, and never on a tick (`on_tick`).

A read granted in an earlier view and still not served `resend_ticks` after its grant is asked
again (a sequencer grants it again at its next lease grant), and runs at the lower of the
indexes granted: each was granted after the read began, under a lease, so either is safe. A
sequencer deposed after it granted an index may have allocated slots that no newer view holds;
the read had waited for as many new writes to fill them, for ever on an idle cluster. (Within
one view every slot allocated is filled in the end, so a read granted there is not asked
again: a lagging replica's reads would ask for nothing.)
"""

from __future__ import annotations

from consensus.config import Defect
from consensus.context import Context
from consensus.executor import Executor
from consensus.messages import NO_INDEX, ReadIndexReply, ReadIndexRequest
from consensus.sequencer import Sequencer

_UNKNOWN = -2  # index not yet granted
RETRY_TICKS_MIN = 1  # a refused read's first retry: the next tick (module docstring)


class Reads:
    __slots__ = ("_asked_at", "_ctx", "_executor", "_granted_at", "_pending", "_refused",
                 "_retry_at", "_retry_ticks", "_retry_view", "_sequencer", "life_epoch")

    def __init__(self, ctx: Context, executor: Executor, sequencer: Sequencer) -> None:
        self._ctx = ctx
        self._executor = executor
        self._sequencer = sequencer
        self._pending: dict[int, int] = {}  # read id -> slots to execute first, or _UNKNOWN
        self._asked_at: dict[int, int] = {}
        # Granted, not served: read id -> (tick, view) of the grant (module docstring).
        self._granted_at: dict[int, tuple[int, int]] = {}
        # Refused reads, asked again together at `_retry_at`; the next round's wait after it,
        # and the view these waits were counted in (module docstring).
        self._refused: set[int] = set()
        self._retry_at: int | None = None
        self._retry_ticks = RETRY_TICKS_MIN
        self._retry_view = ctx.view
        # The epoch this life began in: read ids start again with each life, and a reply to
        # an earlier life's read names an older epoch. (A life may go on into new epochs.)
        self.life_epoch = ctx.epoch

    def read(self, read_id: int) -> None:
        ctx = self._ctx
        if read_id in self._pending:
            return
        if len(self._pending) >= ctx.config.reads_pending_max:
            ctx.outbox.pending.reads_refused.append(read_id)
            return
        if Defect.LOCAL_READS in ctx.config.defects:
            self._pending[read_id] = 0
            return
        self._pending[read_id] = _UNKNOWN
        self._ask(read_id)

    def cancel(self, read_id: int) -> None:
        self._pending.pop(read_id, None)
        self._asked_at.pop(read_id, None)
        self._granted_at.pop(read_id, None)
        self._refused.discard(read_id)

    def _ask(self, read_id: int) -> None:
        ctx = self._ctx
        self._asked_at[read_id] = ctx.now
        if ctx.is_sequencer:
            if self._sequencer.lease_valid():
                self._granted(read_id, self._sequencer.next_slot)
            return
        self._request(read_id)

    def _request(self, read_id: int) -> None:
        ctx = self._ctx
        ctx.send(ctx.sequencer, ReadIndexRequest(ctx.id, ctx.view, read_id, ctx.epoch),
                 after_persist=not ctx.epoch_durable)

    def on_reply(self, message: ReadIndexReply) -> None:
        ctx = self._ctx
        if message.view != ctx.view or message.sender != ctx.sequencer or \
                not self.life_epoch <= message.epoch <= ctx.epoch:  # an earlier life's read
            return
        upto = self._pending.get(message.read_id)
        if message.executed_upto == NO_INDEX and upto == _UNKNOWN:
            self._refused_now(message.read_id)
        elif message.executed_upto != NO_INDEX and upto is not None:
            self._retry_ticks = RETRY_TICKS_MIN  # the sequencer grants again: back off anew
            self._refused.discard(message.read_id)
            self._granted(message.read_id, message.executed_upto if upto == _UNKNOWN
                          else min(upto, message.executed_upto))

    def _refused_now(self, read_id: int) -> None:
        """Ask again in the next retry round; the first refusal after one schedules it."""
        ctx = self._ctx
        self._refused.add(read_id)
        if self._retry_view != ctx.view:  # a new sequencer: its refusals back off anew
            self._retry_view, self._retry_ticks = ctx.view, RETRY_TICKS_MIN
        if self._retry_at is None:
            self._retry_at = ctx.now + self._retry_ticks
            self._retry_ticks = min(self._retry_ticks * 2, ctx.config.resend_ticks)

    def _granted(self, read_id: int, executed_upto: int) -> None:
        self._pending[read_id] = executed_upto
        self._asked_at.pop(read_id, None)
        self._granted_at[read_id] = (self._ctx.now, self._ctx.view)

    def has_servable(self) -> bool:
        if not self._pending:  # the common case, without a generator
            return False
        exec_slot = self._executor.exec_slot
        return any(upto != _UNKNOWN and upto <= exec_slot for upto in self._pending.values())

    def serve(self) -> None:
        """Hand out the reads whose index is executed here."""
        if not self._pending:
            return
        exec_slot = self._executor.exec_slot
        ready = [read_id for read_id, upto in self._pending.items()
                 if upto != _UNKNOWN and upto <= exec_slot]
        for read_id in sorted(ready):
            del self._pending[read_id]
            self._granted_at.pop(read_id, None)
            self._ctx.outbox.pending.reads.append(read_id)

    def on_tick(self) -> None:
        """Ask the sequencer again for the indexes not granted yet. A sequencer grants its own
        reads on inputs only (a read, a lease grant), never on a tick: after a pause the driver
        replays the missed ticks before any input, each at its own past `now`, and a lease
        judged at a replayed tick may have run out long ago in real time."""
        ctx = self._ctx
        if ctx.is_sequencer:
            return
        if self._retry_at is not None and ctx.now >= self._retry_at:
            self._retry_at = None
            refused, self._refused = self._refused, set()
            for read_id in sorted(refused):
                if self._pending.get(read_id) == _UNKNOWN:
                    self._ask(read_id)
        for read_id in sorted(self._asked_at):
            if read_id not in self._refused and \
                    ctx.now - self._asked_at[read_id] >= ctx.config.resend_ticks:
                self._ask(read_id)
        for read_id in self._stranded():
            self._granted_at[read_id] = (ctx.now, self._granted_at[read_id][1])
            self._request(read_id)

    def _stranded(self) -> list[int]:
        """Reads granted in an earlier view, `resend_ticks` or more ago (module docstring)."""
        ctx = self._ctx
        return sorted(read_id for read_id, (tick, view) in self._granted_at.items()
                      if view < ctx.view and ctx.now - tick >= ctx.config.resend_ticks)

    def on_lease_renewed(self) -> None:
        """A lease grant came in: a sequencer holding a lease again grants its waiting reads
        (at once, not at their next resend), and lowers the index of reads granted long ago
        and not served yet (module docstring)."""
        ctx = self._ctx
        if not (ctx.is_sequencer and (self._asked_at or self._granted_at)
                and self._sequencer.lease_valid()):
            return
        upto = self._sequencer.next_slot
        for read_id in sorted(self._asked_at):
            self._granted(read_id, upto)
        for read_id in self._stranded():
            self._granted(read_id, min(self._pending[read_id], upto))
