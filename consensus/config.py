"""A replica's configuration: group size, roles, limits and timeouts, all validated up front.

Time is counted in ticks (the runtime decides how long a tick is; the simulator uses 1 ms), so
every timeout here is a number of ticks. Every queue and message has a limit here, named with
its unit. `validate()` names the offending field and the reason.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from consensus.codec import BATCH_COMMANDS_MAX
from consensus.errors import ConsensusError
from consensus.quorum import majority

# Ballots pack (round, replica) into one int: round * BALLOT_REPLICAS + replica.
BALLOT_REPLICAS = 16
REPLICA_COUNT_MAX = 15
SNAPSHOT_CHUNK_BYTES = 1 << 19  # snapshot bytes in one chunk message
# Snapshot bytes sent for one fetch. A peer link queues at most 64 MiB and drops the rest, so a
# snapshot sent whole in one burst never arrives past that: it goes a window at a time, the
# receiver asking for the next one where it stopped (consensus/catchup.py).
SNAPSHOT_WINDOW_BYTES = 8 << 20


class ConfigError(ConsensusError):
    """A configuration value is out of range or inconsistent; the message names the field."""


class Mode(enum.StrEnum):
    """SDPaxos, or the Multi-Paxos baseline in which only the sequencer proposes commands."""

    SDPAXOS = "sdpaxos"
    MULTIPAXOS = "multipaxos"


class Defect(enum.StrEnum):
    """Deliberate protocol faults, for showing that the simulator catches them. Never in use."""

    NO_DEDUP_GUARD = "no-dedup-guard"  # allocate an O-instance for every trigger (Fig. 5 l.13)
    NO_PREFIX_CONDITION = "no-prefix-condition"  # 5 replicas: ready without the O prefix
    NO_VIEW_GATING = "no-view-gating"  # accept O-accepts from deposed sequencers
    LOCAL_READS = "local-reads"  # serve reads from local state, without a read index
    OWN_VOTE_ONLY = "own-vote-only"  # a new sequencer rebuilds the O-log from its own vote
    # A replica that lost its disk starts over as a new one (its tags in a new epoch), asking
    # nobody what it promised
    FORGETFUL_REJOIN = "forgetful-rejoin"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaConfig:
    replica_id: int
    replica_count: int
    mode: Mode = Mode.SDPAXOS
    # Peers in order of preference (nearest first) for thrifty fan-out; empty: id+1, id+2, ...
    peer_order: tuple[int, ...] = ()
    thrifty: bool = True

    batch_commands_max: int = 1024  # commands in one C-instance
    batch_bytes_max: int = 1 << 20  # payload bytes in one C-instance
    inflight_instances_max: int = 512  # own C-instances proposed and not yet committed
    # Own C-indexes reserved on disk at a time, ahead of use: a restarted leader decides every
    # index below its reservation before it proposes anew (a no-op where nobody holds a value).
    reserved_indexes: int = 128
    pending_proposals_max: int = 100_000  # proposals queued behind the in-flight window
    o_entries_per_message_max: int = 8192
    fetch_instances_max: int = 256  # C-instances in one catch-up reply
    reads_pending_max: int = 100_000
    dedup_window_per_origin: int = 65_536  # executed command tags remembered per origin
    snapshot_chunk_bytes: int = SNAPSHOT_CHUNK_BYTES
    snapshot_window_bytes: int = SNAPSHOT_WINDOW_BYTES
    snapshot_bytes_max: int = 1 << 30  # a peer's snapshot larger than this is refused
    lead_lag_slots_max: int = 16  # further behind the committed prefix, proposals wait

    heartbeat_ticks: int = 10
    election_ticks: int = 60  # a follower suspects the sequencer after [base, 2 * base) ticks
    lease_ticks: int = 40  # a lease granted to the sequencer; must be < election_ticks
    # Margin the sequencer takes off its lease: one tick for counting from the start of a tick
    # at both ends, the rest for the replicas' clocks running at different rates (3 ticks of
    # 40: 7.5 %). Every replica must count ticks of the same length with the same lease_ticks
    # and lease_drift_ticks (the peer links refuse a peer whose values differ).
    lease_drift_ticks: int = 4
    resend_ticks: int = 25
    repair_ticks: int = 30  # execution stalled this long: ask peers for what is missing
    recovery_ticks: int = 120  # still stalled: recover the command leader's C-instances
    straggler_window_ticks: int = 250
    straggler_rounds: int = 3
    straggler_margin_ticks: int = 5  # ordering must lag replication by this much on average
    straggler_cooldown_ticks: int = 2000
    straggler_enabled: bool = True
    # Commit notices to a peer that showed no wait on commits in this many ticks are held
    # until the next message to it or the next tick (consensus/notice_hold.py); 0: never held
    notices_quiet_after_ticks: int = 10
    defects: frozenset[Defect] = field(default_factory=frozenset)

    @property
    def majority(self) -> int:
        return majority(self.replica_count)

    @property
    def faults_tolerated(self) -> int:
        return self.replica_count // 2

    # Other replicas in preference order: `peer_order`, else id+1, id+2, ... Made once, in
    # `__post_init__` (the core reads it several times a message).
    peers: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        count = self.replica_count
        object.__setattr__(self, "peers", self.peer_order or tuple(
            (self.replica_id + step) % count for step in range(1, count)))

    def sequencer_of(self, view: int) -> int:
        return view % self.replica_count

    def validate(self) -> ReplicaConfig:
        """Return self, or raise ConfigError naming the first bad field."""
        for problem in _problems(self):
            raise ConfigError(problem)
        return self


def _problems(config: ReplicaConfig) -> list[str]:
    count = config.replica_count
    problems: list[str] = []
    if not (3 <= count <= REPLICA_COUNT_MAX and count % 2 == 1):
        problems.append(f"replica_count: {count}; must be odd, between 3 and "
                        f"{REPLICA_COUNT_MAX}")
        return problems
    if not 0 <= config.replica_id < count:
        problems.append(f"replica_id: {config.replica_id} is not in [0, {count})")
    if config.peer_order and sorted(config.peer_order) != sorted(
            set(range(count)) - {config.replica_id}):
        problems.append(f"peer_order: {config.peer_order} must list every other replica once")
    positive = ("batch_commands_max", "batch_bytes_max", "inflight_instances_max",
                "reserved_indexes",
                "pending_proposals_max", "o_entries_per_message_max", "fetch_instances_max",
                "reads_pending_max", "dedup_window_per_origin", "snapshot_chunk_bytes",
                "snapshot_window_bytes", "snapshot_bytes_max", "lead_lag_slots_max",
                "heartbeat_ticks", "election_ticks", "lease_ticks", "resend_ticks",
                "repair_ticks", "recovery_ticks", "straggler_window_ticks",
                "straggler_rounds", "straggler_margin_ticks", "straggler_cooldown_ticks")
    problems.extend(f"{name}: must be positive, got {getattr(config, name)}"
                    for name in positive if getattr(config, name) <= 0)
    if config.batch_commands_max > BATCH_COMMANDS_MAX:
        # A C-accept (and its record in the log) with more would decode nowhere: peers drop
        # it, and the replica's own log refuses it as corrupt at the next start.
        problems.append(f"batch_commands_max: {config.batch_commands_max} is more than "
                        f"{BATCH_COMMANDS_MAX}, the most commands a C-instance may decode with")
    if config.lease_drift_ticks < 1:
        problems.append(f"lease_drift_ticks: must be at least 1, got "
                        f"{config.lease_drift_ticks}: the sequencer and its followers each "
                        f"count the lease from the start of a tick, up to one tick apart")
    elif config.lease_drift_ticks >= config.lease_ticks:
        problems.append(f"lease_drift_ticks: {config.lease_drift_ticks} must be below "
                        f"lease_ticks ({config.lease_ticks}), or the sequencer never holds "
                        f"a lease")
    if config.lease_ticks + config.lease_drift_ticks >= config.election_ticks:
        problems.append("lease_ticks: lease plus drift margin must be shorter than "
                        "election_ticks, or a follower could vote while its lease binds it")
    if config.heartbeat_ticks >= config.lease_ticks - config.lease_drift_ticks:
        problems.append("heartbeat_ticks: must be shorter than lease_ticks less "
                        "lease_drift_ticks, so leases renew before the sequencer stops "
                        "counting on them")
    if config.notices_quiet_after_ticks < 0:
        problems.append(f"notices_quiet_after_ticks: must be at least 0 (0: never hold), got "
                        f"{config.notices_quiet_after_ticks}")
    if config.recovery_ticks <= config.repair_ticks:
        problems.append("recovery_ticks: must exceed repair_ticks (repair before recovery)")
    return problems
