"""The nemesis: a schedule of faults (partitions of several shapes, cuts of one direction,
clogged links, crashes with restarts, pauses), drawn from the seed or given explicitly
(Hypothesis builds explicit schedules, so a failing one shrinks to the faults that matter), and
what each network fault does to the links (`disturbance`).

Besides the short faults the options' rates draw, a seed may draw long ones (`_LONG`): one
replica (or the sequencer) cut off one way or both, or down, for longer than a view change and
the recovery of its instances take, so the others run both without it while it still sends, or
still hears, or comes back to find them done. Most of those cuts are held (`HELD_CUTS`), as a
runtime's links feel a cut: what was on its way is lost with the connection, what is sent later
waits on the sender's queue and arrives in a burst once the cut ends, each link after its own
reconnect delay. A replica then hears a peer's old round long after it learned the outcome from
another peer: live runs found races that way that the simulator had never met.

Every fault shape cuts or slows some link at every group size the cluster allows (odd, from 3).
`partition-ring` leaves each replica those nearest it around a ring, as few as still make a
majority with it (its two neighbours of 5, four of 7), different for each; it cuts the rest.
With 3 every pair are neighbours, so a ring would cut nothing; there it cuts the one link
between the target's neighbours instead, leaving a line through the target (each end still sees
a majority, the two ends different ones: the same cut `partition-bridge` makes).

`schedule_problems` says what is wrong with an explicit schedule for a cluster: a target that is
no replica, a fault that lasts no time, a start outside the safety phase.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from consensus.prng import Prng
from jepsen.sim.network import Disturbance, Link
from jepsen.sim.options import SimOptions


class Fault(enum.StrEnum):
    PARTITION_HALVES = "partition-halves"
    PARTITION_RING = "partition-ring"  # each replica sees a majority, no two the same
    PARTITION_BRIDGE = "partition-bridge"  # two sides joined through one replica
    ISOLATE_SEQUENCER = "isolate-sequencer"
    ISOLATE = "isolate"
    ONE_WAY = "one-way"  # target hears nobody, but everybody hears it
    MUTE = "mute"  # target hears everybody, but nobody hears it
    MUTE_SEQUENCER = "mute-sequencer"
    # The same cuts as a runtime's links feel them (`HELD_CUTS`): frames on their way are lost
    # with the connection, later ones wait on the sender's queue and go once the fault ends.
    ISOLATE_HELD = "isolate-held"
    ONE_WAY_HELD = "one-way-held"
    MUTE_HELD = "mute-held"
    ISOLATE_SEQUENCER_HELD = "isolate-sequencer-held"
    # Target hears everybody but the sequencer (the one after it, if it is the sequencer).
    # Explicit schedules only: drawn schedules keep the kinds (and so the seeds) they had.
    DEAF_TO_SEQUENCER = "deaf-to-sequencer"
    CLOG = "clog"  # links to and from target slowed to a crawl: late, not lost
    CRASH = "crash"  # target crashes, restarts after the duration
    # Target crashes and its disk is lost: it restarts after the duration on an empty one and
    # rejoins (`consensus.rejoin`); a plain crash while another replica is still rejoining.
    WIPE = "wipe"
    PAUSE = "pause"  # target stops (as under SIGSTOP) for the duration


@dataclass(frozen=True, slots=True)
class NemesisEvent:
    at_ms: int
    fault: Fault
    target: int
    duration_ms: int


_PARTITIONS = (Fault.PARTITION_HALVES, Fault.PARTITION_RING, Fault.PARTITION_BRIDGE,
               Fault.ISOLATE_SEQUENCER, Fault.ISOLATE, Fault.ONE_WAY)
HELD_CUTS = {Fault.ISOLATE_HELD: Fault.ISOLATE, Fault.ONE_WAY_HELD: Fault.ONE_WAY,
             Fault.MUTE_HELD: Fault.MUTE, Fault.ISOLATE_SEQUENCER_HELD: Fault.ISOLATE_SEQUENCER}
# One replica cut off (one way or both) or down, for long (module docstring). A replica that
# hears nobody for long is drawn twice as often: it comes back to bursts from each peer, each
# after its own reconnect, and so hears old rounds after their outcome.
_LONG = (*HELD_CUTS, Fault.ONE_WAY_HELD, Fault.MUTE, Fault.MUTE_SEQUENCER, Fault.CRASH)


def draw_schedule(options: SimOptions, prng: Prng) -> tuple[NemesisEvent, ...]:
    """Faults for the safety phase, at the rates the options give."""
    events: list[NemesisEvent] = []
    for every, kinds in ((options.partition_every_ms, _PARTITIONS),
                         (options.crash_every_ms, (Fault.CRASH,)),
                         (options.pause_every_ms, (Fault.PAUSE,)),
                         (options.clog_every_ms, (Fault.CLOG,))):
        events.extend(_draw(options, prng, every, kinds, options.fault_duration_ms))
    # Drawn last, so that a seed without long faults keeps the schedule it had before them.
    events.extend(_draw(options, prng, options.long_fault_every_ms, _LONG,
                        options.long_fault_ms))
    events.extend(_draw(options, prng, options.wipe_every_ms, (Fault.WIPE,),
                        options.fault_duration_ms))
    return tuple(sorted(events, key=lambda event: (event.at_ms, event.fault, event.target)))


def _draw(options: SimOptions, prng: Prng, every_ms: int, kinds: tuple[Fault, ...],
          longest_ms: int) -> list[NemesisEvent]:
    """Faults of `kinds` every `every_ms` or so (none if 0), each lasting from half
    `longest_ms` to `longest_ms`."""
    events: list[NemesisEvent] = []
    if every_ms <= 0:
        return events
    at = prng.int_inclusive(0, every_ms)
    while at < options.safety_ms:
        duration = prng.int_inclusive(longest_ms // 2 + 1, longest_ms)
        events.append(NemesisEvent(at, prng.choice(kinds), prng.below(options.replica_count),
                                   duration))
        at += prng.int_inclusive(every_ms // 2 + 1, every_ms * 3 // 2)
    return events


def partition_groups(fault: Fault, target: int, replica_count: int,
                     sequencer: int) -> list[list[int]]:
    """Which replicas still talk to each other under a partition fault."""
    everyone = list(range(replica_count))
    if fault is Fault.PARTITION_HALVES:
        rotated = everyone[target:] + everyone[:target]
        half = replica_count // 2
        return [rotated[:half], rotated[half:]]
    if fault is Fault.PARTITION_RING and replica_count <= 3:
        # Every pair are ring neighbours: cut the pair beside the target, a line through it.
        return [[(target - 1) % replica_count, target], [target, (target + 1) % replica_count]]
    if fault is Fault.PARTITION_RING:
        # Each replica hears those within `reach` of it around the ring: just a majority.
        reach = (replica_count // 2 + 1) // 2
        return [[(member + step) % replica_count for step in range(reach + 1)]
                for member in everyone]
    if fault is Fault.PARTITION_BRIDGE:
        others = [member for member in everyone if member != target]
        half = len(others) // 2
        return [[*others[:half], target], [*others[half:], target]]
    isolated = sequencer if fault is Fault.ISOLATE_SEQUENCER else target
    return [[isolated], [member for member in everyone if member != isolated]]


def links_between_groups(groups: list[list[int]], replica_count: int) -> frozenset[Link]:
    """The links between replicas that share no group (both directions)."""
    return frozenset((source, target)
                     for source in range(replica_count) for target in range(replica_count)
                     if source != target
                     and not any(source in group and target in group for group in groups))


def disturbance(fault: Fault, target: int, replica_count: int, *, sequencer: int,
                clog_us: int) -> Disturbance:
    """What a network fault does to the links while it is in force."""
    others = [member for member in range(replica_count) if member != target]
    if fault is Fault.CLOG:
        links = {*((other, target) for other in others), *((target, other) for other in others)}
        return Disturbance(clogged=frozenset(links), clog_us=clog_us)
    if fault is Fault.ONE_WAY:
        return Disturbance(blocked=frozenset((other, target) for other in others))
    if fault in HELD_CUTS:
        cut = disturbance(HELD_CUTS[fault], target, replica_count, sequencer=sequencer,
                          clog_us=clog_us)
        return Disturbance(held=cut.blocked)
    if fault in (Fault.MUTE, Fault.MUTE_SEQUENCER):
        muted = sequencer if fault is Fault.MUTE_SEQUENCER else target
        return Disturbance(blocked=frozenset((muted, other) for other in range(replica_count)
                                             if other != muted))
    if fault is Fault.DEAF_TO_SEQUENCER:
        deaf = target if target != sequencer else (target + 1) % replica_count
        return Disturbance(blocked=frozenset({(sequencer, deaf)}))
    groups = partition_groups(fault, target, replica_count, sequencer)
    return Disturbance(blocked=links_between_groups(groups, replica_count))


def schedule_problems(schedule: tuple[NemesisEvent, ...], replica_count: int,
                      safety_ms: int) -> list[str]:
    """What makes an explicit schedule unfit for this cluster, one line per event at fault."""
    problems = []
    for event in schedule:
        name = f"{event.at_ms}:{event.fault.value}:{event.target}:{event.duration_ms}"
        if not 0 <= event.target < replica_count:
            problems.append(f"{name}: target {event.target} is no replica (there are "
                            f"{replica_count}: 0 to {replica_count - 1})")
        if event.duration_ms <= 0:
            problems.append(f"{name}: a fault lasts at least 1 ms, not {event.duration_ms}")
        if not 0 <= event.at_ms <= safety_ms:
            problems.append(f"{name}: faults start in the safety phase, at 0 to {safety_ms} ms, "
                            f"not at {event.at_ms}")
    return problems
