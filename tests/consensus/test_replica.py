"""Rule-by-rule tests of the replica, each citing the part of the protocol it checks."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import pytest

from consensus.catchup import FETCH_REPLY_BYTES_MAX, state_digest
from consensus.codec import encode_messages, pack
from consensus.command_log import initial_ballot, next_ballot
from consensus.config import ConfigError, Defect, Mode, ReplicaConfig
from consensus.leader import TAG_COUNTER_BITS, ProposalDropped
from consensus.messages import (
    NOOP,
    CAccept,
    CAck,
    CCommit,
    Command,
    CPrepare,
    CPromise,
    CRequest,
    FetchRequest,
    Heartbeat,
    OAccept,
    OAck,
    SnapshotChunk,
    SnapshotMeta,
)
from consensus.prng import Prng
from consensus.records import EpochRecord, SnapshotRecord
from consensus.replica import Replica
from tests.consensus.interaction import Harness, run_command
from tests.consensus.stepper import Stepper
from tests.consensus.test_election_edges import warmed_up


def harness(*commands: str) -> Harness:
    state = Harness()
    for command in commands:
        run_command(state, command)
    return state


def counter(state: Harness, replica: int, name: str) -> int:
    return dict(state.node(replica).status().counters).get(name, 0)


def test_acknowledgements_wait_for_persistence() -> None:
    """An acceptor acknowledges only what is on disk (§2.1; the Ready contract)."""
    replica = Replica(ReplicaConfig(replica_id=2, replica_count=3), Prng(2))
    replica.step(CAccept(1, 0, 1, 0, 1, (Command(1, 1, b"a"),)))
    ready = replica.ready()
    assert ready.must_sync and ready.records
    assert not any(isinstance(message, CAck) for _, message in ready.messages)
    assert any(isinstance(message, CAck) for _, message in ready.messages_after_persist)


def test_a_leader_counts_itself_only_once_persisted() -> None:
    """With its own acceptance not yet durable, one peer's ack is not a majority of 3."""
    leader = Replica(ReplicaConfig(replica_id=1, replica_count=3), Prng(1))
    leader.propose(b"a")
    leader.ready()  # persist pending: the driver has not called advance()
    leader.step(CAck(2, 0, 1, 0, 1))
    assert leader.ready().readied == []
    assert leader.inspect.committed_c(1, 0) is None
    leader.advance()
    leader.ready()
    assert leader.inspect.committed_c(1, 0) is not None


def test_the_sequencer_sends_its_o_accept_before_its_sync_and_its_vote_after() -> None:
    """The sequencer's sync overlaps the acceptors': its O-accept leaves at once, vouching
    for nothing of this run, and its O-ack follows once the run is on disk."""
    sequencer = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    sequencer.step(CRequest(1, 0, 1, 0, 1))
    ready = sequencer.ready()
    assert ready.must_sync
    early = {peer: message for peer, message in ready.messages if isinstance(message, OAccept)}
    assert early and all(message.durable_end == 0 for message in early.values())
    votes = {peer: message for peer, message in ready.messages_after_persist
             if isinstance(message, OAck)}
    assert votes == {peer: OAck(0, 0, 0, 1) for peer in early}
    assert not any(isinstance(message, OAccept) for _, message in ready.messages_after_persist)


def o_accepted_by(sequencer: Replica) -> set[int]:
    return {peer for peer, message in sequencer.ready().messages if isinstance(message, OAccept)}


def test_o_accepts_go_to_a_majority_that_includes_the_leaders_named() -> None:
    """Thrifty (§2.5): a run goes to the leaders it names and to the nearest peers only as far
    as a majority with the sequencer needs. With 3 replicas a run for another leader goes to
    that leader alone; with 5, to it and the nearest other peer."""
    for count, space, expected in ((3, 1, {1}), (3, 2, {2}), (5, 3, {1, 3}), (5, 1, {1, 2})):
        sequencer = Replica(ReplicaConfig(replica_id=0, replica_count=count), Prng(0))
        sequencer.step(CRequest(space, 0, space, 0, space))
        assert o_accepted_by(sequencer) == expected, (count, space)
    own = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    own.propose(b"a")
    assert o_accepted_by(own) == {1}


def test_the_sequencers_vote_goes_to_the_learners_only() -> None:
    """Its O-ack after the sync matters to the leaders a run names (they learn those slots);
    a run of its own commands sends none: the acceptors hear the outcome in O-commits."""
    own = Replica(ReplicaConfig(replica_id=0, replica_count=5), Prng(0))
    own.propose(b"a")
    ready = own.ready()
    assert {peer for peer, message in ready.messages if isinstance(message, OAccept)} == {1, 2}
    assert not any(isinstance(message, OAck) for _, message in ready.messages_after_persist)
    other = Replica(ReplicaConfig(replica_id=0, replica_count=5), Prng(0))
    other.step(CRequest(3, 0, 3, 0, 3))
    ready = other.ready()
    assert {peer for peer, message in ready.messages_after_persist
            if isinstance(message, OAck)} == {3}


def test_a_run_for_a_silent_leader_also_goes_to_a_peer_that_answers() -> None:
    """A leader silent for an election timeout does not count towards the majority (here its
    instance comes from a recoverer)."""
    config = ReplicaConfig(replica_id=0, replica_count=3)
    sequencer = Replica(config, Prng(0))
    for _ in range(config.election_ticks + 1):
        sequencer.tick()
        sequencer.step(CRequest(2, 0, 2, 0, 2))  # replica 2 keeps talking; replica 1 is silent
    sequencer.ready()
    sequencer.step(CRequest(2, 0, 1, 0, 1))
    assert o_accepted_by(sequencer) == {1, 2}


def test_a_c_request_alone_makes_the_sequencer_ready() -> None:
    """Drivers poll `has_ready` after each input: an allocation made for a C-request (which
    queues nothing by itself) must count, or its O-accept waits for some unrelated input
    (the runtime lost about 1.5 ms per command that way)."""
    sequencer = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    assert not sequencer.has_ready()
    sequencer.step(CRequest(1, 0, 1, 0, 1))
    assert sequencer.has_ready()
    assert any(isinstance(message, OAccept) for _, message in sequencer.ready().messages)
    assert not sequencer.has_ready()


def test_a_c_request_far_ahead_gets_at_most_a_window_of_slots_at_a_time() -> None:
    """An index far past what a leader can have in flight (a bad frame) costs the sequencer
    one window of slots, not a loop to the index; asking again allocates the next window."""
    config = ReplicaConfig(replica_id=0, replica_count=3, inflight_instances_max=8)
    sequencer = Replica(config, Prng(0))
    sequencer.step(CRequest(1, 0, 1, 10**12, 1))
    assert sequencer.inspect.log_end == 8
    sequencer.step(CRequest(1, 0, 1, 10**12, 1))
    assert sequencer.inspect.log_end == 16


def test_a_frame_whose_messages_name_another_sender_is_dropped() -> None:
    """The transport knows which peer sent a frame (its certificate): no replica may speak
    for another."""
    sequencer = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    sequencer.receive(encode_messages([CRequest(2, 0, 2, 0, 2)]), sender=1)
    assert sequencer.inspect.log_end == 0
    assert dict(sequencer.status().counters)["dropped.wrong_sender"] == 1
    sequencer.receive(encode_messages([CRequest(1, 0, 1, 0, 1)]), sender=1)
    assert sequencer.inspect.log_end == 1


def test_an_acceptor_counts_the_sequencers_vote_only_once_vouched_for() -> None:
    """With 3 replicas the sequencer's vote and one acceptor's commit a slot, but only once
    the sequencer said its acceptance is durable (in an O-ack, or a later O-accept)."""
    for vouch in (OAck(0, 0, 0, 1), OAccept(0, 0, 1, (2,), 1)):
        acceptor = Replica(ReplicaConfig(replica_id=2, replica_count=3), Prng(2))
        acceptor.step(OAccept(0, 0, 0, (1,), 0))
        acceptor.ready()
        acceptor.advance()  # its own acceptance is durable
        acceptor.ready()
        assert acceptor.inspect.committed_o(0) is None
        acceptor.step(vouch)
        acceptor.ready()
        assert acceptor.inspect.committed_o(0) == 1
    resent = Replica(ReplicaConfig(replica_id=2, replica_count=3), Prng(2))
    resent.step(OAccept(0, 0, 0, (1,), 1))  # a resend: the sequencer's sync was done
    resent.ready()
    resent.advance()
    resent.ready()
    assert resent.inspect.committed_o(0) == 1


def test_the_dedup_guard_gives_one_slot_per_instance() -> None:
    """Fig. 5 l.13: duplicated triggers must not add O-instances."""
    state = harness("cluster 3", "propose 1 a", "process 1", "duplicate", "duplicate",
                    "deliver", "process")
    sequencer = state.node(0)
    assert sequencer.inspect.o_value(0) == 1 and sequencer.inspect.o_value(1) is None


def test_without_the_guard_duplicates_make_surplus_slots() -> None:
    config = ReplicaConfig(replica_id=0, replica_count=3,
                           defects=frozenset({Defect.NO_DEDUP_GUARD}))
    sequencer = Replica(config, Prng(0))
    for _ in range(3):
        sequencer.step(CRequest(1, 0, 1, 0, 1))
    sequencer.ready()
    assert [sequencer.inspect.o_value(slot) for slot in range(3)] == [1, 1, 1]


def test_o_accepts_from_an_older_view_are_dropped() -> None:
    """§3.2: every message carries a view; older views are ignored (Thm A.7)."""
    state = harness("cluster 3", "partition 0 | 1 2", "run n=200")
    replica = state.node(1)
    assert replica.inspect.view > 0
    replica.step(OAccept(0, 0, 0, (0,), 1))
    assert counter(state, 1, "dropped.o_accept_view") >= 1
    assert replica.inspect.o_value(0) is None


def test_five_replicas_ready_on_the_sequencers_o_accept() -> None:
    """§2.2: with 5 replicas a non-sequencer leader is ready with its C-instance committed
    and the O-prefix accepted by itself and the sequencer (the sequencer's O-ack vouching for
    its acceptance), no third O-acceptance."""
    state = harness("cluster 5", "propose 2 x", "process 2", "deliver", "process",
                    "drop 0->3 0->4 0->1", "deliver", "process")
    assert "2 ready C(2,0)" in state.output


def test_the_prefix_condition_holds_back_a_leader_with_a_gap() -> None:
    """§2.2: the leader must have accepted every O-instance before its own."""
    for defect, ready in ((frozenset(), False), ({Defect.NO_PREFIX_CONDITION}, True)):
        leader = Replica(ReplicaConfig(replica_id=2, replica_count=5,
                                       defects=frozenset(defect)), Prng(2))
        leader.propose(b"x")
        leader.ready()
        leader.advance()
        for peer in (3, 4):
            leader.step(CAck(peer, 0, 2, 0, 2))
        leader.step(OAccept(0, 0, 1, (2,), 2))  # slot 1, with slot 0 never seen here
        leader.ready()
        leader.advance()
        assert bool(leader.ready().readied) is ready


def test_five_replicas_wait_for_the_sequencer_to_vouch_for_its_acceptance() -> None:
    """The 5-replica rule counts the sequencer's acceptance, which its O-accept (sent before
    its sync) does not prove: the leader waits for the sequencer's O-ack."""
    leader = Replica(ReplicaConfig(replica_id=2, replica_count=5), Prng(2))
    leader.propose(b"x")
    leader.ready()
    leader.advance()
    for peer in (3, 4):
        leader.step(CAck(peer, 0, 2, 0, 2))
    leader.step(OAccept(0, 0, 0, (2,), 0))
    leader.ready()
    leader.advance()
    assert leader.ready().readied == []
    leader.step(OAck(0, 0, 0, 1))
    assert len(leader.ready().readied) == 1


def test_reads_wait_for_a_lease() -> None:
    """§3.5: the sequencer answers read-index requests only under a majority lease."""
    state = harness("cluster 3", "read 1 7", "stabilize")
    assert "1 may read 7" not in state.output
    state = harness("cluster 3", "run n=15", "read 1 7", "run n=3")
    assert "1 may read 7" in state.output


def test_garbage_and_impossible_messages_are_dropped_and_counted() -> None:
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    replica.receive(b"\xc1garbage")
    replica.receive(pack([[999]]))
    replica.receive(encode_messages([CAccept(9, 0, 1, 0, 1, ())]))
    replica.receive(encode_messages([CAccept(0, 0, 0, 0, 0, ())]))  # claims to be us
    counters = dict(replica.status().counters)
    assert counters["dropped.invalid_frame"] == 2
    assert counters["dropped.invalid_message"] == 2


def test_a_restarted_replica_keeps_its_promises() -> None:
    """A crash forgets nothing persisted: view, promises, acceptances (§4.1)."""
    state = harness("cluster 3", "propose 1 a", "stabilize", "partition 0 | 1 2",
                    "run n=200", "crash 2", "restart 2")
    restarted = state.node(2)
    assert restarted.inspect.view > 0
    assert restarted.inspect.committed_c(1, 0) is not None
    restarted.step(OAccept(0, 0, 1, (0,), 2))
    assert counter(state, 2, "dropped.o_accept_view") == 1


def test_a_replica_restored_from_nothing_does_not_sequence_view_0() -> None:
    """An empty data directory may be a new cluster's or a replaced disk's: restored from no
    records, replica 0 waits for an election (its log rebuilt from a majority's votes) rather
    than sequence view 0 afresh, which could give slots its old disk held to other commands."""
    replica = Replica.restore(ReplicaConfig(replica_id=0, replica_count=3), Prng(0), [])
    assert not replica.inspect.is_sequencer
    assert replica.status().status == "awaiting"


def test_the_proposal_queue_is_bounded() -> None:
    config = ReplicaConfig(replica_id=0, replica_count=3, pending_proposals_max=2)
    replica = Replica(config, Prng(0))
    replica.propose(b"a")
    replica.propose(b"b")
    with pytest.raises(ProposalDropped):
        replica.propose(b"c")


def test_compact_must_match_what_was_executed() -> None:
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    with pytest.raises(ValueError, match="executed"):
        replica.compact(b"state", 5)


def test_multipaxos_forwards_every_command_to_the_sequencer() -> None:
    state = harness("cluster 3 mode=multipaxos", "propose 1 a", "propose 2 b", "stabilize")
    executed = [line for line in state.output if line.startswith("1 executes")]
    assert executed == ["1 executes slot 0 = C(0,0) [a b]"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"replica_count": 4}, "must be odd"),
        ({"replica_id": 3}, "replica_id"),
        ({"peer_order": (1, 1)}, "peer_order"),
        ({"lease_ticks": 70}, "lease_ticks"),
        ({"heartbeat_ticks": 50}, "heartbeat_ticks"),
        ({"heartbeat_ticks": 37}, "heartbeat_ticks"),  # renewed after the lease is not trusted
        ({"lease_drift_ticks": 0}, "lease_drift_ticks: must be at least 1"),
        ({"lease_drift_ticks": -4}, "lease_drift_ticks: must be at least 1"),
        ({"lease_ticks": 4}, "lease_drift_ticks: 4 must be below lease_ticks"),
        ({"batch_bytes_max": 0}, "batch_bytes_max"),
        ({"recovery_ticks": 10}, "recovery_ticks"),
    ],
)
def test_bad_configuration_is_refused_with_the_field(changes: dict[str, object],
                                                      message: str) -> None:
    fields: dict[str, object] = {"replica_id": 0, "replica_count": 3, **changes}
    with pytest.raises(ConfigError, match=message):
        ReplicaConfig(**fields).validate()  # type: ignore[arg-type]


def test_modes_are_named() -> None:
    assert Mode("multipaxos") is Mode.MULTIPAXOS


def test_a_command_whose_index_was_recovered_with_a_noop_is_not_ready() -> None:
    """Readiness needs the committed value to be the leader's own batch: another replica may
    have recovered the index with a no-op (paper §3.3); the leader then takes its space back
    and proposes the command again."""
    leader = Replica(ReplicaConfig(replica_id=1, replica_count=3), Prng(1))
    leader.propose(b"a")
    leader.ready()
    leader.advance()
    leader.step(OAccept(0, 0, 0, (1,), 1))  # ordered at slot 0, the sequencer's vote durable
    leader.ready()
    leader.advance()
    leader.step(CCommit(2, 0, 1, 0, 18, ()))  # replica 2 recovered index 0 as a no-op
    ready = leader.ready()
    assert ready.readied == []
    assert dict(leader.status().counters).get("leader.retake") == 1


def decided_elsewhere(ahead: int, *, batch_commands_max: int | None = None,
                      ) -> tuple[Stepper, int]:
    """3 replicas, leader 1 having run one command; then replica 2's recovery decides 1's own
    index `ahead` past the next as a no-op, and 1 learns the commit. Returns the cluster and
    1's next index."""
    cluster = Stepper(3)
    if batch_commands_max is not None:
        for replica in range(3):
            cluster.configs[replica] = dataclasses.replace(
                cluster.configs[replica], batch_commands_max=batch_commands_max)
            cluster.replicas[replica] = Replica(cluster.configs[replica], Prng(replica))
    for _ in range(20):
        cluster.round()
    leader = cluster.node(1)
    leader.propose(b"a")
    for _ in range(10):
        cluster.round()
    taken = leader.inspect.exec_count(1)  # 1's next index: nothing proposed there yet
    leader.step(CCommit(2, leader.status().view, 1, taken + ahead, next_ballot(0, 2) + 64,
                        NOOP))
    cluster.process(1)
    return cluster, taken


def test_a_leader_never_proposes_at_an_own_index_another_replica_already_decided() -> None:
    """A replica whose execution waited on an O-instance naming replica 1 (a surplus slot of a
    view change, 1 cut off meanwhile) recovered 1's next index as a no-op before 1 proposed
    there. 1 learns that commit, then a command comes: proposing it at that index offered its
    own acceptor a second value for a chosen instance, and the replica stopped on the
    C-agreement assert (seen in a live run, 5 replicas, a one-way partition). It takes its
    space back first, and the command goes to the next index."""
    cluster, taken = decided_elsewhere(0)
    leader = cluster.node(1)
    leader.propose(b"b")
    for _ in range(60):
        cluster.round()
        if all(cluster.node(replica).inspect.exec_count(1) > taken + 1 for replica in range(3)):
            break
    assert dict(leader.status().counters).get("leader.retake") == 1
    for replica in range(3):
        node = cluster.node(replica)
        assert node.inspect.committed_c(1, taken) == NOOP
        assert node.inspect.committed_c(1, taken + 1) is not None  # "b", past the no-op


def test_an_own_index_decided_past_the_next_one_is_never_proposed_again() -> None:
    """One flush starts an instance per batch: an index decided further on (its commit
    learned, the commit of the one before it lost) must stop it there too."""
    cluster, taken = decided_elsewhere(1, batch_commands_max=1)
    leader = cluster.node(1)
    for command in (b"b", b"c"):
        leader.propose(command)
    for _ in range(80):
        cluster.round()
    for replica in range(3):
        node = cluster.node(replica)
        assert node.inspect.committed_c(1, taken + 1) == NOOP
        assert node.inspect.exec_count(1) >= taken + 4, "b and c past the decided index"


def test_a_snapshot_past_own_instances_forgets_all_that_was_kept_of_them() -> None:
    """Instances committed but not yet ordered are kept too (for readiness and the straggler
    delay): a snapshot covering them dropped only the ones still in flight, and the rest
    stayed for the life of the process."""
    leader = Replica(ReplicaConfig(replica_id=1, replica_count=3), Prng(1))
    for command in (b"a", b"b"):
        leader.propose(command)
        leader.ready()
        leader.advance()
    leader.step(CAck(2, 0, 1, 0, 1))  # index 0 chosen with a peer's ack; not ordered yet
    leader.ready()
    leader.advance()
    kept = leader._leader  # white-box: what the leader keeps per own index
    assert 0 in kept._unready and 0 not in kept._inflight
    kept.forget_below(2)
    assert not [index for index in (*kept._unready, *kept._created_at, *kept._inflight)
                if index < 2]


# --- snapshot transfer (catch-up past the truncation point) -----------------------------------

SNAPSHOT_META = SnapshotMeta(slot=4, exec_counts=(2, 1, 1), o_counts=(2, 1, 1),
                             dedup_low=(0, 0, 0), dedup_tags=((), (), ()))


def chunks(sender: int, state: bytes, size: int, digest: bytes | None = None
           ) -> list[SnapshotChunk]:
    digest = digest if digest is not None else state_digest(state)
    return [SnapshotChunk(sender, 0, SNAPSHOT_META, offset, len(state), digest,
                          state[offset:offset + size]) for offset in range(0, len(state), size)]


def installed(replica: Replica) -> bytes | None:
    install = replica.ready().snapshot_to_install
    return None if install is None else install.state


def test_a_snapshot_is_assembled_from_one_sender_only() -> None:
    """Two peers may serve the same snapshot with different bytes: never mix their chunks."""
    replica = Replica(ReplicaConfig(replica_id=2, replica_count=3), Prng(2))
    first, second = chunks(0, b"aaaabbbb", 4), chunks(1, b"ccccdddd", 4)
    for message in (first[0], second[0], second[1], first[1]):
        replica.step(message)
    assert installed(replica) == b"aaaabbbb"


def test_a_snapshot_that_fails_its_digest_is_not_installed() -> None:
    replica = Replica(ReplicaConfig(replica_id=2, replica_count=3), Prng(2))
    for message in chunks(0, b"aaaabbbb", 4, digest=state_digest(b"aaaabbbX")):
        replica.step(message)
    assert installed(replica) is None
    assert dict(replica.status().counters)["catchup.snapshot_corrupt"] == 1


def test_a_snapshot_over_the_size_limit_is_refused() -> None:
    replica = Replica(ReplicaConfig(replica_id=2, replica_count=3, snapshot_bytes_max=6),
                      Prng(2))
    for message in chunks(0, b"aaaabbbb", 4):
        replica.step(message)
    assert installed(replica) is None
    assert dict(replica.status().counters)["dropped.snapshot_chunk_invalid"] == 2


WINDOWED_STATE = bytes(range(40))  # SNAPSHOT_META's state, sent in 5 windows of 8 bytes


def _windowed(replica_id: int) -> ReplicaConfig:
    return ReplicaConfig(replica_id=replica_id, replica_count=3, snapshot_chunk_bytes=4,
                         snapshot_window_bytes=8)


def _transfer_windowed_snapshot(
        fetch_passes: Callable[[int, int], bool] = lambda target, offset: target == 0,
        delivered: Callable[[Replica, list[SnapshotChunk]], list[SnapshotChunk]] =
        lambda server, sent: sent) -> None:
    """Replica 0 holds WINDOWED_STATE; replica 2, behind it, fetches it until installed.
    `fetch_passes(target, offset)` decides which fetches reach replica 0 (none reaches
    another peer); `delivered(server, chunks)`, which of each round's chunks reach the
    laggard (it may also act on the server between two windows)."""
    server = Replica.restore(_windowed(0), Prng(0), [SnapshotRecord(SNAPSHOT_META,
                                                                    WINDOWED_STATE)])
    server.ready()
    server.advance()
    laggard = Replica(_windowed(2), Prng(2))
    for _ in range(300):
        laggard.step(Heartbeat(0, 0, SNAPSHOT_META.slot, 0))  # it is behind, and stays in view
        laggard.tick()
        server.tick()
        ready = laggard.ready()
        laggard.advance()
        if ready.snapshot_to_install is not None:
            assert ready.snapshot_to_install.state == WINDOWED_STATE
            return
        for target, message in ready.messages:
            if isinstance(message, FetchRequest) and \
                    fetch_passes(target, message.snapshot_offset):
                server.step(message)
        sent = [message for target, message in server.ready().messages
                if target == 2 and isinstance(message, SnapshotChunk)]
        server.advance()
        for message in delivered(server, sent):
            laggard.step(message)
    raise AssertionError("the snapshot never arrived")


def test_a_sequencer_that_installs_a_newer_views_snapshot_drops_what_it_allocated() -> None:
    """A C-request allocates an O-slot; before the step's flush sends it, a peer's snapshot
    from far past this view's log replaces the slot: the allocation is dropped (nobody heard
    of it), and the sequencer knows it was deposed. Its flush had looked the slot up, gone
    with the snapshot, and raised KeyError (sim seed 2708 of 5 replicas, at 8f18aaa)."""
    cluster = warmed_up({})
    sequencer = cluster.node(0)
    assert cluster.node(0).inspect.is_sequencer and sequencer.inspect.log_end == 0
    promised = sequencer._ctx.clog[1].promised
    sequencer.step(CRequest(sender=1, view=0, space=1, index=0, ballot=promised))
    state = b"newer"
    meta = SnapshotMeta(slot=40, exec_counts=(10, 20, 10), o_counts=(10, 20, 10),
                        dedup_low=(0, 0, 0), dedup_tags=((), (), ()))
    sequencer.step(SnapshotChunk(2, 3, meta, 0, len(state), state_digest(state), state))
    ready = sequencer.ready()
    assert ready.snapshot_to_install is not None
    assert not [message for _, message in ready.messages + ready.messages_after_persist
                if isinstance(message, OAccept)]
    assert not sequencer.inspect.is_sequencer
    assert dict(sequencer.status().counters)["sequencer.deposed"] == 1


def test_a_snapshot_larger_than_what_a_link_queues_at_once_still_arrives() -> None:
    """A peer link queues a bounded number of bytes and drops the rest (the runtime's mesh: 64
    MiB). A snapshot sent whole for each fetch then never arrives past that point, however
    often the laggard asks; sent a window a time, from where the laggard stopped, it does."""
    link_bytes = 12  # what the link from the server to the laggard takes in one burst

    def burst(server: Replica, sent: list[SnapshotChunk]) -> list[SnapshotChunk]:
        taken = list(itertools.takewhile(lambda held: held <= link_bytes, itertools.accumulate(
            len(message.data) for message in sent)))
        return sent[:len(taken)]  # past the queue's bound the rest of the burst is dropped

    _transfer_windowed_snapshot(delivered=burst)


def test_a_lost_fetch_resumes_the_transfer_from_its_sender_where_it_stopped() -> None:
    """One lost fetch (or first chunk) of a window must not send the laggard to another peer,
    which would start over from the first byte: it asks the same sender again, from the
    bytes it holds, while chunks came lately."""
    fetches: list[tuple[int, int]] = []  # (peer, offset) of each fetch the laggard sent

    def fetch_passes(target: int, offset: int) -> bool:
        fetches.append((target, offset))
        return target == 0 and fetches.count((0, 16)) != 1  # the first for 16 is lost

    _transfer_windowed_snapshot(fetch_passes=fetch_passes)
    assert fetches.count((0, 16)) == 2, fetches  # asked again, of the same sender
    assert fetches.index((0, 16)) < fetches.index((0, 24)), fetches
    assert all(peer == 0 for peer, _ in fetches), fetches


def test_a_transfer_under_way_is_finished_on_its_snapshot_after_the_sender_compacts() -> None:
    """Windows go one at a time; a sender that compacts meanwhile (under load, often) goes on
    serving the snapshot the transfer started on, so the laggard does not start over."""
    starts: list[int] = []  # the offset of each window the server sent
    newer = SnapshotRecord(dataclasses.replace(SNAPSHOT_META, slot=SNAPSHOT_META.slot + 1),
                           bytes(40))

    def delivered(server: Replica, sent: list[SnapshotChunk]) -> list[SnapshotChunk]:
        if sent:
            starts.append(sent[0].offset)
        if starts == [0]:
            server._catchup.snapshot = newer  # as a compaction does between two windows
        return sent

    _transfer_windowed_snapshot(delivered=delivered)
    assert starts == [0, 8, 16, 24, 32], starts  # never back to the start


def test_no_compaction_while_an_install_waits_to_be_drained() -> None:
    """The driver's state machine is behind the core until it drains the install."""
    replica = Replica(ReplicaConfig(replica_id=2, replica_count=3), Prng(2))
    for message in chunks(0, b"state", 8):
        replica.step(message)
    before = replica.may_compact
    with pytest.raises(ValueError, match="drained"):
        replica.compact(b"stale", replica.executed_slots)
    assert installed(replica) == b"state"
    assert (before, replica.may_compact) == (False, True)
    replica.compact(b"state", replica.executed_slots)


def test_own_commands_a_peers_snapshot_applied_are_reported_covered() -> None:
    """A snapshot from a peer that applied this replica's committed command replaces the state
    its result would have come from: the Ready names its tag, so the client is told at once
    (and asks again in its session) instead of waiting for a result that never comes. An
    instance only accepted here may have been recovered with another value: not reported."""
    for commit, expected in ((True, True), (False, False)):
        replica = Replica(ReplicaConfig(replica_id=2, replica_count=3), Prng(2))
        tag = replica.propose(b"x")
        replica.ready()
        replica.advance()
        if commit:
            replica.step(CAck(0, 0, 2, 0, 2))
        ready = replica.ready()
        assert (replica.inspect.committed_c(2, 0) is not None) is commit
        assert not any(tag in [command.tag for command in item.commands]
                       for item in ready.executed)  # no O-instance yet: not executed here
        for chunk in chunks(0, b"state", 8):
            replica.step(chunk)
        ready = replica.ready()
        assert ready.snapshot_to_install is not None
        assert ready.covered == ([tag] if expected else [])


# --- runtime limits the core must live within ----------------------------------------------


def test_the_last_tag_of_an_epoch_is_used_and_the_next_proposal_starts_a_new_epoch() -> None:
    """Tags are epoch << 32 | counter. The 2**32-th proposal of one life had tripped an
    assert (and never used the last counter value). Now it starts a new epoch whose record
    is on disk before any of its tags leaves: a crash then hands out a later epoch, never the
    same tags for other commands (the executor would drop those as repeats)."""
    config = ReplicaConfig(replica_id=1, replica_count=3)
    replica = Replica(config, Prng(1))
    replica._leader._counter = (1 << TAG_COUNTER_BITS) - 1  # a long life, fast-forwarded
    last = replica.propose(b"last")
    assert last == (1 << TAG_COUNTER_BITS) - 1
    ready = replica.ready()
    replica.advance()
    first = replica.propose(b"next epoch")
    assert first == 1 << TAG_COUNTER_BITS
    ready = replica.ready()
    assert EpochRecord(1) in ready.records
    assert [type(message) for _, message in ready.messages_after_persist] == [CAccept]
    restarted = Replica.restore(config, Prng(2), ready.records)
    assert restarted.propose(b"after a crash") >> TAG_COUNTER_BITS == 2


def test_a_promise_carries_only_what_fits_a_frame_and_the_round_asks_again_past_it() -> None:
    """Full batches at every index: a promise of all of them (up to `fetch_instances_max`,
    with no bound on bytes) was over the peer mesh's frame cap, which dropped it at every
    resend, and the recovery never had a majority. The promise is cut to fit, and the
    round, seeing its last entry below the promise's `max_index`, is incomplete."""
    config = ReplicaConfig(replica_id=1, replica_count=3)
    acceptor = Replica(config, Prng(1))
    payload = b"p" * (config.batch_bytes_max // 8 - 64)
    for index in range(12):
        batch = tuple(Command(0, index * 8 + n, payload) for n in range(8))
        acceptor.step(CAccept(0, 0, 0, index, initial_ballot(0), batch))
    acceptor.ready()
    acceptor.advance()
    acceptor.step(CPrepare(2, 0, 0, 0, next_ballot(initial_ballot(0), 2)))
    [(_, promise)] = acceptor.ready().messages_after_persist
    assert isinstance(promise, CPromise)
    assert len(encode_messages([promise])) <= FETCH_REPLY_BYTES_MAX
    assert 1 <= len(promise.entries) < 12 and promise.max_index == 11
    assert [entry.index for entry in promise.entries] == list(range(len(promise.entries)))
