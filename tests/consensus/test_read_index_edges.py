"""Read indexes at their edges, stepped by hand: a reply meant for a read of a replica's
previous life must not serve a read of its new one (read ids start again at every start of
the driver, so one such reply once served a read at an index from before the restart: a
stale read, seen in a live run under `kill -9`)."""

from __future__ import annotations

from consensus.messages import ReadIndexReply, ReadIndexRequest
from consensus.records import EpochRecord
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
