"""Linearizable reads through the sequencer's read index, under its lease (paper §3.5).

A replica asks the sequencer for a read index; the sequencer answers, while it holds a lease
from a majority, with the number of slots it had allocated (the paper's iG: every update that
was ready when the read arrived lies below it). The replica runs the read on its own state once
it has executed that far. Commands are opaque to consensus, so the per-object index iA of the
paper (which needs the key of every command) is not used: iG is always safe.

A refused or lost request is asked again after `resend_ticks`; the driver cancels reads it has
given up on. Pending reads are bounded. The sequencer's own reads wait for its lease instead:
they are granted when a lease grant renews it, and never on a tick (`on_tick`).

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


class Reads:
    __slots__ = ("_asked_at", "_ctx", "_executor", "_granted_at", "_pending", "_sequencer",
                 "life_epoch")

    def __init__(self, ctx: Context, executor: Executor, sequencer: Sequencer) -> None:
        self._ctx = ctx
        self._executor = executor
        self._sequencer = sequencer
        self._pending: dict[int, int] = {}  # read id -> slots to execute first, or _UNKNOWN
        self._asked_at: dict[int, int] = {}
        # Granted, not served: read id -> (tick, view) of the grant (module docstring).
        self._granted_at: dict[int, tuple[int, int]] = {}
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
        if message.executed_upto != NO_INDEX and upto is not None:
            self._granted(message.read_id, message.executed_upto if upto == _UNKNOWN
                          else min(upto, message.executed_upto))

    def _granted(self, read_id: int, executed_upto: int) -> None:
        self._pending[read_id] = executed_upto
        self._asked_at.pop(read_id, None)
        self._granted_at[read_id] = (self._ctx.now, self._ctx.view)

    def has_servable(self) -> bool:
        exec_slot = self._executor.exec_slot
        return any(upto != _UNKNOWN and upto <= exec_slot for upto in self._pending.values())

    def serve(self) -> None:
        """Hand out the reads whose index is executed here."""
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
        for read_id in sorted(self._asked_at):
            if ctx.now - self._asked_at[read_id] >= ctx.config.resend_ticks:
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
