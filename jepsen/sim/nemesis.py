"""The nemesis: a schedule of faults (partitions of several shapes, one-way cuts, clogged
links, crashes with restarts, pauses), drawn from the seed or given explicitly (Hypothesis
builds explicit schedules, so a failing one shrinks to the faults that matter).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from consensus.prng import Prng
from jepsen.sim.options import SimOptions


class Fault(enum.StrEnum):
    PARTITION_HALVES = "partition-halves"
    PARTITION_RING = "partition-ring"  # each replica sees a majority, no two the same
    PARTITION_BRIDGE = "partition-bridge"  # two sides joined through one replica
    ISOLATE_SEQUENCER = "isolate-sequencer"
    ISOLATE = "isolate"
    ONE_WAY = "one-way"  # target hears nobody, but everybody hears it
    CLOG = "clog"  # links to and from target slowed to a crawl: late, not lost
    CRASH = "crash"  # target crashes, restarts after the duration
    PAUSE = "pause"  # target stops (as under SIGSTOP) for the duration


@dataclass(frozen=True, slots=True)
class NemesisEvent:
    at_ms: int
    fault: Fault
    target: int
    duration_ms: int


_PARTITIONS = (Fault.PARTITION_HALVES, Fault.PARTITION_RING, Fault.PARTITION_BRIDGE,
               Fault.ISOLATE_SEQUENCER, Fault.ISOLATE, Fault.ONE_WAY)


def draw_schedule(options: SimOptions, prng: Prng) -> tuple[NemesisEvent, ...]:
    """Faults for the safety phase, at the rates the options give."""
    events: list[NemesisEvent] = []
    for every, kinds in ((options.partition_every_ms, _PARTITIONS),
                         (options.crash_every_ms, (Fault.CRASH,)),
                         (options.pause_every_ms, (Fault.PAUSE,)),
                         (options.clog_every_ms, (Fault.CLOG,))):
        if every <= 0:
            continue
        at = prng.int_inclusive(0, every)
        while at < options.safety_ms:
            duration = prng.int_inclusive(options.fault_duration_ms // 2 + 1,
                                          options.fault_duration_ms)
            events.append(NemesisEvent(at, prng.choice(kinds),
                                       prng.below(options.replica_count), duration))
            at += prng.int_inclusive(every // 2 + 1, every * 3 // 2)
    return tuple(sorted(events, key=lambda event: (event.at_ms, event.fault, event.target)))


def partition_groups(fault: Fault, target: int, replica_count: int,
                     sequencer: int) -> list[list[int]]:
    """Which replicas still talk to each other under a partition fault."""
    everyone = list(range(replica_count))
    if fault is Fault.PARTITION_HALVES:
        rotated = everyone[target:] + everyone[:target]
        half = replica_count // 2
        return [rotated[:half], rotated[half:]]
    if fault is Fault.PARTITION_RING:
        # Each replica hears only its two ring neighbours: with 5, each sees a majority.
        return [[member, (member + 1) % replica_count] for member in everyone]
    if fault is Fault.PARTITION_BRIDGE:
        others = [member for member in everyone if member != target]
        half = len(others) // 2
        return [[*others[:half], target], [*others[half:], target]]
    isolated = sequencer if fault is Fault.ISOLATE_SEQUENCER else target
    return [[isolated], [member for member in everyone if member != isolated]]
