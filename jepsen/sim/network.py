"""The simulated network: per-link latency, jitter (reordering), loss, duplication, partitions
(symmetric or one-way) and clogging, all drawn from one seeded generator.

`send` returns when (if ever) each copy of a frame arrives; the cluster schedules the arrivals.
Partitions are a matrix of blocked links, so any shape can be expressed: halves, a majority
ring, a bridge, an isolated replica, or a one-way cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from consensus.prng import Prng


@dataclass(frozen=True, slots=True)
class LinkFaults:
    loss_ppm: int = 0  # chance a frame is lost, per million
    duplicate_ppm: int = 0  # chance a frame arrives twice
    jitter_us: int = 0  # extra delay drawn uniformly in [0, jitter_us]: reorders frames


class Network:
    __slots__ = ("_blocked", "_clog_us", "_latency_us", "_prng", "faults", "replica_count")

    def __init__(self, latency_us: list[list[int]], prng: Prng, faults: LinkFaults) -> None:
        self.replica_count = len(latency_us)
        self._latency_us = latency_us
        self._prng = prng
        self.faults = faults
        self._blocked = [[False] * self.replica_count for _ in range(self.replica_count)]
        self._clog_us = [[0] * self.replica_count for _ in range(self.replica_count)]

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

    def heal(self) -> None:
        for blocked in self._blocked:
            blocked[:] = [False] * self.replica_count
        for row in self._clog_us:
            row[:] = [0] * self.replica_count

    def partition(self, groups: list[list[int]]) -> None:
        """Only replicas in a common group talk (a replica may be in several: a bridge)."""
        for source in range(self.replica_count):
            for target in range(self.replica_count):
                together = any(source in group and target in group for group in groups)
                self._blocked[source][target] = source != target and not together

    def cut_one_way(self, source: int, target: int) -> None:
        self._blocked[source][target] = True

    def clog(self, source: int, target: int, delay_us: int) -> None:
        self._clog_us[source][target] = delay_us

    def is_blocked(self, source: int, target: int) -> bool:
        return self._blocked[source][target]
