"""Commit notices held back from quiet peers, to ride on the next message or leave at the tick.

A command leader tells every peer it committed a C-instance (CCommit), and the replica an
O-instance names tells every peer its commit (OCommit). A peer needs them soon only when
something waits on them there: its own commands, which execute in the global order after
everything before them; a read it serves; a gap it asks to fill. A peer that does none of
these (a follower whose clients are elsewhere, the acceptor of another's commands) only
executes later what it is told, so a notice to it may wait a little without anyone waiting
longer for an answer.

At one caller with the clients on the sequencer's replica, the notices were a frame of their
own to each follower after every put: a wake-up, a read, a decode, a log write and an
execution in each follower process per put, and on two cores the idle follower's turn held up
the acceptor's acknowledgement of the next put about a quarter of a millisecond a put (perf
sched). Held, a notice to the acceptor rides in the frame of the next put's accepts (one
wake-up there instead of two), and the idle follower takes a tick's notices in one turn.

A peer is quiet when it sent none of the messages that show it waits on commits
(`WAITS_ON_COMMITS`: it leads commands, orders them, serves a read, fills a gap, forwards a
command) in the last `quiet_after_ticks` ticks. Notices to a quiet peer are held until:
- the Ready being made carries another message to that peer (they leave in the same frame);
- that peer sends such a message (it has begun to wait: they leave with the answer to it);
- the next tick (so a quiet peer executes at most one tick late: its watches answer that much
  later, and a recovery after the sender's crash finds at most a tick of instances whose
  commit it must learn again, which it does as for any notice lost with a crash);
- `HELD_PER_PEER_MAX` are held for it.

Nothing here is needed for safety: a commit notice only spreads a decided fact sooner, and
catch-up, heartbeats' commit prefix and recovery teach it anyway.
"""

from __future__ import annotations

from consensus.messages import (
    CAccept,
    CRequest,
    FetchRequest,
    Forward,
    Message,
    OAccept,
    ReadIndexRequest,
)
from consensus.ready import Outbox

HELD_PER_PEER_MAX = 64  # notices held for one peer; one more sends them all
# A peer that sends one of these waits on commits: it leads commands (CAccept), orders them
# (OAccept), serves a read, asks for an instance or a snapshot it misses, forwards a command
WAITS_ON_COMMITS = frozenset({CAccept, OAccept, ReadIndexRequest, CRequest, FetchRequest,
                              Forward})


class NoticeHold:
    """Per peer: the tick it last showed it waits on commits, and the notices held for it."""

    __slots__ = ("_held", "_outbox", "_quiet_after_ticks", "_waited_at")

    def __init__(self, outbox: Outbox, replica_count: int, quiet_after_ticks: int) -> None:
        self._outbox = outbox
        self._quiet_after_ticks = quiet_after_ticks  # 0: nothing is ever held
        self._waited_at = [-quiet_after_ticks - 1] * replica_count  # every peer starts quiet
        self._held: dict[int, list[Message]] = {}

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def send(self, peer: int, message: Message, now: int) -> None:
        """Send a commit notice, or hold it while `peer` is quiet."""
        if not self._quiet_after_ticks or now - self._waited_at[peer] <= self._quiet_after_ticks:
            self._outbox.send(peer, message)
            return
        held = self._held.get(peer)
        if held is None:
            held = self._held[peer] = []
        held.append(message)
        if len(held) > HELD_PER_PEER_MAX:
            self._release(peer)

    def broadcast(self, peers: tuple[int, ...], message: Message, now: int) -> None:
        """`send` to each of `peers`."""
        for peer in peers:
            self.send(peer, message, now)

    def waits(self, peer: int, now: int) -> None:
        """`peer` sent a message showing it waits on commits: it is not quiet, and what is
        held for it leaves with this step's Ready."""
        self._waited_at[peer] = now
        if peer in self._held:
            self._release(peer)

    def release_riding(self) -> None:
        """Held notices to peers the pending Ready already sends to join those messages (in
        the same list, so the driver puts them in the same frame)."""
        pending = self._outbox.pending
        if not (pending.messages or pending.messages_after_persist):
            return
        early = {peer for peer, _ in pending.messages}
        late = {peer for peer, _ in pending.messages_after_persist}
        for peer in [peer for peer in self._held if peer in early or peer in late]:
            notices = self._held.pop(peer)
            target = pending.messages if peer in early else pending.messages_after_persist
            target.extend([(peer, notice) for notice in notices])

    def release_all(self) -> None:
        """The tick: everything held leaves, in the order the peers were first held for."""
        for peer in list(self._held):
            self._release(peer)

    def _release(self, peer: int) -> None:
        send = self._outbox.send
        for notice in self._held.pop(peer):
            send(peer, notice)
