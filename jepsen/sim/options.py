"""What one simulator run does: the group, the workload, the fault mix, the phases' lengths.

`swarm(seed)` draws the fault mix from the seed (swarm testing: each seed enables its own
subset of faults at its own rates), so a sweep over seeds covers many combinations. One seed in
three also sends snapshots in chunks of a few bytes, so that catch-up transfers span many
chunks and windows. `describe` prints every option, so a run can be reproduced from its
printout alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from consensus.config import SNAPSHOT_CHUNK_BYTES, SNAPSHOT_WINDOW_BYTES, Defect, Mode
from consensus.prng import Prng

# One seed in this many sends snapshots in chunks of a few bytes (the store's snapshots hold a
# few hundred bytes: with the replicas' default sizes every transfer is one chunk).
SMALL_CHUNKS_ONE_IN = 3
WIPES_ONE_IN = 4  # seeds whose schedule loses replicas' disks (they rejoin)
SMALL_CHUNK_BYTES = (8, 64)
SMALL_WINDOW_CHUNKS = (2, 8)  # a window is this many chunks, give or take part of one
# Compaction with small chunks: often enough that a replica left behind installs a snapshot.
SMALL_CHUNKS_SNAPSHOT_EVERY_SLOTS = (10, 20, 40)


@dataclass(frozen=True, slots=True)
class SimOptions:
    seed: int
    replica_count: int = 3
    mode: Mode = Mode.SDPAXOS
    clients: int = 4
    keys: int = 3
    safety_ms: int = 2000
    liveness_ms: int = 3000
    tick_us: int = 1000
    latency_us_min: int = 200
    latency_us_max: int = 2000
    jitter_us: int = 0
    loss_ppm: int = 0
    duplicate_ppm: int = 0
    sync_us: int = 200
    torn_writes: bool = False
    drift_ppm: int = 0  # each replica's tick period differs by up to this much
    partition_every_ms: int = 0
    crash_every_ms: int = 0
    pause_every_ms: int = 0
    clog_every_ms: int = 0
    fault_duration_ms: int = 300
    long_fault_every_ms: int = 0  # one replica cut off or down for long (`nemesis._LONG`)
    long_fault_ms: int = 1200  # each lasts from half this to this
    wipe_every_ms: int = 0  # a replica loses its disk and rejoins (`nemesis.Fault.WIPE`)
    snapshot_every_slots: int = 200
    snapshot_chunk_bytes: int = SNAPSHOT_CHUNK_BYTES  # each replica's ReplicaConfig's
    snapshot_window_bytes: int = SNAPSHOT_WINDOW_BYTES
    client_timeout_ms: int = 1500
    think_us: int = 2000
    read_ppm: int = 400_000
    cas_ppm: int = 200_000
    batch_commands_max: int = 64
    thrifty: bool = True
    straggler: int = -1  # a replica that needs straggler_cpu_us per message, or -1
    straggler_cpu_us: int = 0
    defects: frozenset[Defect] = field(default_factory=frozenset)

    def describe(self) -> str:
        parts = []
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if isinstance(value, frozenset):
                value = ",".join(sorted(str(defect) for defect in value)) or "-"
            parts.append(f"{item.name}={value}")
        return " ".join(parts)


def swarm(seed: int, base: SimOptions | None = None) -> SimOptions:
    """Options for `seed` with a fault mix drawn from it."""
    prng = Prng(seed ^ 0x5157A4)
    options = base if base is not None else SimOptions(seed=seed)

    def maybe(low: int, high: int) -> int:
        return prng.int_inclusive(low, high) if prng.chance_ppm(500_000) else 0

    # Long faults came later: drawn from a stream of their own, so that every other option of
    # a seed stays what it was.
    long_prng = Prng(seed ^ 0x10C6F4)
    long_every_ms = long_prng.int_inclusive(300, 700) if long_prng.chance_ppm(500_000) else 0
    drawn = dataclasses.replace(
        options, seed=seed,
        # Client i talks to replica i % n: every replica leads commands of its own (with 4
        # clients, replica 4 of 5 had led none, and no leader-side race reached it).
        clients=max(options.clients, options.replica_count),
        jitter_us=maybe(100, 3000),
        loss_ppm=maybe(1_000, 50_000),
        duplicate_ppm=maybe(1_000, 50_000),
        torn_writes=prng.chance_ppm(500_000),
        drift_ppm=maybe(100, 5_000),
        partition_every_ms=maybe(150, 800),
        crash_every_ms=maybe(200, 1000),
        pause_every_ms=maybe(200, 1000),
        clog_every_ms=maybe(200, 1000),
        fault_duration_ms=prng.int_inclusive(50, 600),
        snapshot_every_slots=prng.choice([20, 50, 200, 1000]),
        batch_commands_max=prng.choice([1, 4, 64]),
        thrifty=prng.chance_ppm(750_000),
        long_fault_every_ms=long_every_ms,
        long_fault_ms=long_prng.int_inclusive(800, 1500),
    )
    # Small snapshot chunks came later still: a stream of their own too.
    drawn = _small_chunks(Prng(seed ^ 0xC4C7A5), drawn)
    # Lost disks came last: a stream of their own, drawn after every other fault.
    return _wipes(Prng(seed ^ 0x3A1E5), drawn)


def _wipes(prng: Prng, options: SimOptions) -> SimOptions:
    """For one seed in `WIPES_ONE_IN`, replicas lose their disks now and then and rejoin."""
    if prng.int_inclusive(1, WIPES_ONE_IN) != 1:
        return options
    return dataclasses.replace(options, wipe_every_ms=prng.int_inclusive(400, 1200))


def _small_chunks(prng: Prng, options: SimOptions) -> SimOptions:
    """For one seed in `SMALL_CHUNKS_ONE_IN`, snapshots sent in chunks and windows of a few
    bytes and taken often: transfers then span many chunks and windows, and chunks are lost,
    duplicated, late, or outlive the snapshot their sender compacted past."""
    if prng.int_inclusive(1, SMALL_CHUNKS_ONE_IN) != 1:
        return options
    chunk = prng.int_inclusive(*SMALL_CHUNK_BYTES)
    low, high = SMALL_WINDOW_CHUNKS
    return dataclasses.replace(
        options, snapshot_chunk_bytes=chunk,
        snapshot_window_bytes=prng.int_inclusive(low * chunk, high * chunk),
        snapshot_every_slots=prng.choice(SMALL_CHUNKS_SNAPSHOT_EVERY_SLOTS),
    )
