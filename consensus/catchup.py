"""Catch-up: a replica whose execution stalls asks a peer for what it is missing.

The stall may be a lost O-commit or C-commit, or the replica may have been away. A fetch asks
for committed O-instances from the replica's next slot and the committed C-instances they
execute; the answer is capped in entries and bytes, so catching up takes several rounds. The
byte cap bounds the encoded frame, not the payloads: `fetched_bytes_max` counts what msgpack
adds around each command and instance at its largest, so the reply's frame stays within
FETCH_REPLY_BYTES_MAX, the peer mesh's default frame cap; a larger one would be dropped by the
mesh on every retry. A reply carries at least one instance when one is due, so catching up
always progresses: an instance holds at most `batch_bytes_max` bytes of commands or one command
(`ENVELOPE_BYTES_MAX`), far below the cap. A
replica behind the peer's truncation point gets the peer's latest snapshot instead, in chunks,
and installs it before executing anything else. A transfer comes from one sender (chunks of
the same snapshot from two peers may differ byte for byte) and is checked against the digest
the sender computed before it is installed. A fetch is answered with one window of the
snapshot (`snapshot_window_bytes`, ending at a multiple of it): a peer link queues only so many
bytes and drops the rest, so a large snapshot sent whole would never arrive past that point.
The receiver asks the same sender for the next window, from the bytes it holds, as soon as a
window is complete (or, when chunks were lost, once none came for a repair period: asked
while the window's chunks still come in, on a slow link, the sender would send them again
ahead of the next window), for as long as a chunk came in the last TRANSFER_PATIENCE_REPAIRS
repair periods: one lost fetch or chunk must not send it to another peer, which would start
over from the first byte. The sender goes on
serving the snapshot a transfer started on after it compacts again, for as long as the
transfer asks: a large snapshot under load would otherwise start over at every compaction.

Snapshots are also how the log stays bounded: `compact` folds the executed prefix into a
state-machine snapshot and truncates both logs below it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from consensus.codec import ENVELOPE_BYTES_MAX, RECORD_BYTES_MAX
from consensus.config import Mode, ReplicaConfig
from consensus.context import Context
from consensus.executor import Executor
from consensus.learner import Learner
from consensus.messages import (
    NO_CL,
    Batch,
    CEntry,
    FetchedC,
    FetchReply,
    FetchRequest,
    SnapshotChunk,
    SnapshotMeta,
)
from consensus.ready import SnapshotInstall
from consensus.records import CCommitRecord, SnapshotRecord

FETCH_REPLY_BYTES_MAX = 8 << 20  # a FetchReply's whole frame, encoded
STATE_DIGEST_BYTES = 16
# What msgpack spends around the data, at most: an integer 9 bytes, a bin or array header 5.
_INT_BYTES_MAX, _HEADER_BYTES_MAX = 9, 5
COMMAND_OVERHEAD_BYTES = 2 * _INT_BYTES_MAX + _HEADER_BYTES_MAX  # origin, tag, payload header
ENTRY_OVERHEAD_BYTES = 2 * _HEADER_BYTES_MAX + 3 * _INT_BYTES_MAX  # space, index, ballot, batch
O_VALUE_BYTES = _INT_BYTES_MAX
# The frame's list of messages, the message's array, its tag, sender, view, o_start, and the
# headers of its two arrays.
REPLY_OVERHEAD_BYTES = 4 * _HEADER_BYTES_MAX + 4 * _INT_BYTES_MAX
assert REPLY_OVERHEAD_BYTES + ENTRY_OVERHEAD_BYTES + COMMAND_OVERHEAD_BYTES + \
    ENVELOPE_BYTES_MAX < FETCH_REPLY_BYTES_MAX // 4, "one command fits a reply many times"


# A CPromise's frame around its entries: a reply's, and its space, from_index, ballot,
# log_base, max_index and ordered.
PROMISE_OVERHEAD_BYTES = REPLY_OVERHEAD_BYTES + 6 * _INT_BYTES_MAX


def entries_that_fit(entries: Iterable[CEntry]) -> tuple[CEntry, ...]:
    """The leading `entries` a CPromise carries within the peer mesh's frame cap (at least one:
    the largest instance fits a frame alone). The recoverer sees the rest is missing (the last
    entry is below the promise's `max_index`) and asks again past it."""
    kept: list[CEntry] = []
    size = PROMISE_OVERHEAD_BYTES
    for entry in entries:
        size += fetched_bytes_max(entry.batch)
        if kept and size > FETCH_REPLY_BYTES_MAX:
            break
        kept.append(entry)
    return tuple(kept)


def fetched_bytes_max(batch: Batch) -> int:
    """The most bytes an instance holding `batch` adds to an encoded FetchReply."""
    return ENTRY_OVERHEAD_BYTES + sum(len(command.payload) + COMMAND_OVERHEAD_BYTES
                                      for command in batch)


def snapshot_state_bytes_max(config: ReplicaConfig) -> int:
    """The most state bytes a snapshot may hold: within `snapshot_bytes_max`, and small enough
    that its record (the state with its metadata at its largest) fits RECORD_BYTES_MAX. In
    Multi-Paxos mode the metadata holds every origin's dedup window, megabytes of tags."""
    count = config.replica_count
    tags = config.dedup_window_per_origin if config.mode is Mode.MULTIPAXOS else 0
    meta = (16 * _HEADER_BYTES_MAX + _INT_BYTES_MAX
            + count * (4 * _INT_BYTES_MAX + _HEADER_BYTES_MAX + tags * _INT_BYTES_MAX))
    return min(config.snapshot_bytes_max, RECORD_BYTES_MAX - meta)


TRANSFER_PATIENCE_REPAIRS = 4  # repair periods without a chunk before a transfer is given up


def state_digest(state: bytes) -> bytes:
    return hashlib.blake2b(state, digest_size=STATE_DIGEST_BYTES).digest()


@dataclass(frozen=True, slots=True)
class _Transfer:
    """One snapshot on its way from one sender."""
    sender: int
    meta: SnapshotMeta
    total_bytes: int
    state_digest: bytes


class _Served:
    """A snapshot a laggard's transfer started on, its digest, when it last asked, and the end
    of the window last sent and when (-1: none yet)."""

    __slots__ = ("at", "digest", "record", "sent_at", "window_end")

    def __init__(self, record: SnapshotRecord, digest: bytes) -> None:
        self.record = record
        self.digest = digest
        self.at = self.window_end = self.sent_at = -1

    def sent_lately(self, window_end: int, now: int, repair_ticks: int) -> bool:
        """Whether this window went less than a repair period ago: a fetch for it then is a
        copy (fetches queued on a link that was down arrive together), not a loss (the
        laggard asks again only a repair period after its last fetch)."""
        return window_end == self.window_end and now - self.sent_at < repair_ticks


class CatchUp:
    __slots__ = (
        "_asked_at",
        "_ctx",
        "_digest",
        "_executor",
        "_learner",
        "_next_peer",
        "_received",
        "_received_at",
        "_receiving",
        "_serving",
        "before_truncation",
        "commit_hint",
        "commit_hint_view",
        "on_install",
        "settle_upto",
        "snapshot",
    )

    def __init__(self, ctx: Context, executor: Executor, learner: Learner) -> None:
        self._ctx = ctx
        self._executor = executor
        self._learner = learner
        self._asked_at = 0
        self._next_peer = 0
        self.commit_hint = 0  # the sequencer's commit prefix, from its heartbeats
        # The view whose sequencer sent the hint; after a restart or a view change (another
        # view: -1 after a restart), how far behind this replica is stays unknown until the
        # sequencer's next heartbeat
        self.commit_hint_view = 0
        # Behind after a restart, a view change, or enough to need a peer's snapshot:
        # execute up to here before proposing
        self.settle_upto = 0
        self.snapshot: SnapshotRecord | None = None  # the latest, served to laggards
        self._digest: bytes | None = None  # of `snapshot`, once a laggard asked for it
        self._serving: dict[int, _Served] = {}  # per laggard, the snapshot it is being sent
        self._receiving: _Transfer | None = None
        self._received = bytearray()
        self._received_at = 0
        self.on_install: Callable[[], None] = lambda: None
        # Called before the logs are truncated (a compaction, a snapshot installed): what
        # this replica knows of the indexes about to go is settled while it can still be seen.
        self.before_truncation: Callable[[], None] = lambda: None

    def on_commit_hint(self, prefix: int) -> None:
        """The heartbeat of this view's sequencer says slots below `prefix` are committed."""
        if self.commit_hint_view != self._ctx.view:  # its first word: settle up to it
            self.commit_hint_view = self._ctx.view
            self.settle_upto = max(self.settle_upto, prefix)
        self.commit_hint = max(self.commit_hint, prefix)

    def on_restart(self) -> None:
        """Restored from disk: how far behind this replica is stays unknown until the
        sequencer's next heartbeat."""
        self.commit_hint_view = -1

    def knows_how_far_behind(self) -> bool:
        return self.commit_hint_view == self._ctx.view

    def behind(self) -> bool:
        executor = self._executor
        return executor.stall() is not None or self.commit_hint > executor.exec_slot

    def maybe_ask(self) -> None:
        """Ask one peer (the sequencer first, then the others in turn) for missing state."""
        ctx = self._ctx
        if ctx.now - self._asked_at < ctx.config.repair_ticks:
            return
        self._asked_at = ctx.now
        self._drop_overtaken_transfer()
        transfer = self._receiving
        alive = transfer is not None and self._transfer_alive()
        if alive and self._window_arriving():
            # Asked again now, the sender would send the window's rest a second time, behind
            # the chunks still on their way: on a link slower than a window per repair period
            # the copies piled up ahead of the next window until the transfer looked dead and
            # started over at another peer, for ever. Asked once no chunk came for a period.
            ctx.count("catchup.fetch_deferred")
            return
        peers = ctx.peers()
        peer = ctx.sequencer if self._next_peer == 0 and ctx.sequencer != ctx.id else \
            peers[self._next_peer % len(peers)]
        self._next_peer += 1
        snapshot_slot = snapshot_offset = 0
        if transfer is not None and alive:
            # A snapshot under way: its sender sends the rest (another would start over).
            peer, snapshot_slot, snapshot_offset = \
                transfer.sender, transfer.meta.slot, len(self._received)
        ctx.count("catchup.fetch_sent")
        ctx.send(peer, FetchRequest(ctx.id, ctx.view, self._executor.exec_slot,
                                    tuple(self._executor.exec_counts), snapshot_slot,
                                    snapshot_offset))

    # --- serving a fetch --------------------------------------------------------------------

    def on_request(self, message: FetchRequest) -> None:
        ctx = self._ctx
        if message.exec_slot < ctx.olog.base:
            self._send_snapshot(message)
            return
        slot = message.exec_slot
        o_values: list[int] = []
        c_entries: list[FetchedC] = []
        counts = list(message.exec_counts)
        size, limit = REPLY_OVERHEAD_BYTES, ctx.config.fetch_instances_max
        o_limit = ctx.config.o_entries_per_message_max
        full = False  # no more C-instances: the next would not fit, or the count is reached
        while slot < ctx.olog.commit_prefix and len(o_values) < o_limit:
            if size + O_VALUE_BYTES > FETCH_REPLY_BYTES_MAX:
                break
            value = ctx.olog.slots[slot].value
            o_values.append(value)
            size += O_VALUE_BYTES
            slot += 1
            if value == NO_CL or full:
                continue
            c_slot = ctx.clog[value].get(counts[value])
            if c_slot is not None and c_slot.committed:
                entry_bytes = fetched_bytes_max(c_slot.batch)
                if c_entries and size + entry_bytes > FETCH_REPLY_BYTES_MAX:
                    full = True  # the receiver asks again for the rest
                    continue
                c_entries.append(FetchedC(value, counts[value], c_slot.ballot, c_slot.batch))
                size += entry_bytes
                full = len(c_entries) >= limit
            counts[value] += 1
        ctx.send(message.sender, FetchReply(ctx.id, ctx.view, message.exec_slot,
                                            tuple(o_values), tuple(c_entries)))

    def _send_snapshot(self, request: FetchRequest) -> None:
        """One window of a snapshot: of the one the requester's transfer started on, from where
        it stopped, while this replica still serves it; else of the latest, from the start."""
        ctx = self._ctx
        self._forget_idle_transfers()
        served = earlier = self._serving.get(request.sender)
        offset = request.snapshot_offset
        if served is None and self.snapshot is not None and \
                self.snapshot.meta.slot == request.snapshot_slot:
            # The latest, asked for from where a transfer stopped that this replica forgot (it
            # restarted, or the transfer idled): resumed, not started over.
            served = _Served(self.snapshot, self._latest_digest())
        if served is None or served.record.meta.slot != request.snapshot_slot or \
                not 0 < offset < len(served.record.state):
            if self.snapshot is None:
                return
            served = earlier if earlier is not None and earlier.record is self.snapshot else \
                _Served(self.snapshot, self._latest_digest())
            offset = 0
        record, window = served.record, ctx.config.snapshot_window_bytes
        state, end = record.state, min(len(record.state), (offset // window + 1) * window)
        served.at = ctx.now
        if served is earlier and served.sent_lately(end, ctx.now, ctx.config.repair_ticks):
            ctx.count("catchup.snapshot_fetch_repeated")
            return
        served.window_end, served.sent_at = end, ctx.now
        # Kept until it idles, its last window included: a chunk of the last window may be
        # lost too, and the laggard then asks again from where it stopped (forgotten, it would
        # be sent the latest snapshot from its first byte, and start over).
        self._serving[request.sender] = served
        ctx.count("catchup.snapshot_sent")
        chunk = ctx.config.snapshot_chunk_bytes
        for start in range(offset, max(end, 1), chunk):
            ctx.send(request.sender, SnapshotChunk(ctx.id, ctx.view, record.meta, start,
                                                   len(state), served.digest,
                                                   state[start:min(start + chunk, end)]))

    def _latest_digest(self) -> bytes:
        """The latest snapshot's, computed once (each window of each transfer names it)."""
        assert self.snapshot is not None
        if self._digest is None:
            self._digest = state_digest(self.snapshot.state)
        return self._digest

    def _forget_idle_transfers(self) -> None:
        """A snapshot older than the latest is kept only for a transfer still asking for it."""
        patience = TRANSFER_PATIENCE_REPAIRS * self._ctx.config.repair_ticks
        for peer in [peer for peer, served in sorted(self._serving.items())
                     if self._ctx.now - served.at > patience]:
            del self._serving[peer]

    # --- receiving ----------------------------------------------------------------------------

    def on_reply(self, message: FetchReply) -> None:
        ctx = self._ctx
        for offset, value in enumerate(message.o_values):
            self._learner.commit(message.o_start + offset, value)
        for entry in message.c_entries:
            if ctx.clog[entry.space].commit(entry.index, entry.ballot, entry.batch):
                ctx.persist(CCommitRecord(entry.space, entry.index, entry.ballot, entry.batch))
        self._asked_at = ctx.now - ctx.config.repair_ticks  # ask again at once if still behind

    def on_chunk(self, message: SnapshotChunk) -> None:
        ctx = self._ctx
        self._drop_overtaken_transfer()
        if message.meta.slot <= self._executor.exec_slot:
            return
        if message.total_bytes > snapshot_state_bytes_max(ctx.config) or \
                len(message.state_digest) != STATE_DIGEST_BYTES:
            ctx.count("dropped.snapshot_chunk_invalid")
            return
        transfer = _Transfer(message.sender, message.meta, message.total_bytes,
                             message.state_digest)
        if transfer != self._receiving or message.offset != len(self._received):
            # A copy of bytes held (a duplicate, a late answer to an earlier fetch) is no
            # reason to start over: the rest is asked for from where the transfer stopped.
            if message.offset != 0 or transfer == self._receiving or \
                    not self._may_start(transfer):
                return
            self._receiving, self._received = transfer, bytearray()
        self._received_at = ctx.now
        self._received += message.data
        if len(self._received) < message.total_bytes:
            if len(self._received) % ctx.config.snapshot_window_bytes == 0:
                self._asked_at = ctx.now - ctx.config.repair_ticks  # a window is in: ask on
            return
        state = bytes(self._received)
        self._receiving, self._received = None, bytearray()
        if len(state) != message.total_bytes or state_digest(state) != message.state_digest:
            ctx.count("catchup.snapshot_corrupt")
            return
        self.install(message.meta, state, from_peer=True)

    def _drop_overtaken_transfer(self) -> None:
        """A transfer of a snapshot this replica executed past (by the log, from another
        peer) is never finished: its bytes (up to snapshot_bytes_max) go now."""
        if self._receiving is not None and \
                self._receiving.meta.slot <= self._executor.exec_slot:
            self._receiving, self._received = None, bytearray()

    def _may_start(self, transfer: _Transfer) -> bool:
        """A new transfer replaces one under way from the same sender, one for an older
        snapshot, or one that made no progress for a repair period."""
        current = self._receiving
        return (current is None or current.sender == transfer.sender
                or current.meta.slot < transfer.meta.slot or not self._transfer_alive())

    def _window_arriving(self) -> bool:
        """Whether the window asked for is still coming in: part of it is held and a chunk of
        it came within the last repair period."""
        ctx = self._ctx
        return len(self._received) % ctx.config.snapshot_window_bytes != 0 and \
            ctx.now - self._received_at < ctx.config.repair_ticks

    def _transfer_alive(self) -> bool:
        """Whether the transfer under way had a chunk lately (see the module docstring)."""
        ctx = self._ctx
        return ctx.now - self._received_at <= TRANSFER_PATIENCE_REPAIRS * ctx.config.repair_ticks

    def install(self, meta: SnapshotMeta, state: bytes, *, from_peer: bool) -> None:
        """Replace the executed prefix with a snapshot (from a peer, or at restart)."""
        ctx = self._ctx
        covered = self._own_tags_covered(meta) if from_peer else []
        # A sequencer whose own view committed past the snapshot's slot learns nothing of a
        # newer view from it (its execution only lagged); past its commit prefix, a newer
        # view may have chosen what it covers, and a snapshot does not say which view.
        overruled = from_peer and ctx.is_sequencer and meta.slot > ctx.olog.commit_prefix
        self.before_truncation()
        ctx.olog.reset_to_snapshot(meta.slot, meta.o_counts)
        for space, count in enumerate(meta.exec_counts):
            ctx.clog[space].truncate(count)
        self._executor.reset_to(meta)
        self._learner.forget_slots_below(meta.slot)
        self.snapshot, self._digest = SnapshotRecord(meta, state), None
        if from_peer:
            ctx.persist(self.snapshot)
            self.settle_upto = max(self.settle_upto, self.commit_hint)
        pending = ctx.outbox.pending
        pending.executed.clear()  # superseded: the snapshot covers them
        pending.snapshot_to_install = SnapshotInstall(meta, state)
        pending.covered.extend(covered)
        ctx.count("catchup.snapshot_installed")
        self.on_install()
        if overruled:
            self._learner.on_view_overruled()

    def _own_tags_covered(self, meta: SnapshotMeta) -> list[int]:
        """This replica's commands that `meta`'s snapshot applied and this replica's state
        machine will not: executed earlier in this step (that state is being replaced), or
        committed here and not executed yet (an instance only accepted here may have been
        recovered with another value: it is left to time out). Their clients are waiting for
        a result this replica lacks."""
        ctx = self._ctx
        tags = [command.tag for item in ctx.outbox.pending.executed
                for command in item.commands if command.origin == ctx.id]
        ran = self._ran_in(meta)
        for space, count in enumerate(meta.exec_counts):
            log = ctx.clog[space]
            for index in range(self._executor.exec_counts[space], count):
                slot = log.get(index)
                if slot is not None and slot.committed:  # else another value may have won
                    tags.extend(command.tag for command in slot.batch
                                if command.origin == ctx.id and ran(command.tag))
        return tags

    def _ran_in(self, meta: SnapshotMeta) -> Callable[[int], bool]:
        """Whether an own command committed in `meta`'s prefix ran there. Multi-Paxos drops
        repeats: a tag inside the snapshot's dedup window ran; one below it may have been
        dropped without ever running (its Forward lost while later tags filled the window),
        so its outcome stays unknown."""
        if self._ctx.config.mode is not Mode.MULTIPAXOS:
            return lambda tag: True
        return set(meta.dedup_tags[self._ctx.id]).__contains__

    def compact(self, state: bytes) -> SnapshotRecord:
        """Fold the executed prefix into `state`, the state machine's snapshot at this point."""
        ctx = self._ctx
        meta = self._executor.snapshot_meta()
        record = SnapshotRecord(meta, state)
        ctx.persist(record)
        self.before_truncation()
        ctx.olog.truncate(meta.slot)
        for space, count in enumerate(meta.exec_counts):
            ctx.clog[space].truncate(count)
        self._learner.forget_slots_below(meta.slot)
        self.snapshot, self._digest = record, None  # no older state is kept alive by it
        self._forget_idle_transfers()  # nor by a transfer that finished or stopped asking
        return record
