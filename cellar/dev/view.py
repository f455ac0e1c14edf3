"""The live terminal view of `cellar dev`: one refresh a second.

It shows which replica is the sequencer and each replica's progress, commits per second and
client latency over the last second, gangs and GPUs allocated per tenant, and what the nodes
and the scheduler did. On a terminal it redraws in place; otherwise (CI, a pipe) it prints one
compact line per refresh so logs stay readable.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cellar.dev.spec import TENANTS
from cellar.dev.workload import Activity


@dataclass
class Frame:
    """What one refresh shows."""

    elapsed_s: float
    replicas: list[dict[str, Any]]  # status answers; {"running": False} when down
    commits_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    tenants: dict[str, tuple[int, int]]  # tenant -> (gangs allocated, GPUs)
    activity: Counter[str] = field(default_factory=Counter)
    note: str = ""


def tenants_of(gangs: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    found: dict[str, tuple[int, int]] = dict.fromkeys(TENANTS, (0, 0))
    for gang in gangs:
        count, gpus = found.get(gang["vc"], (0, 0))
        found[gang["vc"]] = (count + 1, gpus + int(gang.get("gpus", 0)))
    return found


def sequencer_of(replicas: list[dict[str, Any]]) -> str:
    for replica in replicas:
        if replica.get("running") and replica.get("is_sequencer"):
            return f"replica {replica['replica_id']} (view {replica['view']})"
    return "electing..."


def render(frame: Frame) -> list[str]:
    lines = [f"cellar dev  {frame.elapsed_s:5.1f} s   sequencer: {sequencer_of(frame.replicas)}"
             f"   {frame.note}",
             f"commits/s {frame.commits_per_s:7.0f}   client latency p50 "
             f"{frame.latency_p50_ms:6.1f} ms  p99 {frame.latency_p99_ms:6.1f} ms"]
    cells = []
    for index, replica in enumerate(frame.replicas):
        if replica.get("running"):
            cells.append(f"r{replica['replica_id']} {replica['status']:<6} executed "
                         f"{replica['executed_slots']:>7}")
        else:
            cells.append(f"r{index} down")
    lines.append("   ".join(cells))
    lines.append("   ".join(f"{tenant}: {gangs} gangs / {gpus} GPUs"
                            for tenant, (gangs, gpus) in sorted(frame.tenants.items())))
    counts = frame.activity
    lines.append(f"submitted {counts['submit']}  bound {counts['bind']}  started "
                 f"{counts['ack_start']}  exited {counts['exit']}  killed {counts['killed']}  "
                 f"finished {counts['finished']}  heartbeats {counts['heartbeat']}")
    return lines


class Screen:
    def __init__(self, *, live: bool | None = None) -> None:
        self.live = sys.stdout.isatty() if live is None else live
        self._drawn = 0

    def show(self, frame: Frame) -> None:
        lines = render(frame)
        if self.live:
            if self._drawn:
                sys.stdout.write(f"\x1b[{self._drawn}F")
            sys.stdout.write("".join(f"\x1b[2K{line}\n" for line in lines))
            self._drawn = len(lines)
        else:
            print(" | ".join([lines[0].replace("   ", " "), lines[1], lines[3]]))
        sys.stdout.flush()


def latency_window(activity: Activity, before: list[int], count_before: int
                   ) -> tuple[float, float]:
    """p50 and p99 (bucket bounds, ms) of the calls since the last refresh."""
    histogram = activity.latency
    counts = [now - then for now, then in zip(histogram.counts, before, strict=True)]
    total = histogram.count - count_before
    if total <= 0:
        return 0.0, 0.0

    def quantile(fraction: float) -> float:
        seen = 0
        for bound, count in zip((*histogram.bounds, float("inf")), counts, strict=True):
            seen += count
            if seen >= fraction * total:
                return bound * 1000
        return float("inf")

    return quantile(0.5), quantile(0.99)
