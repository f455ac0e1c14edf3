"""A value an older view left on a replica that missed the next view's log must not come back
at a later view change past that log's end: there it would take the place of a hole and move a
command the view made ready behind one proposed after it (invariant 7 of the SDPaxos notes, the
simulator monitor's ready-order check). Stepped by hand with the golden-script harness."""

from __future__ import annotations

from consensus.messages import Message, OAccept, OAck
from tests.consensus.interaction import Harness, process, run_command

ROUNDS_MAX = 400


def do(harness: Harness, line: str) -> list[str]:
    harness.output = []
    run_command(harness, line)
    return list(harness.output)


def slot_zero_to_replica_0_lost(source: int, target: int, message: Message) -> bool:
    """On the link 2->0 every O-accept covering slot 0 is lost, and so are 0's empty gap
    acknowledgements back: slot 0 stays accepted by replica 2 alone."""
    if (source, target) == (2, 0) and isinstance(message, OAccept):
        return message.start <= 0 < message.start + len(message.values)
    return (source, target) == (0, 2) and isinstance(message, OAck) and message.start == message.end


def settle(harness: Harness, *, lose_slot_zero: bool = True) -> list[str]:
    """Replicas 0 and 2 handle and deliver until nothing is queued; what they output."""
    output: list[str] = []
    for _ in range(10):
        harness.output = []
        process(harness, 0)
        process(harness, 2)
        output += harness.output
        if lose_slot_zero:
            harness.queue = [queued for queued in harness.queue
                             if not slot_zero_to_replica_0_lost(*queued)]
        if not harness.queue:
            break
        do(harness, "deliver")
    return output


def step(harness: Harness, ticks: int) -> None:
    for _ in range(ticks):
        harness.node(0).tick()
        harness.node(2).tick()
        settle(harness)


def test_a_stale_order_value_past_an_installed_view_log_does_not_reorder_a_ready_command(
) -> None:
    """3 replicas. Replica 1 holds slot 0 = replica 0, accepted in view 0 and never chosen (the
    old sequencer crashed before its own write was durable). View 2 is elected without 1; its
    sequencer 2 puts its own command eps in slot 0 (only 2 accepts it) and omega in slot 1
    (committed), so eps is ready by the 3-replica rule (one O-instance of 2 committed). Only
    then is beta proposed at replica 0 (slot 2). 2 crashes; 0 and 1 elect view 3, whose rebuild
    must not take 1's view-0 value for slot 0 (view 2's log, which 0 installed, ended before
    it): that would run beta in slot 0, ahead of eps."""
    harness = Harness()
    do(harness, "cluster 3")
    do(harness, "propose 0 d")  # view 0: sequencer 0 orders its own command ...
    do(harness, "process 0")
    harness.queue = [queued for queued in harness.queue if isinstance(queued[2], OAccept)]
    do(harness, "deliver 0->1")  # ... and only replica 1 gets the O-accept
    do(harness, "process 1")
    do(harness, "crash 0")
    harness.records[0] = []  # 0 crashed before its sync: nothing of it reached the disk
    do(harness, "partition 1 | 0 2")
    do(harness, "restart 0")
    assert harness.node(1).inspect.o_value(0) == 0

    for round_number in range(ROUNDS_MAX):  # 2 is elected in view 2 with 0's vote
        harness.node(2).tick()
        if round_number < 45:
            harness.node(0).tick()
        settle(harness, lose_slot_zero=False)
        if harness.node(2).status().is_sequencer:
            break
    assert harness.node(2).status().view == 2 and harness.node(2).status().is_sequencer

    step(harness, 12)
    do(harness, "propose 2 eps")
    settle(harness)
    do(harness, "propose 2 omega")
    assert "2 ready C(2,0)" in settle(harness)  # eps is ready: its client may be answered
    assert harness.node(2).inspect.committed_o(0) is None  # though slot 0 is not committed

    do(harness, "propose 0 beta")  # only now
    for _ in range(ROUNDS_MAX):
        step(harness, 1)
        if harness.node(0).inspect.committed_c(0, 0) is not None:
            break
    step(harness, 3)
    do(harness, "crash 2")
    do(harness, "heal")
    executed = [line for line in do(harness, "run n=400") if line.startswith("0 executes")]
    order = " ".join(line.split("] ")[0].split("[")[-1] for line in executed if "[" in line)
    assert "eps" in order and "beta" in order, executed
    assert order.index("eps") < order.index("beta"), executed
