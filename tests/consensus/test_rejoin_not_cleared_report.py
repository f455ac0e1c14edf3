"""Two rejoins in five replicas, one after the other: the second must take the bounds of the
first one's report although that one is not yet cleared, for what its new life leads and
accepts may be all that records a value chosen with the second's lost vote."""

from __future__ import annotations

from collections.abc import Callable

from consensus.messages import (
    CAccept,
    CAck,
    FetchReply,
    Message,
    RejoinQuery,
    RejoinReport,
    SnapshotChunk,
)
from tests.consensus.test_rejoin import asking, busy_cluster, cleared, to, wipe


def test_a_value_led_by_a_replica_not_yet_cleared_survives_a_second_rejoin() -> None:
    """Replica 2 rejoined and is reported, serving, but not cleared (blind in space 1, whose
    last instance only replica 1 holds). It leads index J of its own space: the C-accept
    reaches W, which acks, then W loses its disk; X's copy is slow. W's rejoin asks all:
    replica 2 answers cleared=False and its report (index J) is thrown away, and X answered
    before the slow C-accept came, so W's bound for space 2 stays at J. X accepts: J is
    chosen by {2, W (old life), X}. With 2 cut off and X's space-2 messages lost, the others
    recover space 2 at J with W's promise (no longer blind there): a no-op, chosen too."""
    stepper = busy_cluster(5)
    stepper.queue = []
    stepper.node(1).propose(b"p")
    stepper.process(1)
    held_index = stepper.node(1)._ctx.clog[1].max_index

    def held(source: int, target: int, message: Message) -> bool:
        return source == 1 and getattr(message, "space", None) == 1 and \
            getattr(message, "index", None) == held_index

    def step(lost: Callable[[int, int, Message], bool] = held) -> None:
        stepper.tick()
        stepper.process_all()
        stepper.drop(lost)
        stepper.deliver()
        stepper.process_all()
        stepper.drop(lost)

    stepper.drop(held)
    second = wipe(stepper, 2)
    for _ in range(120):
        step()
        if not asking(second) and not second._leader.lagging():
            break
    assert not asking(second) and not cleared(second)
    stepper.queue = []
    second.propose(b"v")
    stepper.process(2)
    index = second._ctx.clog[2].max_index
    first_target, slow = [target for _, target, message in stepper.queue
                          if isinstance(message, CAccept)]
    late = stepper.drop(to(slow, CAccept))
    stepper.deliver(to(first_target, CAccept))
    stepper.process(first_target)
    stepper.deliver(to(2, CAck))
    stepper.process(2)
    stepper.crash(first_target)
    lost = wipe(stepper, first_target)
    stepper.process(first_target)
    stepper.deliver(lambda source, target, message: isinstance(message, RejoinQuery))
    stepper.process_all()
    stepper.deliver(lambda source, target, message: isinstance(message, RejoinReport))
    stepper.process_all()
    assert not asking(lost)
    everyone = set(range(5))
    stepper.blocked = {(2, other) for other in everyone} | {(other, 2) for other in everyone}
    for _ in range(80):
        step()
        if not lost._rejoin_gate.blind(2):
            break
    stepper.blocked -= {(2, slow), (slow, 2)}
    stepper.queue.extend(late)
    stepper.deliver(to(slow, CAccept))
    stepper.process(slow)
    stepper.deliver(to(2, CAck))
    stepper.process(2)
    assert second._ctx.clog[2].is_committed(index)
    chosen = second._ctx.clog[2].slots[index].batch
    stepper.queue = []
    stepper.blocked = {(2, other) for other in everyone} | {(other, 2) for other in everyone}

    def slow_loses(source: int, target: int, message: Message) -> bool:
        return held(source, target, message) or (source == slow and (
            getattr(message, "space", None) == 2 or
            isinstance(message, FetchReply | SnapshotChunk)))

    for _ in range(200):
        step(slow_loses)
    for replica in everyone:
        slot = stepper.node(replica)._ctx.clog[2].slots.get(index)
        if slot is not None and slot.committed:
            assert slot.batch == chosen, (replica, slot.batch, chosen)
