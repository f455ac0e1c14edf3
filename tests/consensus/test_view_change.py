"""The new sequencer's log rebuild: highest view wins, committed beats all, values an installed
newer view ruled out are holes, and the hole rules for 3 and for 5 replicas (paper §3.3,
Fig. 7)."""

from __future__ import annotations

from consensus.messages import NO_CL, OEntry, Vote
from consensus.view_change import rebuild_log


def vote(sender: int, entries: list[tuple[int, int, int, bool]],
         c_max_index: tuple[int, ...] = (-1, -1, -1), installed: tuple[int, int] = (0, 0),
         ) -> Vote:
    """`entries`: (slot, value, view, committed); `installed`: (view, end) of the newest view
    log the voter installed."""
    return Vote(sender, 9, 0, 0, tuple(OEntry(*entry) for entry in entries), c_max_index,
                *installed)


def test_the_value_accepted_in_the_highest_view_wins() -> None:
    votes = [vote(0, [(0, 1, 3, False)]), vote(1, [(0, 2, 5, False)])]
    assert rebuild_log(votes, 0, 3, [0, 0, 0]) == (2,)


def test_a_committed_value_wins_over_a_newer_view() -> None:
    votes = [vote(0, [(0, 1, 3, True)]), vote(1, [(0, 1, 5, False)])]
    assert rebuild_log(votes, 0, 3, [0, 0, 0]) == (1,)


def test_three_replicas_fill_holes_with_no_cl() -> None:
    votes = [vote(0, [(0, 1, 1, False), (2, 2, 1, False)]), vote(1, [(3, 1, 1, False)])]
    assert rebuild_log(votes, 0, 3, [0, 0, 0]) == (1, NO_CL, 2, 1)


def test_entries_before_the_start_are_ignored() -> None:
    votes = [vote(0, [(0, 1, 1, True), (5, 2, 1, False)]), vote(1, [])]
    assert rebuild_log(votes, 5, 3, [0, 1, 0]) == (2,)


def test_an_empty_vote_gives_an_empty_log() -> None:
    assert rebuild_log([vote(0, []), vote(1, [])], 7, 3, [2, 2, 3]) == ()


def test_a_value_of_a_view_older_than_an_installed_log_past_its_end_is_a_hole() -> None:
    """Voter 1 still holds slot 0 from view 0; voter 0 installed view 2's log, which ended at
    slot 0, and holds slot 1 from view 2: slot 0 was ruled out by view 2, so it is NO_CL, not
    replica 0's (which would put 0's command ahead of 2's, ready since view 2)."""
    votes = [vote(0, [(1, 2, 2, False)], installed=(2, 0)), vote(1, [(0, 0, 0, False)])]
    assert rebuild_log(votes, 0, 3, [0, 0, 0]) == (NO_CL, 2)
    assert rebuild_log([votes[1], vote(0, [], installed=(2, 0))], 0, 3, [0, 0, 0]) == ()


def test_an_installed_log_rules_out_older_values_only_past_its_end_and_never_commits() -> None:
    votes = [vote(0, [(0, 2, 2, False)], installed=(2, 1)),
             vote(1, [(0, 0, 0, False), (1, 0, 1, False), (2, 1, 0, True)])]
    # slot 0: view 2's value wins by view; slot 1: older than view 2 and past its end: a
    # hole; slot 2: known committed, so kept whatever its view
    assert rebuild_log(votes, 0, 3, [0, 0, 0]) == (2, NO_CL, 1)
    votes = [vote(0, [], installed=(1, 0)), vote(1, [(0, 0, 1, False)])]
    assert rebuild_log(votes, 0, 3, [0, 0, 0]) == (0,)  # accepted in the installed view itself


def five(sender: int, entries: list[tuple[int, int, int, bool]],
         c_max_index: tuple[int, ...], installed: tuple[int, int] = (0, 0)) -> Vote:
    return vote(sender, entries, c_max_index, installed)


def test_five_replicas_give_an_invisible_leader_a_slot_an_older_view_held() -> None:
    """Voter 1 holds slot 0 for replica 0 from view 0, ruled out by view 2's log (ended at 0)
    that voter 3 installed: replica 2, which voted in neither, had C(2,0) accepted by 3 and 4,
    so it gets slot 0, not a place after the stale value."""
    accepted = (-1, -1, 0, -1, -1)
    votes = [five(1, [(0, 0, 0, False)], accepted), five(3, [], accepted, installed=(2, 0)),
             five(4, [], accepted)]
    assert rebuild_log(votes, 0, 5, [0] * 5) == (2,)


def test_five_replicas_give_an_invisible_leader_its_accepted_instances() -> None:
    # Voters 1, 3, 4 saw nothing at slot 0; replica 2's C(2,0) was accepted by 3 and 4.
    accepted = (-1, -1, 0, -1, -1)
    votes = [five(1, [], accepted), five(3, [], accepted), five(4, [], accepted)]
    assert rebuild_log(votes, 0, 5, [0] * 5) == (2,)


def test_five_replicas_fill_the_holes_before_the_leaders_last_instance() -> None:
    # Replica 2 had C(2,0) and C(2,1) accepted; the voters saw one slot for 2, at slot 3,
    # and holes at 0, 2 and 4. Slot 0 takes 2 (2 needs two slots); its second slot is then
    # slot 3 with a hole before it, so slot 2 takes 2 too; the hole at 4 becomes NO_CL.
    accepted = (-1, 0, 1, -1, -1)
    votes = [five(1, [(1, 1, 4, False), (3, 2, 4, False), (5, 1, 4, False)], accepted),
             five(3, [], accepted), five(4, [], accepted)]
    assert rebuild_log(votes, 0, 5, [0] * 5) == (2, 1, 2, 2, NO_CL, 1)


def test_five_replicas_count_instances_before_the_start() -> None:
    # Replica 0 (old sequencer) already has 2 slots before the start: nothing to add for it.
    accepted = (1, -1, -1, -1, -1)
    votes = [five(2, [], accepted), five(3, [], accepted), five(4, [], accepted)]
    assert rebuild_log(votes, 10, 5, [2, 0, 0, 0, 0]) == ()


def test_three_replicas_never_invent_slots_for_absent_replicas() -> None:
    votes = [vote(0, [], (-1, -1, 4)), vote(1, [], (-1, -1, 4))]
    assert rebuild_log(votes, 0, 3, [0, 0, 0]) == ()
