"""Read indexes at their edges, stepped by hand: a reply meant for a read of a replica's
previous life must not serve a read of its new one (read ids start again at every start of
the driver, so one such reply once served a read at an index from before the restart: a
stale read, seen in a live run under `kill -9`); a sequencer grants its own reads when a
lease grant comes in, never on a tick (the driver replays the ticks a pause missed, each at
its past `now`: judged there, a lease that ran out looked valid, and a deposed sequencer
served a stale read)."""

from __future__ import annotations

from consensus.messages import (
    NO_INDEX,
    LeaseGrant,
    OCommit,
    ReadIndexReply,
    ReadIndexRequest,
)
from consensus.records import EpochRecord
from tests.consensus.stepper import Stepper
from tests.consensus.test_election_edges import ROUNDS_MAX, warmed_up


def test_a_read_index_granted_before_a_restart_serves_no_read_after_it() -> None:
    cluster = warmed_up({0: b"before"})
    cluster.node(1).read(1)
    cluster.process(1)
    cluster.deliver(lambda source, target, message: isinstance(message, ReadIndexRequest))
    cluster.process(0)
    held = cluster.drop(lambda source, target, message: isinstance(message, ReadIndexReply))
    assert held, "the sequencer granted no read index"
    cluster.crash(1)
    cluster.restart(1)
    cluster.blocked = {(0, 1), (2, 1)}  # 1 hears nothing new: only the late reply below
    cluster.node(0).propose(b"after")
    for _ in range(ROUNDS_MAX):
        cluster.round()
        if any("after" in batch for _, batch in cluster.executed[0]):
            break
    else:
        raise AssertionError("the write never ran at the sequencer")
    cluster.node(1).read(1)  # the new life's first read has the same id
    cluster.process(1)
    cluster.drop(lambda source, target, message: isinstance(message, ReadIndexRequest))
    cluster.blocked = set()
    cluster.queue.extend(held)
    cluster.deliver(lambda source, target, message: isinstance(message, ReadIndexReply))
    cluster.process(1)
    for read_id, seen in cluster.reads[1]:
        assert any("after" in batch for batch in seen), (read_id, seen)


def test_a_restarted_replica_asks_for_read_indexes_only_once_its_new_epoch_is_on_disk() -> None:
    """Replies are told apart by the asker's epoch; a request sent before the new epoch's
    record is synced could name an epoch that a crash then hands out again."""
    cluster = warmed_up({})
    cluster.crash(1)
    cluster.restart(1)
    node = cluster.node(1)
    node.read(1)
    ready = node.ready()
    assert any(isinstance(record, EpochRecord) for record in ready.records) and ready.must_sync
    assert not [message for _, message in ready.messages
                if isinstance(message, ReadIndexRequest)]
    assert [message for _, message in ready.messages_after_persist
            if isinstance(message, ReadIndexRequest)]
    node.advance()
    node.read(2)
    assert [message for _, message in node.ready().messages
            if isinstance(message, ReadIndexRequest)]  # from then on, at once


def _grants_lost_until_the_lease_lapses(cluster: Stepper) -> None:
    """Sequencer 0's lease runs out: its heartbeats reach the followers, their grants are lost."""
    for _ in range(60):
        cluster.tick()
        cluster.process_all()
        cluster.drop(lambda source, target, message: isinstance(message, LeaseGrant))
        cluster.deliver()
        cluster.process_all()
    assert not cluster.node(0)._sequencer.lease_valid()


def _renew_the_lease(cluster: Stepper) -> None:
    for _ in range(12):
        cluster.round()
        if cluster.node(0)._sequencer.lease_valid():
            return
    raise AssertionError("sequencer 0 never held a lease again")


def _write_while_0_is_paused(cluster: Stepper) -> None:
    """0 neither ticks nor takes input; 1 and 2 elect a new sequencer and write AFTER."""
    cluster.blocked = {(0, 1), (0, 2), (1, 0), (2, 0)}

    def step_1_and_2() -> None:
        cluster.tick([1, 2])
        for _ in range(2):
            cluster.process(1)
            cluster.process(2)
            cluster.drop(lambda source, target, message: 0 in (source, target))
            cluster.deliver()

    for _ in range(ROUNDS_MAX):
        step_1_and_2()
        if cluster.node(1).inspect.is_sequencer or cluster.node(2).inspect.is_sequencer:
            break
    else:
        raise AssertionError("no new sequencer")
    writer = 1 if cluster.node(1).inspect.is_sequencer else 2
    cluster.node(writer).propose(b"AFTER")
    for _ in range(200):
        step_1_and_2()
        if any("AFTER" in batch for _, batch in cluster.executed[writer]):
            return
    raise AssertionError("the write never completed")


def test_a_sequencer_waiting_for_its_lease_grants_its_reads_when_the_lease_is_renewed() -> None:
    """Not at the read's next resend tick, which may come while the driver replays the ticks
    missed in a pause: judged at such a tick, long past in real time, a lease that ran out
    looked valid, and the deposed sequencer served a stale read (a write done meanwhile by a
    new sequencer was missing)."""
    cluster = warmed_up({0: b"w0"})
    _grants_lost_until_the_lease_lapses(cluster)
    cluster.node(0).read(7)  # no lease: the read waits
    cluster.process(0)
    assert not cluster.reads[0]
    _renew_the_lease(cluster)
    served_in_lease = len(cluster.reads[0])
    _write_while_0_is_paused(cluster)
    for _ in range(100):  # 0 wakes: its driver replays the ticks it missed, then takes input
        cluster.node(0).tick()
    cluster.process(0)
    for read_id, seen in cluster.reads[0][served_in_lease:]:
        assert any("AFTER" in batch for batch in seen), (read_id, seen)  # a stale read
    assert [read_id for read_id, _ in cluster.reads[0]] == [7]  # under the renewed lease


def test_a_sequencer_grants_no_read_on_a_tick() -> None:
    """Even with a read waiting under a lease valid at the tick (here the grant's callback is
    silenced to make one): a replayed tick's `now` is not the real time."""
    cluster = warmed_up({0: b"w0"})
    _grants_lost_until_the_lease_lapses(cluster)
    cluster.node(0).read(7)
    cluster.process(0)
    cluster.node(0)._sequencer.on_lease_renewed = lambda: None
    _renew_the_lease(cluster)
    _write_while_0_is_paused(cluster)
    for _ in range(100):
        cluster.node(0).tick()
    cluster.process(0)
    assert not cluster.reads[0]


def test_a_sequencer_that_learned_of_a_newer_views_slot_serves_no_read_in_its_lease() -> None:
    """A commit past this view's log means a newer view chose slots: the sequencer was
    deposed, so its lease can no longer be trusted (the clocks broke its bound, or the
    replicas disagree on how long a tick is). Its own reads and read indexes wait."""
    cluster = warmed_up({0: b"w0"})
    sequencer = cluster.node(0)
    assert sequencer._sequencer.lease_valid()
    beyond = sequencer.inspect.log_end
    sequencer.step(OCommit(sender=1, view=1, slots=(beyond,), values=(1,)))
    assert sequencer.inspect.is_sequencer  # a commit is a fact of any view: still in view 0
    sequencer.read(7)
    sequencer.step(ReadIndexRequest(sender=2, view=0, read_id=1, epoch=0))
    cluster.process(0)
    assert not cluster.reads[0]
    assert [message.executed_upto for _, _, message in cluster.queue
            if isinstance(message, ReadIndexReply)] == [NO_INDEX]
