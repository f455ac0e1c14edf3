"""The simulated network: per-link latency, jitter (reordering), loss, duplication, partitions
(symmetric or one-way) and clogging, all drawn from one seeded generator.

`send` returns when (if ever) each copy of a frame arrives; the cluster schedules the arrivals.

Faults are `Disturbance`s: the directed links one fault blocks, and those it slows, so any
shape can be expressed (halves, a majority ring, a bridge, an isolated replica, a one-way cut).
Several may be in force at once, overlapping in time and in links; the links are always what
the faults still in force make them: blocked if any of them blocks it, slowed by the largest
delay among them. Ending one fault (`restore`) never ends another; `heal` ends them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from consensus.prng import Prng

Link: TypeAlias = tuple[int, int]  # (source, target): the frames source sends to target


@dataclass(frozen=True, slots=True)
class LinkFaults:
    loss_ppm: int = 0  # chance a frame is lost, per million
    duplicate_ppm: int = 0  # chance a frame arrives twice
    jitter_us: int = 0  # extra delay drawn uniformly in [0, jitter_us]: reorders frames


@dataclass(frozen=True, slots=True)
class Disturbance:
    """What one network fault does while it is in force."""

    blocked: frozenset[Link] = frozenset()  # no frame passes
    clogged: frozenset[Link] = frozenset()  # every frame takes clog_us longer
    clog_us: int = 0


class Network:
    __slots__ = ("_active", "_blocked", "_clog_us", "_disturbances", "_latency_us", "_prng",
                 "faults", "replica_count")

    def __init__(self, latency_us: list[list[int]], prng: Prng, faults: LinkFaults) -> None:
        self.replica_count = len(latency_us)
        self._latency_us = latency_us
        self._prng = prng
        self.faults = faults
        self._blocked = [[False] * self.replica_count for _ in range(self.replica_count)]
        self._clog_us = [[0] * self.replica_count for _ in range(self.replica_count)]
        self._active: dict[int, Disturbance] = {}  # by the id `disturb` gave it
        self._disturbances = 0  # ids given out

    def arrivals(self, now_us: int, source: int, target: int) -> list[int]:
        """Arrival times of the copies of one frame from source to target (none if lost)."""
        if self._blocked[source][target]:
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

    def _recompute(self) -> None:
        count = self.replica_count
        blocked = [[False] * count for _ in range(count)]
        clog_us = [[0] * count for _ in range(count)]
        for disturbance in self._active.values():
            for source, target in disturbance.blocked:
                blocked[source][target] = True
            for source, target in disturbance.clogged:
                clog_us[source][target] = max(clog_us[source][target], disturbance.clog_us)
        self._blocked, self._clog_us = blocked, clog_us

    def active(self) -> tuple[Disturbance, ...]:
        """The faults in force, oldest first."""
        return tuple(self._active.values())

    def is_blocked(self, source: int, target: int) -> bool:
        return self._blocked[source][target]

    def clog_us(self, source: int, target: int) -> int:
        """The delay the faults in force add to every frame on this link."""
        return self._clog_us[source][target]
