"""Races around a rejoin (`consensus.rejoin`), stepped by hand: a write torn right after the
reports must not leave a log that restarts as if it held the promises it adopted, and an
answer to an earlier rejoin's query, queued for a life since lost, must not pass for a report
to the new one."""

from __future__ import annotations

from collections.abc import Callable

from consensus.leader import TAG_COUNTER_BITS
from consensus.messages import (
    CAccept,
    CAck,
    CCommit,
    CPrepare,
    CPromise,
    Message,
    RejoinQuery,
    RejoinReport,
)
from consensus.prng import Prng
from consensus.records import Record, RejoinRecord
from consensus.replica import Replica
from tests.consensus.stepper import Stepper
from tests.consensus.test_rejoin import (
    asking,
    busy_cluster,
    cleared,
    old_command_in_flight,
    to,
    wipe,
)


def _torn_after_reported(records: list[Record]) -> list[Record]:
    """A crash with a torn write in the Ready that holds RejoinRecord(reported=True): the
    disk keeps a prefix of that Ready's records, up to and including it."""
    cut = next(position for position, record in enumerate(records)
               if isinstance(record, RejoinRecord) and record.reported)
    return records[:cut + 1]


def test_a_torn_write_after_the_reports_keeps_the_adopted_promises_view_and_epoch() -> None:
    stepper = busy_cluster()
    held = old_command_in_flight(stepper)
    old_epoch = stepper.node(1).epoch
    peers = [stepper.node(0)._ctx, stepper.node(2)._ctx]  # a look inside, for the test
    view = max(ctx.view for ctx in peers)
    promised = [max(ctx.clog[space].promised for ctx in peers) for space in range(3)]
    wipe(stepper, 1)
    stepper.process(1)
    for _ in range(4):  # only the query and the reports go through
        stepper.process_all()
        stepper.deliver(lambda source, target, message: isinstance(
            message, RejoinQuery | RejoinReport))
    assert not asking(stepper.node(1))
    stepper.process(1)
    # The reports' Ready is torn: a prefix of its records is on disk.
    stepper.crash(1)
    stepper.records[1] = _torn_after_reported(stepper.records[1])
    node = Replica.restore(stepper.configs[1], Prng(7), stepper.records[1])
    assert not asking(node)  # it believes the reports' outcome is on its disk
    ctx = node._ctx
    lost = {"view": (ctx.view, view),
            "promises": ([ctx.clog[space].promised for space in range(3)], promised),
            "epoch": (node.epoch, max(old_epoch, held >> TAG_COUNTER_BITS))}
    assert ctx.view >= view, lost
    assert all(ctx.clog[space].promised >= promised[space] for space in range(3)), lost
    assert node.epoch > max(old_epoch, held >> TAG_COUNTER_BITS), lost


def _take(stepper: Stepper, which: Callable[[int, int, Message], bool]) -> list[Message]:
    return [message for _, _, message in stepper.drop(which)]


def test_a_report_answering_a_query_of_an_earlier_rejoin_is_not_taken_for_a_fresh_one() -> None:
    """Replica 1 rejoins; its resent query to replica 0 is slow and is answered only after
    replica 1 had finished rejoining and went on (it promises a round of replica 0). That
    answer, queued for replica 1, reaches it after it lost its disk a second time: taken for
    replica 0's report, it hides the promise, and a C-instance gets two values."""
    stepper = busy_cluster()
    recoverer, rejoiner, owner = 0, 1, 2
    node = wipe(stepper, rejoiner)
    stepper.process(rejoiner)
    stepper.deliver(to(owner, RejoinQuery))
    stepper.process(owner)
    stepper.deliver(to(rejoiner, RejoinReport))
    stepper.deliver(to(recoverer, RejoinQuery))
    stepper.process(recoverer)
    first = _take(stepper, to(rejoiner, RejoinReport))  # slow
    while not [item for item in stepper.queue if to(recoverer, RejoinQuery)(*item)]:
        stepper.tick([rejoiner])  # the query is resent
        stepper.process(rejoiner)
    resent = _take(stepper, to(recoverer, RejoinQuery))  # slower still
    for message in first:
        node.step(message)
    assert not asking(node)
    for _ in range(300):
        stepper.round()
    assert cleared(node)

    # The resent query arrives at last: answered, the answer on its way (slow too).
    for message in resent:
        stepper.node(recoverer).step(message)
    stepper.process(recoverer)
    stale = _take(stepper, to(rejoiner, RejoinReport))
    assert stale

    # The owner proposes; its C-accepts are slow (the one to the rejoiner is kept for later).
    stepper.node(owner).propose(b"owner's value")
    stepper.process(owner)
    accepts = [message for source, _, message in stepper.queue
               if isinstance(message, CAccept) and message.space == owner and source == owner]
    late_accept = accepts[0]  # as sent to a peer (thrifty: one), or resent to another
    index = late_accept.index
    stepper.drop(lambda source, target, message: source == owner)
    # The recoverer finishes the owner's index with a no-op, with the rejoiner's promise
    # and acceptance; the owner hears nothing of it.
    stepper.blocked |= {(recoverer, owner), (rejoiner, owner)}
    stepper.node(recoverer)._recovery.start(owner, index)
    for _ in range(6):
        stepper.process_all()
        stepper.deliver(lambda source, target, message: isinstance(
            message, CPrepare | CPromise | CAccept | CAck | CCommit) and target != owner)
    chosen = stepper.node(recoverer).inspect.committed_c(owner, index)
    assert chosen is not None and chosen != late_accept.batch

    # The rejoiner loses its disk again; the stale answer reaches its new life first. (A
    # driver seeds each life's Prng afresh: the simulator per incarnation, the runtime from
    # os.urandom.)
    stepper.crash(rejoiner)
    stepper.records[rejoiner] = []
    node = stepper.replicas[rejoiner] = Replica.rejoining(stepper.configs[rejoiner], Prng(77))
    stepper.blocked.clear()
    for message in stale:
        node.step(message)
    stepper.process(rejoiner)
    slow = stepper.drop(to(recoverer, RejoinQuery))  # this asking's query: slow
    stepper.deliver(to(owner, RejoinQuery))
    stepper.process(owner)
    stepper.deliver(to(rejoiner, RejoinReport))
    stepper.queue.extend(slow)
    stepper.deliver(to(recoverer, RejoinQuery))
    stepper.process(recoverer)
    stepper.deliver(to(rejoiner, RejoinReport))
    assert not asking(node)
    # The owner's old C-accept arrives now.
    stepper.queue = []
    node.step(late_accept)
    stepper.process(rejoiner)
    stepper.deliver(to(owner, CAck))
    stepper.process(owner)
    assert stepper.node(owner).inspect.committed_c(owner, index) in (None, chosen), \
        "a second value chosen for one C-instance"
