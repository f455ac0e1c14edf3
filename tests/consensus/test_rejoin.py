"""A replica that lost its disk rejoins (`consensus.rejoin`): it takes part in nothing until
every other replica has reported, then keeps their promises as its own, answers no prepare
and casts no vote on what it does not know decided, and tags its commands above every epoch
its old life used. Stepped by hand; the simulator's wipe schedules test whole clusters."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from consensus.leader import TAG_COUNTER_BITS, ProposalDropped
from consensus.messages import (
    TAG_EPOCH_MAX,
    Command,
    CPrepare,
    CPromise,
    Message,
    RejoinQuery,
    RejoinReport,
    Vote,
    VoteRequest,
    check_message,
)
from consensus.prng import Prng
from consensus.records import EpochRecord, RejoinRecord
from consensus.replica import Replica
from tests.consensus.stepper import Stepper


def busy_cluster(replica_count: int = 3) -> Stepper:
    """A cluster in which every replica led commands, and replica 1 restarted twice."""
    stepper = Stepper(replica_count)
    for _ in range(3):
        stepper.round()
    for number in range(6):
        for replica in stepper.live():
            stepper.node(replica).propose(f"r{replica}-{number}".encode())
        for _ in range(3):
            stepper.round()
        if number in (1, 3):
            stepper.crash(1)
            stepper.restart(1)
            for _ in range(3):
                stepper.round()
    for _ in range(10):
        stepper.round()
    return stepper


def wipe(stepper: Stepper, replica: int, *, epoch_floor: int = 0) -> Replica:
    """Replica `replica` loses its disk and starts over, rejoining."""
    stepper.crash(replica)
    stepper.records[replica] = []
    node = Replica.rejoining(stepper.configs[replica], Prng(50 + replica),
                             epoch_floor=epoch_floor)
    stepper.replicas[replica] = node
    return node


def asking(node: Replica) -> bool:
    """Still waiting for a report (a call, so that each assertion reads it afresh)."""
    return node.rejoining_now


def cleared(node: Replica) -> bool:
    return node.rejoin_cleared


def counters(node: Replica) -> dict[str, int]:
    return dict(node.status().counters)


def to(target: int, kind: type | None = None) -> Callable[[int, int, Message], bool]:
    """Picks the queued messages for `target` (of `kind`, if given)."""
    return lambda source, destination, message: destination == target and (
        kind is None or isinstance(message, kind))


def test_it_takes_part_in_nothing_until_every_other_replica_has_reported() -> None:
    stepper = busy_cluster()
    node = wipe(stepper, 1)
    stepper.process(1)
    assert isinstance(stepper.records[1][0], RejoinRecord) and not stepper.records[1][0].reported
    queries = [(target, message) for _, target, message in stepper.queue
               if isinstance(message, RejoinQuery)]
    assert sorted(target for target, _ in queries) == [0, 2]
    with pytest.raises(ProposalDropped, match="rejoining"):
        node.propose(b"too early")

    stepper.drop(to(2, RejoinQuery))  # lost: only replica 0 reports, at first
    stepper.deliver(to(0))
    stepper.process(0)
    stepper.deliver(to(1))
    assert asking(node)
    stepper.node(0).propose(b"while it waits")
    for _ in range(5):  # every other message is dropped meanwhile, and it votes for no one
        stepper.tick()
        stepper.process_all()
        stepper.deliver()
        stepper.process_all()
    assert asking(node)
    assert counters(node)["rejoin.dropped_while_asking"] > 0
    assert not [record for record in stepper.records[1] if not isinstance(record, RejoinRecord)]

    for _ in range(30):  # it asks again: replica 2 answers too
        stepper.round()
    assert not asking(node)
    reported = [record for record in stepper.records[1] if isinstance(record, RejoinRecord)]
    assert reported[-1].reported and reported[-1].c_ends[1] > 0


def test_its_tags_start_above_every_epoch_its_old_life_used() -> None:
    stepper = busy_cluster()
    old_epoch = stepper.node(1).epoch
    old_tags = {int(tag) for tag in stepper.readied[1]}
    assert old_tags and old_epoch == 2  # started, and restarted twice
    node = wipe(stepper, 1, epoch_floor=old_epoch)
    for _ in range(40):
        stepper.round()
    assert not asking(node)
    assert node.epoch > old_epoch
    tag = node.propose(b"new life")
    assert tag >> TAG_COUNTER_BITS == node.epoch and tag not in old_tags
    # The floor is on disk from the start: a crash while it asks keeps it.
    assert EpochRecord(old_epoch) in stepper.records[1]


def old_command_in_flight(stepper: Stepper) -> int:
    """Replica 1 proposes a command the others still hold when it loses its disk; its tag."""
    stepper.node(1).propose(b"in flight")
    stepper.process(1)
    stepper.deliver()
    return max(command.tag for command in _commands_of(stepper, 0, origin=1))


def test_without_a_floor_it_still_tags_above_every_tag_the_others_hold() -> None:
    stepper = busy_cluster()
    held = old_command_in_flight(stepper)
    node = wipe(stepper, 1)
    for _ in range(40):
        stepper.round()
    assert node.epoch > held >> TAG_COUNTER_BITS


def _commands_of(stepper: Stepper, replica: int, *, origin: int) -> list[Command]:
    space = stepper.node(replica)._ctx.clog[origin]  # a look inside, for the test
    return [command for slot in space.slots.values() for command in slot.batch or ()
            if command.origin == origin]


def test_a_peer_reports_how_far_the_lost_life_went_as_its_driver_heard() -> None:
    """Its old commands ran and were compacted everywhere: no tag is left to report, but the
    peers' drivers heard its lost life's epoch (the runtime: in its hellos)."""
    stepper = busy_cluster()
    node = wipe(stepper, 1)
    stepper.node(2).heard_old_life(1, 40)
    for _ in range(40):
        stepper.round()
    assert not asking(node) and node.epoch == 41


def test_a_crash_while_it_asks_makes_it_ask_again_after_the_restart() -> None:
    stepper = busy_cluster()
    wipe(stepper, 1, epoch_floor=9)
    stepper.process(1)
    stepper.crash(1)  # before any report came
    stepper.restart(1)
    node = stepper.node(1)
    assert asking(node)
    stepper.process(1)
    assert sorted(target for _, target, message in stepper.queue
                  if isinstance(message, RejoinQuery)) == [0, 2]
    for _ in range(40):
        stepper.round()
    assert not asking(node) and node.epoch > 9


def test_it_answers_no_prepare_on_what_it_does_not_know_decided() -> None:
    stepper = busy_cluster()
    node = wipe(stepper, 1)
    stepper.process(1)
    # Replica 0 will not answer with anything it can commit: only the reports go through.
    for _ in range(6):
        stepper.process_all()
        stepper.deliver(lambda source, target, message: isinstance(
            message, RejoinQuery | RejoinReport))
    assert not asking(node)
    stepper.queue = []
    ballot = 1 << 20
    node.step(CPrepare(2, node.status().view, 2, 0, ballot))
    stepper.process(1)
    assert not [message for _, _, message in stepper.queue if isinstance(message, CPromise)]
    assert counters(node)["rejoin.prepare_withheld"] == 1
    node.step(VoteRequest(2, node.status().view + 3, 0))
    stepper.process(1)
    assert not [message for _, _, message in stepper.queue if isinstance(message, Vote)]
    assert not cleared(node)

    for _ in range(300):  # once it has caught up (repair fetches what it lacks), it answers
        stepper.round()
    assert cleared(node)
    stepper.queue = []
    node.step(CPrepare(2, node.status().view, 2, 0, ballot))
    stepper.process(1)
    assert [message for _, _, message in stepper.queue if isinstance(message, CPromise)]


def test_an_asked_replica_forgets_the_old_lifes_promises_in_rounds_under_way() -> None:
    stepper = busy_cluster()
    asked = stepper.node(0)
    recovery = asked._recovery  # a round under way, held in phase 1 by the test
    view = asked.status().view
    recovery.start(2, 0)
    round_ = recovery.rounds[2]
    round_.promises[1] = CPromise(1, view, 2, 0, round_.ballot, 0, (), -1, -1)
    asked.step(RejoinQuery(1, view))
    assert 1 not in recovery.rounds[2].promises
    assert counters(asked)["rejoin.promise_forgotten"] == 1
    stepper.process(0)
    reports = [message for _, target, message in stepper.queue
               if isinstance(message, RejoinReport) and target == 1]
    assert len(reports) == 1
    assert reports[0].c_max_index == asked._ctx.clog.max_indexes()


def test_a_rejoining_replica_answers_a_query_saying_it_knows_nothing_yet() -> None:
    stepper = busy_cluster()
    node = wipe(stepper, 1)
    stepper.process(1)
    stepper.queue = []
    node.step(RejoinQuery(2, 0, 5))
    stepper.process(1)
    reports = [message for _, _, message in stepper.queue if isinstance(message, RejoinReport)]
    assert len(reports) == 1 and not reports[0].cleared and reports[0].nonce == 5
    assert reports[0].c_max_index == (-1, -1, -1) and reports[0].o_end == 0


def test_two_replicas_rejoining_at_once_in_five_both_finish() -> None:
    """Each counts the other's report (it knows nothing yet) towards everyone having been
    asked, and takes what it holds from the three that kept their disks: every quorum of
    three that held one's lost life also holds one of them."""
    stepper = busy_cluster(5)
    first, second = wipe(stepper, 1), wipe(stepper, 3)
    for _ in range(300):
        stepper.round()
    assert not asking(first) and not asking(second)
    assert cleared(first) and cleared(second)
    assert counters(first)["rejoin.reported"] == counters(second)["rejoin.reported"] == 1


def test_two_replicas_rejoining_at_once_in_three_wait_for_ever() -> None:
    """Two of three disks lost at once: a quorum that chose a value may have no member left
    that knows it. Neither takes part; each goes on asking (the README says so)."""
    stepper = busy_cluster(3)
    first, second = wipe(stepper, 1), wipe(stepper, 2)
    for _ in range(200):
        stepper.round()
    assert asking(first) and asking(second)
    assert counters(first)["rejoin.waiting_for_others_rejoining"] > 0


def test_an_epoch_no_tag_could_carry_is_refused() -> None:
    """A report (or a driver's word) of an epoch past what a uint64 tag can carry with room
    to spare is not a life of ours: the report is dropped as invalid, the word ignored."""
    stepper = busy_cluster()
    node = wipe(stepper, 1)
    huge = TAG_EPOCH_MAX + 1
    report = RejoinReport(0, 0, (0, 0, 0), (-1, -1, -1), 0, huge, 0)
    assert check_message(report, 3) is not None
    node.step(report)
    assert counters(node)["dropped.invalid_message"] == 1
    node.raise_epoch_floor(huge)
    stepper.node(2).heard_old_life(1, huge)
    for _ in range(40):
        stepper.round()
    assert not asking(node) and node.epoch < 1000


def test_its_state_says_whom_it_waits_for_then_that_it_catches_up() -> None:
    stepper = busy_cluster()
    node = wipe(stepper, 1)
    stepper.process(1)
    stepper.drop(to(2, RejoinQuery))
    stepper.deliver(to(0))
    stepper.process(0)
    stepper.deliver(to(1))
    state = node.rejoin_state()
    assert state is not None and "no report yet from replicas 2 " in state
    assert stepper.node(0).rejoin_state() is None
    for _ in range(40):
        stepper.round()
    state = node.rejoin_state()
    assert state is not None and "votes for no sequencer" in state
    for _ in range(300):
        stepper.round()
    assert node.rejoin_state() is None
