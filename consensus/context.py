"""The state every role of a replica shares: configuration, view and status, the two logs,
logical time, the outbox, and counters.

The replica is split into roles (command leader, acceptor, learner, sequencer, executor,
election, recovery, catch-up, reads), each a small class holding its own state and this context.
Only the replica object dispatches inputs; roles never call the driver.
"""

from __future__ import annotations

import enum
from collections import Counter

from consensus.command_log import CommandLog
from consensus.config import ReplicaConfig
from consensus.messages import Message
from consensus.notice_hold import NoticeHold
from consensus.order_log import OrderLog
from consensus.prng import Prng
from consensus.ready import Outbox


class Status(enum.Enum):
    NORMAL = "normal"  # serving in `view`
    CANDIDATE = "candidate"  # asked for votes for `view`
    ESTABLISHING = "establishing"  # won `view`; a majority must accept the rebuilt log
    AWAITING = "awaiting"  # voted for `view`; waiting for its sequencer's rebuilt log


class DiskMark:
    """How far a value whose records the replica persists is on disk: the value a `ready()`
    hands out a record of is durable once its `advance()` comes (steps between the two may
    move the value on, into the next Ready)."""

    __slots__ = ("_handed_out", "durable")

    def __init__(self, durable: int) -> None:
        self._handed_out = self.durable = durable

    def drained(self, value: int) -> None:
        """The Ready being handed out holds the record of `value`."""
        self._handed_out = value

    def persisted(self) -> None:
        """The last Ready handed out is on disk."""
        self.durable = self._handed_out


class Context:
    __slots__ = ("_delay8", "clog", "config", "epoch", "epoch_on_disk", "heard_at", "id",
                 "lease_holder", "lease_until", "majority", "notices", "now", "olog", "outbox",
                 "persist", "prng", "replica_count", "send", "stats", "status", "view")

    def __init__(self, config: ReplicaConfig, prng: Prng) -> None:
        self.config = config
        self.id = config.replica_id
        self.replica_count = config.replica_count
        self.majority = config.majority
        self.prng = prng
        self.outbox = Outbox(config.replica_id)
        # `send(to, message, after_persist=False)` and `persist(record)` are the outbox's own,
        # bound once: every role calls them several times a command.
        self.send = self.outbox.send
        self.persist = self.outbox.persist
        # Commit notices go through `notices.send`: held a while for quiet peers
        self.notices = NoticeHold(self.outbox, config.replica_count,
                                  config.notices_quiet_after_ticks)
        self.olog = OrderLog(config.replica_count)
        self.clog = CommandLog(config.replica_count)
        self.now = 0
        self.view = 0
        self.status = Status.NORMAL
        self.epoch = 0
        self.epoch_on_disk = DiskMark(0)
        # Until this tick this replica votes for no sequencer but `lease_holder`: it granted
        # that replica a read lease.
        self.lease_until = 0
        self.lease_holder = -1
        self.stats: Counter[str] = Counter()
        self.heard_at = [0] * config.replica_count  # tick of the last message from each
        self._delay8 = [0] * config.replica_count  # acknowledgement delay per peer, ticks * 8

    @property
    def epoch_durable(self) -> bool:
        """Whether the epoch is on disk: until it is, a crash could start the next life with
        the same epoch, so nothing that names it may leave before the sync."""
        return self.epoch_on_disk.durable == self.epoch

    @property
    def sequencer(self) -> int:
        return self.view % self.replica_count  # config.sequencer_of, read several times a step

    @property
    def is_sequencer(self) -> bool:
        return self.status is Status.NORMAL and self.view % self.replica_count == self.id

    def peers(self) -> tuple[int, ...]:
        return self.config.peers

    def note_delay(self, peer: int, ticks: int) -> None:
        """An acknowledgement from `peer` took `ticks`: update its moving average (1/8)."""
        self._delay8[peer] += ticks - self._delay8[peer] // 8

    def nearest_peers(self, count: int, demoted: set[int] | None = None) -> tuple[int, ...]:
        """The first `count` peers in preference order (thrifty fan-out), passing over peers
        silent for an election timeout and peers that answer far slower than the fastest
        (the paper's prototype likewise reorders peers by measured latency). `demoted`: the
        `demoted_peers()` of a caller that needs them too (found once)."""
        peers = self.config.peers
        if not self.config.thrifty:
            return peers
        nearest = peers[:count]
        if demoted is None:
            demoted = self.demoted_peers()
        if not demoted or demoted.isdisjoint(nearest):
            return nearest
        return tuple(sorted(peers, key=demoted.__contains__)[:count])

    def demoted_peers(self) -> set[int]:
        """The peers silent for an election timeout, or answering far slower than the fastest
        peer (twice its delay, plus two ticks): the fastest is found once for all of them."""
        delay8, heard_at, peers = self._delay8, self.heard_at, self.config.peers
        slow8 = 2 * min([delay8[peer] for peer in peers]) + 16
        silent_before = self.now - self.config.election_ticks
        return {peer for peer in peers if heard_at[peer] < silent_before or delay8[peer] > slow8}

    def broadcast(self, message: Message, *, after_persist: bool = False) -> None:
        for peer in self.config.peers:
            self.outbox.send(peer, message, after_persist=after_persist)

    def count(self, name: str, amount: int = 1) -> None:
        self.stats[name] += amount
