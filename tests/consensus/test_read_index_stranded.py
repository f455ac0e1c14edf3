"""A read index past every slot a new view will hold no longer strands the read.

Sequencer 0 allocates a slot for a command nobody else heard of, then grants follower 1 a read
index past it, and crashes. 1 and 2 elect a new sequencer whose log ends below that index: with
no new write, 1's read is never answered, though the new sequencer would grant it at once
(the runtime's periodic system command fills one slot a second; a deposed sequencer may have
allocated a window of them)."""

from __future__ import annotations

import pytest

from consensus.messages import ReadIndexReply, ReadIndexRequest
from tests.consensus.stepper import Stepper


def _warm() -> Stepper:
    cluster = Stepper(3)
    for _ in range(20):
        cluster.round()
    cluster.node(0).propose(b"w0")
    for _ in range(10):
        cluster.round()
    return cluster


@pytest.mark.parametrize("reader", [1, 2])  # 1 is the next sequencer, 2 its follower
def test_a_read_index_a_new_view_never_reaches_is_asked_again(reader: int) -> None:
    cluster = _warm()
    cluster.node(0).propose(b"lost")
    cluster.process(0)
    # nothing of the command or its slot leaves 0
    cluster.drop(lambda source, target, message: source == 0)
    end_at_0 = cluster.node(0)._sequencer.next_slot
    cluster.node(reader).read(1)
    cluster.process(reader)
    cluster.deliver(lambda source, target, message: isinstance(message, ReadIndexRequest))
    cluster.process(0)
    replies = cluster.drop(lambda source, target, message: isinstance(message, ReadIndexReply))
    cluster.queue.extend(replies)
    assert [message.executed_upto for _, _, message in replies
            if isinstance(message, ReadIndexReply)] == [end_at_0]
    cluster.deliver(lambda source, target, message: isinstance(message, ReadIndexReply))
    cluster.drop(lambda source, target, message: True)
    cluster.crash(0)
    for _ in range(3000):
        cluster.round()
        if any(cluster.node(r).inspect.is_sequencer for r in (1, 2)):
            break
    else:
        raise AssertionError("no new sequencer")
    assert cluster.node(reader).inspect.log_end < end_at_0  # the index is past the new log
    for _ in range(400):  # no client writes: an idle cluster
        cluster.round()
    assert [read_id for read_id, _ in cluster.reads[reader]] == [1], \
        "the read waits for a slot the new view never fills"
