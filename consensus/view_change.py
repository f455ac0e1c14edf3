"""Rebuilding the O-log when a new sequencer takes over (paper §3.3, Fig. 7).

From a majority of votes, each slot from the candidate's committed prefix on takes the value a
voter reports committed, else the one accepted in the highest view (Paxos phase 1, per slot).
A voter's uncommitted value from a view older than the newest view any voter installed, at a
slot past that view's log, is no value: that view's rebuild met every value chosen before it,
so such a slot is a hole, as it is on the replicas that installed the view (`OrderLog.install`).
Without this, a slot a voter still held from before that view could take the place of a hole
and move a command the view made ready behind one proposed after it.

Slots no voter reports are holes:

- 3 replicas, and 7 or more: a hole was never committed (a committed slot was accepted by a
  majority, which meets the voters), so it becomes NO_CL.
- 5 replicas: a command leader commits its O-instance on the sequencer's O-accept alone, so a
  slot seen only by a leader and the old sequencer, both absent from the vote, may be ready
  there. For each replica m that did not vote, with C[m] the number of m's C-instances the
  voters accepted: put m in the first hole (or at the end) until m has at least C[m] slots and
  no hole precedes m's C[m]-th slot. Remaining holes become NO_CL. (If m is alive nothing is
  lost: the extra slots order C-instances m did propose.) The old sequencer, when it did not
  vote, is filled for last: its ready commands had slots a majority accepted, so a hole is
  never its own, and filled first it took the hole of R_m's ready command.
  Known gap, the paper's too: a surplus slot given to m may order a C-instance m had not yet
  proposed. If m, cut off and still in the old view, proposes a command there after a command
  of a later slot became ready, the new command runs first (the paper's invariant 7 broken;
  found by a review with a hand-stepped 5-replica schedule). Clients cannot see it: an answer
  waits for execution, which waits for the surplus slot, so the two commands overlap in time.
  Closing it would need m to retake its surplus indexes as no-ops on learning the view, and
  to tell them from commands it proposed before the view change, which it cannot.

The result is the log from `start` to the new end; the new sequencer has a majority accept it in
the new view before it serves. A log longer than one NewView can carry (`ITEMS_MAX` values: no
peer decodes more) could never be accepted: it is refused (None) before it is built, for the
slots and counts a vote names are a peer's claims (one naming slot 2**62 had the candidate
build a list of 2**62 holes).
"""

from __future__ import annotations

from collections.abc import Sequence

from consensus.codec import ITEMS_MAX
from consensus.messages import NO_CL, Vote

HOLE = -2


def rebuild_log(votes: Sequence[Vote], start: int, replica_count: int,
                counts_before_start: Sequence[int]) -> tuple[int, ...] | None:
    """The new sequencer's log from `start`: one value (replica id or NO_CL) per slot; None
    when it would be longer than a NewView can carry."""
    values = _highest_per_slot(votes, start)
    if values is None:
        return None
    if replica_count == 5:
        voters = {vote.sender for vote in votes}
        newest = max([vote.installed_view for vote in votes]
                     + [entry.view for vote in votes for entry in vote.entries])
        old_sequencer = newest % replica_count  # its ready slots are majority-accepted
        for replica in sorted(range(replica_count), key=lambda r: r == old_sequencer):
            # The old sequencer last: its C-instances take holes only past R_m's.
            if replica not in voters:
                accepted = max(vote.c_max_index[replica] for vote in votes) + 1
                missing = accepted - counts_before_start[replica] - values.count(replica)
                if len(values) + missing > ITEMS_MAX:  # each missing slot may be appended
                    return None
                _fill_for(values, replica, accepted, counts_before_start[replica])
    return tuple(NO_CL if value == HOLE else value for value in values)


def _highest_per_slot(votes: Sequence[Vote], start: int) -> list[int] | None:
    best: dict[int, tuple[bool, int, int]] = {}  # slot -> (committed, view, value)
    installed = max(votes, key=lambda vote: (vote.installed_view, vote.sender))
    for vote in sorted(votes, key=lambda vote: vote.sender):
        for entry in vote.entries:
            if entry.index < start:
                continue
            if (not entry.committed and entry.view < installed.installed_view
                    and entry.index >= installed.installed_end):
                continue  # ruled out by the newest installed view (module docstring)
            candidate = (entry.committed, entry.view, entry.value)
            current = best.get(entry.index)
            if current is None or candidate[:2] > current[:2]:
                if current is not None and current[0]:
                    assert candidate[2] == current[2], f"two committed values at {entry.index}"
                best[entry.index] = candidate
    end = max(best, default=start - 1) + 1
    if end - start > ITEMS_MAX:
        return None
    return [best[slot][2] if slot in best else HOLE for slot in range(start, end)]


def _fill_for(values: list[int], replica: int, needed: int, count_before: int) -> None:
    """The 5-replica rule for one replica that did not vote (Fig. 7 lines 32-36)."""
    while True:
        have = count_before + values.count(replica)
        first_hole = values.index(HOLE) if HOLE in values else len(values)
        if have < needed:
            _put(values, first_hole, replica)
            continue
        position = _position_of(values, replica, needed - count_before)
        if position is not None and first_hole < position:
            _put(values, first_hole, replica)
            continue
        return


def _put(values: list[int], position: int, replica: int) -> None:
    if position == len(values):
        values.append(replica)
    else:
        values[position] = replica


def _position_of(values: list[int], replica: int, occurrence: int) -> int | None:
    """Where the `occurrence`-th (1-based) slot for replica lies, or None if not in values."""
    if occurrence <= 0:
        return None
    seen = 0
    for position, value in enumerate(values):
        if value == replica:
            seen += 1
            if seen == occurrence:
                return position
    return None
