"""View changes at their edges. At 5 replicas the rebuild fills for the invisible command
leader (the paper's R_m) before the old sequencer, whose C-instances the voters accepted
without seeing their slots: filled first (the lower id), the old sequencer took R_m's hole,
and R_m's ready command moved behind one proposed after it was ready. A view log that a newer
view overruled (it chose another value at one of its slots, learned here through a commit)
is neither installed nor rebuilt: installed, it met the committed value on the O-agreement
assert and stopped the replica, again at every resend of that NewView."""

from __future__ import annotations

from collections.abc import Callable

from consensus.messages import NO_CL, NewView, OAccept, OAck, OCommit, OEntry, Vote, VoteRequest
from consensus.view_change import rebuild_log
from tests.consensus.stepper import Stepper


def five(sender: int, entries: list[tuple[int, int, int, bool]],
         c_max_index: tuple[int, ...]) -> Vote:
    return Vote(sender, 9, 0, 0, tuple(OEntry(*entry) for entry in entries), c_max_index, 0, 0)


def test_rebuild_fills_for_the_invisible_leader_before_the_old_sequencer() -> None:
    """5 replicas, view 0 (sequencer 0). Slot 0 = 4, seen by 0 and 4 only: C(4,0) is ready at
    4 by the 5-replica rule. Slot 1 = 1 (voter 1's command, proposed after). 0's own C(0,0)
    was accepted by voters but its slot never left 0. Voters 1, 2, 3: slot 0 is a hole that
    belongs to 4 (the paper's R_m); the old sequencer's C(0,0) was never ready and needs no
    slot there. The rebuild gives slot 0 to 0 (filled first, lowest id) and moves C(4,0)
    behind C(1,0)."""
    accepted = (0, 0, -1, -1, 0)
    votes = [five(1, [(1, 1, 0, False)], accepted), five(2, [], accepted),
             five(3, [], accepted)]
    values = rebuild_log(votes, 0, 5, [0] * 5)
    assert values is not None and values[0] == 4, values


def _settle_losing_slot_0(cluster: Stepper, also: Callable[[int, int], bool]) -> None:
    """Rounds of processing and delivery in which every O-accept run covering slot 0 is lost
    on the way to 1, 2 and 3, and so are their empty gap acknowledgements (asking for slot 0
    again), and whatever `also` (source, target) names."""
    def lost(source: int, target: int, message: object) -> bool:
        if source == 0 and target in (1, 2, 3) and isinstance(message, OAccept):
            return message.start <= 0 < message.start + len(message.values)
        if also(source, target):
            return True
        return target == 0 and isinstance(message, OAck) and message.start == message.end

    for _ in range(6):
        cluster.process_all()
        cluster.drop(lost)
        cluster.deliver()
    cluster.process_all()
    cluster.drop(lost)


def test_a_ready_command_of_an_invisible_leader_keeps_its_place_ahead_of_a_later_one() -> None:
    cluster = Stepper(5)
    for _ in range(20):
        cluster.round()
    assert cluster.node(0).inspect.is_sequencer

    def settle() -> None:
        _settle_losing_slot_0(cluster, also=lambda source, target: False)

    cluster.node(4).propose(b"a")
    settle()
    assert cluster.node(0).inspect.o_value(0) == 4
    assert cluster.node(1).inspect.o_value(0) is None
    assert any(True for _ in cluster.readied[4]), "C(4,0) is ready at 4"

    cluster.node(1).propose(b"b")  # only now, after a was ready
    settle()
    assert cluster.node(1).inspect.o_value(1) == 1
    assert cluster.node(1).inspect.o_value(0) is None

    # the old sequencer's own command: C-accepted by 1 and 2, its O-accepts lost
    cluster.node(0).propose(b"x")
    cluster.process(0)
    cluster.drop(lambda source, target, message: source == 0 and isinstance(message, OAccept))
    cluster.deliver(lambda source, target, message: source == 0)
    cluster.process_all()
    assert cluster.node(1).inspect.o_value(0) is None
    cluster.crash(0)
    cluster.crash(4)

    for _ in range(3000):
        cluster.round()
        if all(len(cluster.executed[replica]) >= 3 for replica in (1, 2, 3)):
            break
    order = [batch for _, batch in cluster.executed[1]]
    assert "[a]" in order and "[b]" in order, order
    assert order.index("[a]") < order.index("[b]"), order


def test_a_view_log_superseded_by_a_newer_view_does_not_crash_a_replica_that_learned_its_commit(
) -> None:
    """5 replicas. Slot 0 = 4 is accepted by 0 and 4 only (view 0); slot 1 = 1 reaches 1.
    View 1 (candidate 1, voters 1, 2, 3) rebuilds [NO_CL, 1]; its log reaches nobody but 1 in
    time. View 5 (candidate 0, voters 0, 3, 4) chooses [4, 1] and serves. Replica 2, still
    waiting for view 1's log, learns from 4's O-commit that slot 0 is 4; then view 1's log
    (a resend, or a late copy) reaches it. That log is superseded (a newer view chose
    otherwise); installing it must not trip the O-agreement assert and kill the replica."""
    cluster = Stepper(5)
    for _ in range(20):
        cluster.round()

    def settle() -> None:  # C(4,0) reaches 0 only
        _settle_losing_slot_0(cluster, also=lambda source, target: (source, target) == (4, 1))

    cluster.node(4).propose(b"a")
    settle()
    cluster.node(1).propose(b"b")
    settle()
    assert cluster.node(0).inspect.o_value(0) == 4
    assert cluster.node(4).inspect.o_value(0) == 4
    assert cluster.node(1).inspect.o_value(1) == 1
    assert all(cluster.node(r).inspect.o_value(0) is None for r in (1, 2, 3))

    # 0 is cut off until every lease ran out (no election timeout yet)
    everyone = range(5)
    cluster.blocked = {(0, r) for r in everyone} | {(r, 0) for r in everyone}
    for _ in range(45):
        cluster.tick()
        cluster.process_all()
        cluster.drop(lambda s, t, m: True)

    # view 1: candidate 1, voters 1, 2, 3
    cluster.node(1)._election.start_candidacy()
    cluster.process(1)
    cluster.drop(lambda s, t, m: s == 1 and t in (0, 4))
    cluster.deliver(lambda s, t, m: isinstance(m, VoteRequest))
    cluster.process(2)
    cluster.process(3)
    cluster.deliver(lambda s, t, m: t == 1)
    cluster.process(1)
    assert cluster.node(1).status().status == "establishing"
    late = cluster.drop(lambda s, t, m: s == 1 and t == 2 and isinstance(m, NewView))
    assert late and isinstance(late[0][2], NewView) and late[0][2].values[0] == NO_CL
    cluster.drop(lambda s, t, m: s == 1)  # 3 never gets it either
    cluster.queue = []

    # view 5: candidate 0, voters 0, 3, 4; 1 and 2 hear nothing of it but 4's O-commit
    cluster.blocked = {(s, t) for s in everyone for t in everyone
                       if (s in (0, 3, 4)) != (t in (0, 3, 4))} - {(4, 2)}
    cluster.node(0)._election.start_candidacy()
    for _ in range(30):
        cluster.tick([0, 3, 4])
        cluster.process_all()
        cluster.deliver(lambda s, t, m: not (s == 4 and t == 2))
        cluster.process_all()
        if cluster.node(0).inspect.is_sequencer and \
                cluster.node(4).inspect.committed_o(0) == 4:
            break
    assert cluster.node(0).status().view == 5 and cluster.node(0).inspect.is_sequencer
    assert cluster.node(4).inspect.committed_o(0) == 4
    cluster.deliver(lambda s, t, m: s == 4 and t == 2 and isinstance(m, OCommit))
    cluster.queue = []
    assert cluster.node(2).inspect.committed_o(0) == 4
    assert cluster.node(2).status().view == 1

    cluster.queue.extend(late)  # view 1's log reaches 2 at last
    cluster.blocked = set()
    cluster.deliver(lambda s, t, m: t == 2)  # AssertionError (O-agreement) before the fix
    assert cluster.node(2).inspect.committed_o(0) == 4
