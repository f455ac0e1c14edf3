"""View changes and lost links at their edges, stepped by hand: a pre-vote that outlives a
lease granted after it, a voter that restarts between its vote and the new view's log (both
once broke safety: a stale read; two values for one slot), a leader that cannot reach or hear
the sequencer, and a voter that missed the new view's log and cannot hear the sequencer, with
or without a peer that restarted (their commands once starved for good)."""

from __future__ import annotations

import pytest

from consensus.messages import (
    Heartbeat,
    LeaseGrant,
    NewView,
    NewViewAck,
    PreVoteRequest,
    Vote,
    VoteRequest,
)
from consensus.records import InstallRecord
from tests.consensus.stepper import Stepper

TICKS_MAX = 400
ROUNDS_MAX = 3000


def warmed_up(proposals: dict[int, bytes]) -> Stepper:
    cluster = Stepper(3)
    for _ in range(20):
        cluster.round()
    for replica, command in sorted(proposals.items()):
        cluster.node(replica).propose(command)
    for _ in range(10):
        cluster.round()
    return cluster


def test_a_replica_that_granted_a_lease_does_not_stand_on_an_older_pre_vote() -> None:
    """Replica 1 asks for pre-votes while cut off from sequencer 0; then 0's heartbeat gets
    through and 1 grants it a lease; then 2's late pre-vote grant reaches 1. Had 1 stood,
    it could commit writes while 0, counting 1's lease, still served reads."""
    cluster = warmed_up({0: b"w0"})
    cluster.blocked = {(0, 1), (1, 0), (0, 2), (2, 0)}
    for _ in range(TICKS_MAX):  # until 1 asks for pre-votes; 2's own asks go nowhere
        cluster.tick()
        cluster.process_all()
        cluster.drop(lambda source, target, message: source == 2)
        if any(source == 1 and isinstance(message, PreVoteRequest)
               for source, _, message in cluster.queue):
            break
        cluster.deliver()
    else:
        raise AssertionError("replica 1 never asked for pre-votes")
    held = cluster.drop(lambda source, target, message: source == 1)  # 1->2 waits below
    cluster.blocked = {(0, 2), (2, 0)}  # 0 and 1 hear each other again
    for _ in range(TICKS_MAX):
        cluster.tick()
        cluster.process_all()
        if any(isinstance(message, Heartbeat) and (source, target) == (0, 1)
               for source, target, message in cluster.queue):
            break
    cluster.drop(lambda source, target, message: source == 2)
    cluster.deliver(lambda source, target, message: (source, target) == (0, 1))
    cluster.process(1)
    cluster.deliver(lambda source, target, message: isinstance(message, LeaseGrant))
    cluster.process(0)
    cluster.blocked = {(1, 0), (0, 2), (2, 0)}
    cluster.queue.extend(item for item in held if item[1] == 2)  # the late pre-vote request
    for _ in range(20):
        cluster.round()
    cluster.node(1).propose(b"WRITE")
    for _ in range(8):
        cluster.round()
    written = {batch for replica in (1, 2) for _, batch in cluster.executed[replica]}
    cluster.node(0).read(99)
    cluster.process(0)
    for _, seen in cluster.reads[0]:  # a read served at 0 sees every write done anywhere
        assert written <= set(seen), (written, seen)


def test_a_voter_restarted_before_the_new_view_installs_it_before_acknowledging() -> None:
    """Sequencer 0 orders its own command x at slot j, its run lost; 1 and 2 elect view 1;
    2 votes, crashes before the new view's log reaches it, and restarts in view 1. Its
    acknowledgement of the resent log must vouch for that log, or 1 commits slot j with no
    command while 0 and 2 later give it x."""
    cluster = warmed_up({1: b"a", 2: b"b"})
    cluster.blocked = {(0, 1), (0, 2)}
    cluster.node(0).propose(b"x")
    cluster.process(0)
    cluster.deliver()
    slot = cluster.node(0).inspect.log_end - 1
    cluster.blocked = {(0, 2), (2, 0)}
    cluster.node(1).propose(b"c")
    cluster.process(1)
    cluster.deliver()
    cluster.process_all()
    cluster.blocked = {(0, 2), (2, 0), (1, 0)}
    for _ in range(3):
        cluster.deliver()
        cluster.process_all()
    cluster.crash(0)
    cluster.blocked = set()
    for _ in range(TICKS_MAX):  # until 1 asks for votes (2 is kept from standing)
        cluster.tick()
        cluster.process_all()
        if any(isinstance(message, VoteRequest) and source == 1
               for source, _, message in cluster.queue):
            break
        cluster.drop(lambda source, target, message:
                     source == 2 and isinstance(message, VoteRequest))
        cluster.deliver()
    else:
        raise AssertionError("replica 1 never stood")
    cluster.deliver(lambda source, target, message:
                    isinstance(message, VoteRequest) and (source, target) == (1, 2))
    cluster.process(2)
    cluster.deliver(lambda source, target, message: isinstance(message, Vote))
    cluster.process(1)
    cluster.drop(lambda source, target, message: isinstance(message, NewView))
    cluster.crash(2)
    cluster.restart(2)
    for _ in range(40):  # the new view's log is resent; nothing else from 1 reaches 2
        cluster.tick()
        cluster.process_all()
        cluster.deliver(lambda source, target, message:
                        isinstance(message, NewView | NewViewAck))
        cluster.drop(lambda source, target, message: (source, target) == (1, 2))
        cluster.deliver()
        cluster.process_all()
        if cluster.node(1).inspect.is_sequencer:
            break
    chosen_at_1 = cluster.node(1).inspect.committed_o(slot)
    assert chosen_at_1 is not None  # the new view served and chose slot j
    cluster.crash(1)
    cluster.restart(0)
    for _ in range(600):
        cluster.round()
        if all(cluster.node(replica).executed_slots > slot for replica in (0, 2)):
            break
    for replica in (0, 2):
        chosen = cluster.node(replica).inspect.committed_o(slot)
        assert chosen == chosen_at_1, (replica, chosen, chosen_at_1)


@pytest.mark.parametrize("lost", [{(1, 0)}, {(0, 1)}, {(1, 0), (0, 1)}],
                         ids=["mute", "deaf", "bridge"])
def test_a_leader_cut_off_from_the_sequencer_gets_its_commands_ordered_through_a_peer(
        lost: set[tuple[int, int]]) -> None:
    """Replica 1 cannot reach sequencer 0, or cannot hear it, or both, while 2 reaches both:
    its C-instances commit through 2, but its requests for ordering or their answers are
    lost. Once ordering lags, it asks through its peers (who pass the request on) and
    fetches the commits it may have missed; no view change is needed, and none happens (a
    sequencer that hears the deaf replica's pre-votes had re-elected itself past each)."""
    cluster = warmed_up({})
    cluster.blocked = set(lost)
    for number in range(5):
        cluster.node(1).propose(b"c%d" % number)
        cluster.node(2).propose(b"d%d" % number)
    all_run_in_view(cluster, {f"{kind}{number}" for kind in "cd" for number in range(5)}, 0)


def all_run_in_view(cluster: Stepper, wanted: set[str], view: int) -> None:
    """Round after round until every replica ran `wanted`; they did, and stayed in `view`."""
    for _ in range(ROUNDS_MAX):
        cluster.round()
        if all(commands(cluster, replica) >= wanted for replica in range(3)):
            break
    for replica in range(3):
        assert commands(cluster, replica) >= wanted, (replica, cluster.executed[replica])
        assert cluster.node(replica).status().view == view


def commands(cluster: Stepper, replica: int) -> set[str]:
    """The commands `replica` executed (each batch is described as "[a b c]")."""
    return {command for _, batch in cluster.executed[replica]
            for command in batch.strip("[]").split()}


@pytest.mark.parametrize("peer_restarts", [False, True], ids=["peer-up", "peer-restarted"])
def test_a_replica_that_missed_the_new_view_and_cannot_hear_its_sequencer_joins_through_a_peer(
        peer_restarts: bool) -> None:
    """Sequencer 0 is cut off and 1 is elected; the link from 1 to 2 breaks before the new
    view's log reaches 2, which had voted. 2 can still reach 1, and 0 (healed) hears 1. 2
    learns the view's log and how far it is committed from a peer when its pre-votes are
    refused; its commands then run everywhere, and the view stays as it is (before, the
    sequencer re-elected itself past 2's pre-votes, again and again). A peer that installed
    the log and restarted since has no copy to pass on: it asks the sequencer for one."""
    cluster = warmed_up({})
    cluster.blocked = {(0, 1), (1, 0), (0, 2), (2, 0)}
    for _ in range(ROUNDS_MAX):  # until 1 is elected: its log goes to 2, not to 0
        cluster.tick()
        cluster.process_all()
        cluster.drop(lambda source, target, message:
                     source == 2 and isinstance(message, PreVoteRequest | VoteRequest))
        if any(isinstance(message, NewView) for _, _, message in cluster.queue):
            break
        cluster.deliver()
    else:
        raise AssertionError("replica 1 was never elected")
    view = cluster.node(1).status().view
    cluster.drop(lambda source, target, message: isinstance(message, NewView))
    cluster.blocked = {(1, 2)}
    if peer_restarts:
        cluster.blocked = {(1, 2), (0, 2)}  # 2 hears no relay from 0 before it restarts
        for _ in range(50):  # 0 installs the view's log, and 1 hears that it did
            cluster.round()
        cluster.crash(0)
        cluster.restart(0)
        cluster.blocked = {(1, 2)}
        assert cluster.node(2).status().status != "normal"
    for number in range(3):
        for replica in range(3):
            cluster.node(replica).propose(b"%c%d" % (ord("a") + replica, number))
    all_run_in_view(cluster, {f"{kind}{number}" for kind in "abc" for number in range(3)},
                    view)


def test_a_view_log_received_again_is_acknowledged_without_being_written_again() -> None:
    """The new sequencer resends its log until acknowledged (for ever, to a peer whose
    acknowledgements are lost): each copy was written to the log again, so the record log
    grew by one install per resend."""
    cluster = warmed_up({1: b"a"})
    cluster.crash(0)
    copies: list[NewView] = []
    for _ in range(TICKS_MAX):
        cluster.tick()
        cluster.process_all()
        copies += [message for source, target, message in cluster.queue
                   if isinstance(message, NewView) and target == 2]
        cluster.deliver()
        cluster.process_all()
        if copies and any(cluster.node(replica).inspect.is_sequencer for replica in (1, 2)):
            break
    assert copies, "no view change"
    cluster.records[2].clear()
    cluster.node(2).step(copies[-1])
    cluster.process(2)
    assert not [record for record in cluster.records[2] if isinstance(record, InstallRecord)]
    assert any(isinstance(message, NewViewAck) and source == 2
               for source, _, message in cluster.queue)
