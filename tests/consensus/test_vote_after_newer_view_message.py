"""A replica that hears of a new view from something other than its vote request (a recovery
prepare its candidate sent in the same step, which leaves before the request: the request waits
for the candidate's view record to be on disk) still votes in that view. It once adopted the
view as "awaiting" and then withheld its vote as if it had voted already: the only majority
left (the candidate and itself) elected no one, and the stalled recovery kept repeating it."""

from __future__ import annotations

from consensus.messages import (
    CAccept,
    CAck,
    CNack,
    CPrepare,
    CPromise,
    Message,
    PreVote,
    PreVoteRequest,
    Vote,
    VoteRequest,
)
from tests.consensus.stepper import Stepper

TICKS_MAX = 2000


def recovery_traffic(source: int, target: int, message: Message) -> bool:
    return isinstance(message, CPrepare | CPromise | CNack) or (
        isinstance(message, CAccept) and message.sender != message.space)


def test_a_replica_told_of_a_view_by_a_recovery_prepare_still_votes_in_it() -> None:
    """3 replicas. Sequencer 0's own command is ordered at 1 (O committed there) but its
    C-instance is not chosen when 0 crashes, so 1's execution stalls on it and 1 keeps trying
    to recover 0's space. 1 stands for view 1: in the step it gets 2's pre-vote, a tick starts a
    recovery round, whose prepare (view 1) reaches 2 before the vote request. 2 must vote."""
    cluster = Stepper(3)
    for _ in range(20):
        cluster.round()
    cluster.node(0).propose(b"alpha")
    cluster.process(0)
    for _ in range(5):  # 0's C-accept and O-accept reach 1 only, then 1's O-ack (not its
        # C-ack) reaches 0, and 0's O-commit reaches 1 only
        cluster.drop(lambda source, target, message: {source, target} != {0, 1} or
                     isinstance(message, CAck))
        cluster.deliver()
        cluster.process_all()
    cluster.crash(0)
    assert cluster.node(1).inspect.committed_o(0) == 0
    assert cluster.node(1).inspect.committed_c(0, 0) is None

    held: list[tuple[int, int, Message]] = []
    for _ in range(TICKS_MAX):  # recovery rounds fail (their messages are lost) meanwhile
        cluster.tick()
        cluster.process_all()
        cluster.drop(recovery_traffic)
        cluster.drop(lambda source, target, message: source == 2 and
                     isinstance(message, PreVoteRequest))
        held += cluster.drop(lambda source, target, message: source == 2 and
                             isinstance(message, PreVote) and message.granted)
        cluster.deliver()
        cluster.process_all()
        recovery = cluster.node(1)._recovery
        if held and dict(cluster.node(1).status().counters).get("recovery.timed_out") and \
                0 not in recovery.rounds and \
                cluster.node(1).inspect.now + 1 >= recovery._not_before[0] and \
                cluster.node(1).executed_slots == 0:
            break
    else:
        raise AssertionError("replica 1 never got to stand while it could recover again")
    node = cluster.node(1)
    node.step(held[-1][2])  # the pre-vote grant: 1 stands for view 1
    node.tick()  # in the same step, a recovery round of 0's space starts again
    assert 0 in node._recovery.rounds
    cluster.process(1)
    kinds = [type(message) for source, target, message in cluster.queue
             if (source, target) == (1, 2)]
    assert kinds.index(CPrepare) < kinds.index(VoteRequest)  # the prepare leaves first
    cluster.deliver()
    cluster.process_all()
    assert any(isinstance(message, Vote) and source == 2
               for source, _, message in cluster.queue), "2 withheld its vote"
    for _ in range(200):
        cluster.round()
    assert cluster.node(1).inspect.is_sequencer
    assert cluster.node(1).executed_slots >= 1
