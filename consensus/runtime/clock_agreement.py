"""Whether this replica's stamps agree with a majority of its group's: the sequencer's Ticks
wait for it.

Only the sequencer's Tick moves the state machine's logical time freely (statemachine/
logical_time.py): by the Ticks' stamps, node leases expire, preemption deadlines pass and
sessions judge commands too old. The stamp clock (stamp_clock.py) keeps a wall-clock step at
run time from reaching the stamps, but it starts from the wall clock: a replica booted with
its clock an hour ahead (a dead RTC battery, a VM restored from an old image, NTP not yet
synced) and elected sequencer would carry logical time an hour on with its first Tick,
expiring every node's lease and session at once; one booted an hour behind would stall every
expiry for an hour. Nothing in the state could undo either.

So each dialer's hello carries its stamp as it sends it (peers.py), and the replica that hears
it notes how far that stamp is from its own (`heard`). The replica's stamps agree with the
group's (`agrees`) when, counting itself, a majority of the group is within `SKEW_MS_MAX` of
them: its own stamps and those of enough peers to form a majority. Since any two majorities
share a replica, two replicas that both agree are within twice the bound of each other.
The driver proposes Ticks only while the sequencer's stamps agree; otherwise it withholds them,
counts each one withheld and logs an ERROR once, naming the offsets, until they agree again
(at boot, until a majority's hellos are heard, it withholds them without a word).
Logical time then waits (commands from other replicas move it at most the stamp lead past the
last Tick): leases outlive their nodes a while, instead of every lease ending at once, which no
one can undo. Not for long where the rest of the group agrees: every driver tells its core,
once a system period, whether its clock agrees and whether its sequencer's is off (`is_off`),
and followers that agree and find the sequencer off replace it as they replace a straggler
(consensus/election.py); the replica that is off stands for election only after the others.

An offset is measured once per connection, at its hello: the one-way delay is in it (well
under the bound on any network a group runs on), and the stamps of two running replicas
drift apart at most 1 % while one slews a step in (stamp_clock.py), so a reconnect (every
restart) measures again. A group of one replica agrees with itself. Peers not yet heard count
as disagreeing: a sequencer that heard no one cannot commit a Tick anyway.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("cellar.clock_agreement")

# How far another replica's stamps may be from this one's and still count as agreeing: well
# past NTP's milliseconds and a network's one-way delay, far inside the seconds the state
# machine judges by (agents' 2 s heartbeats, 10 s leases, a 300 s session window).
SKEW_MS_MAX = 1_000


class ClockAgreement:
    """The offsets of the peers' stamps from this replica's, as their hellos said."""

    __slots__ = ("_offsets_ms", "_withholding", "replica_count", "skew_ms_max")

    def __init__(self, replica_count: int, *, skew_ms_max: int = SKEW_MS_MAX) -> None:
        if replica_count < 1 or skew_ms_max < 0:
            raise ValueError(f"a group of {replica_count} replicas and a skew of "
                             f"{skew_ms_max} ms: need at least 1 and 0")
        self.replica_count = replica_count
        self.skew_ms_max = skew_ms_max
        self._offsets_ms: dict[int, int] = {}  # peer -> its stamp less this replica's
        self._withholding = False

    def heard(self, peer: int, their_stamp_ms: int, our_stamp_ms: int) -> None:
        """`peer`'s hello said `their_stamp_ms` when this replica's stamp was `our_stamp_ms`."""
        self._offsets_ms[peer] = their_stamp_ms - our_stamp_ms

    def is_off(self, peer: int) -> bool:
        """Whether `peer`'s stamps were more than the bound from this replica's at its latest
        hello (a peer not heard is not judged off)."""
        offset = self._offsets_ms.get(peer)
        return offset is not None and abs(offset) > self.skew_ms_max

    @property
    def offsets_ms(self) -> dict[int, int]:
        """Each peer heard: its stamp less this replica's, at its latest hello."""
        return dict(sorted(self._offsets_ms.items()))

    def agrees(self) -> bool:
        """Whether a majority of the group, this replica counted, is within the bound."""
        near = sum(1 for peer in self._offsets_ms if not self.is_off(peer))
        return 1 + near > self.replica_count // 2

    def may_tick(self, replica_id: int) -> bool:
        """Whether a Tick may be stamped now: while the stamps agree (the driver counts those
        withheld). The first of a run withheld with a peer heard off by more than the bound
        is logged as an ERROR (one withheld only because too few peers were heard yet, as at
        boot, is not), and the first let through after it as agreeing again."""
        if self.agrees():
            if self._withholding:
                self._withholding = False
                logger.warning("replica %d: its stamps agree with a majority again (peers' "
                               "offsets %s ms); Ticks resume", replica_id, self.offsets_ms)
            return True
        far = any(self.is_off(peer) for peer in self._offsets_ms)
        if far and not self._withholding:
            self._withholding = True
            logger.error(
                "replica %d: sequencer, but its clock is not within %d ms of a majority of "
                "its group's (peers' stamps less its own, at their hellos: %s ms, of %d "
                "replicas); it withholds its Ticks, so no lease expires by a clock that may "
                "be wrong; followers whose clocks agree replace it as sequencer. Check NTP "
                "and the time on every replica's machine, then restart the one that is off",
                replica_id, self.skew_ms_max, self.offsets_ms,
                self.replica_count)
        return False
