"""The simulated network: per-link latency, jitter (reordering), loss, duplication, partitions
(symmetric or one-way) and clogging, all drawn from one seeded generator.

`send` returns when (if ever) each copy of a frame arrives; the cluster schedules the arrivals.

Faults are `Disturbance`s: the directed links one fault blocks, holds or slows, so any shape
can be expressed (halves, a majority ring, a bridge, an isolated replica, a one-way cut).
Several may be in force at once, overlapping in time and in links; the links are always what
the faults still in force make them: blocked if any of them blocks it, held if any holds it and
none blocks it, slowed by the largest delay among them. Ending one fault (`restore`) never ends
another; `heal` ends them all.

A blocked link loses every frame sent on it. A held link is cut as a runtime's connection is:
the frames on their way when the hold began are lost with the connection (`severed`), those
sent while it holds wait on the sender's queue (`hold`, bounded; lost if the sender crashes)
and leave, in order, once no fault holds it (`released`; the cluster sends them after a
reconnect delay, and what the link carries next after them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from consensus.prng import Prng

Link: TypeAlias = tuple[int, int]  # (source, target): the frames source sends to target
HELD_FRAMES_MAX = 1024  # frames one link holds while a fault holds it (`Network.hold`)


@dataclass(frozen=True, slots=True)
class LinkFaults:
    loss_ppm: int = 0  # chance a frame is lost, per million
    duplicate_ppm: int = 0  # chance a frame arrives twice
    jitter_us: int = 0  # extra delay drawn uniformly in [0, jitter_us]: reorders frames


@dataclass(frozen=True, slots=True)
class Disturbance:
    """What one network fault does while it is in force."""

    blocked: frozenset[Link] = frozenset()  # no frame passes
    # Frames wait, as on a runtime peer's queue while its connection is down, and go once the
    # link is up again (unless a fault still in force blocks it: then they are lost).
    held: frozenset[Link] = frozenset()
    clogged: frozenset[Link] = frozenset()  # every frame takes clog_us longer
    clog_us: int = 0


class Network:
    __slots__ = ("_active", "_blocked", "_clog_us", "_disturbances", "_held", "_latency_us",
                 "_prng", "_severed", "_waiting", "faults", "replica_count")

    def __init__(self, latency_us: list[list[int]], prng: Prng, faults: LinkFaults) -> None:
        self.replica_count = len(latency_us)
        self._latency_us = latency_us
        self._prng = prng
        self.faults = faults
        self._blocked = [[False] * self.replica_count for _ in range(self.replica_count)]
        self._clog_us = [[0] * self.replica_count for _ in range(self.replica_count)]
        self._held = [[False] * self.replica_count for _ in range(self.replica_count)]
        self._waiting: dict[Link, list[bytes]] = {}  # frames held, per link, in order
        # Per link, how many times a fault began to hold it: each time, its connection closes
        # and the frames on their way are lost with it (`severed`).
        self._severed = [[0] * self.replica_count for _ in range(self.replica_count)]
        self._active: dict[int, Disturbance] = {}  # by the id `disturb` gave it
        self._disturbances = 0  # ids given out

    def arrivals(self, now_us: int, source: int, target: int) -> list[int]:
        """Arrival times of the copies of one frame from source to target (none if lost, or
        held: see `holds`)."""
        if self._blocked[source][target] or self._held[source][target]:
            return []
        faults, prng = self.faults, self._prng
        if faults.loss_ppm and prng.chance_ppm(faults.loss_ppm):
            return []
        copies = 2 if faults.duplicate_ppm and prng.chance_ppm(faults.duplicate_ppm) else 1
        base = now_us + self._latency_us[source][target] + self._clog_us[source][target]
        return [base + (prng.int_inclusive(0, faults.jitter_us) if faults.jitter_us else 0)
                for _ in range(copies)]

    def disturb(self, disturbance: Disturbance) -> int:
        """Put a fault in force, on top of any already in force; returns its id for `restore`."""
        self._disturbances += 1
        self._active[self._disturbances] = disturbance
        self._recompute()
        return self._disturbances

    def restore(self, disturbance_id: int) -> None:
        """End one fault (nothing if it ended already, by `heal`); the others stay in force."""
        if self._active.pop(disturbance_id, None) is not None:
            self._recompute()

    def heal(self) -> None:
        """End every fault."""
        self._active.clear()
        self._recompute()

    def holds(self, source: int, target: int) -> bool:
        """Whether a frame on this link would wait (`hold`) rather than leave."""
        return self._held[source][target] and not self._blocked[source][target]

    def hold(self, source: int, target: int, frame: bytes) -> None:
        """Keep a frame until its link is up again; past `HELD_FRAMES_MAX` on one link it is
        lost, as when a runtime peer's queue is full."""
        waiting = self._waiting.setdefault((source, target), [])
        if len(waiting) < HELD_FRAMES_MAX:
            waiting.append(frame)

    def forget_held_from(self, source: int) -> None:
        """The sender crashed: the frames it held went with its queues."""
        for link in [link for link in self._waiting if link[0] == source]:
            del self._waiting[link]

    def released(self) -> list[tuple[Link, list[bytes]]]:
        """The frames held on links no fault holds any more, by link in order (those on links
        a fault now blocks are lost)."""
        released = []
        for link in sorted(self._waiting):
            source, target = link
            if self._held[source][target]:
                continue
            frames = self._waiting.pop(link)
            if not self._blocked[source][target]:
                released.append((link, frames))
        return released

    def severed(self, source: int, target: int) -> int:
        """How many times a fault began to hold this link: a frame sent under another count
        travelled on a connection closed since, and is lost."""
        return self._severed[source][target]

    def latency_us(self, source: int, target: int) -> int:
        return self._latency_us[source][target]

    def _recompute(self) -> None:
        count = self.replica_count
        blocked = [[False] * count for _ in range(count)]
        held = [[False] * count for _ in range(count)]
        clog_us = [[0] * count for _ in range(count)]
        for disturbance in self._active.values():
            for source, target in disturbance.blocked:
                blocked[source][target] = True
            for source, target in disturbance.held:
                held[source][target] = True
            for source, target in disturbance.clogged:
                clog_us[source][target] = max(clog_us[source][target], disturbance.clog_us)
        for source in range(count):
            for target in range(count):
                if held[source][target] and not self._held[source][target]:
                    self._severed[source][target] += 1
        self._blocked, self._held, self._clog_us = blocked, held, clog_us

    def active(self) -> tuple[Disturbance, ...]:
        """The faults in force, oldest first."""
        return tuple(self._active.values())

    def is_blocked(self, source: int, target: int) -> bool:
        return self._blocked[source][target]

    def clog_us(self, source: int, target: int) -> int:
        """The delay the faults in force add to every frame on this link."""
        return self._clog_us[source][target]
