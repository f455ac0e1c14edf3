"""Commit notices held back from quiet peers (consensus/notice_hold.py): alone, against a naive
model of what must leave when, and stepped in a cluster: the acceptor's notices ride on the
next put's accepts, the idle follower's leave at the tick, and a peer that begins to lead or
read gets what was held at once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.messages import CAccept, CCommit, Message, OCommit, ReadIndexRequest
from consensus.notice_hold import HELD_PER_PEER_MAX, WAITS_ON_COMMITS, NoticeHold
from consensus.ready import Outbox
from tests.consensus.stepper import Stepper

QUIET_AFTER_TICKS = 10
ME = 0


def _notice(slot: int) -> OCommit:
    return OCommit(ME, 0, (slot,), (ME,))


def _hold(quiet_after_ticks: int = QUIET_AFTER_TICKS) -> tuple[NoticeHold, Outbox]:
    outbox = Outbox(ME)
    return NoticeHold(outbox, 3, quiet_after_ticks), outbox


def _sent(outbox: Outbox) -> list[tuple[int, Message]]:
    ready = outbox.drain()
    return ready.messages + ready.messages_after_persist


def test_a_notice_to_a_quiet_peer_waits_for_the_tick() -> None:
    hold, outbox = _hold()
    hold.send(1, _notice(0), now=100)
    assert _sent(outbox) == [] and hold.holding
    hold.release_all()
    assert _sent(outbox) == [(1, _notice(0))] and not hold.holding


def test_a_peer_that_waits_on_commits_gets_them_at_once_until_it_is_quiet_again() -> None:
    hold, outbox = _hold()
    hold.waits(1, now=100)
    hold.send(1, _notice(0), now=100 + QUIET_AFTER_TICKS)
    assert _sent(outbox) == [(1, _notice(0))]
    hold.send(1, _notice(1), now=101 + QUIET_AFTER_TICKS)
    assert _sent(outbox) == [] and hold.holding


def test_what_is_held_leaves_when_the_peer_begins_to_wait() -> None:
    hold, outbox = _hold()
    hold.send(1, _notice(0), now=100)
    hold.send(2, _notice(0), now=100)
    hold.waits(1, now=101)
    assert _sent(outbox) == [(1, _notice(0))]
    assert hold.holding  # peer 2's stays


def test_held_notices_ride_in_the_list_that_already_goes_to_their_peer() -> None:
    hold, outbox = _hold()
    accept = CAccept(ME, 0, ME, 1, 0, ())
    hold.send(1, _notice(0), now=100)
    hold.send(2, _notice(0), now=100)
    outbox.send(1, accept, after_persist=True)
    hold.release_riding()
    ready = outbox.drain()
    assert ready.messages == []
    assert ready.messages_after_persist == [(1, accept), (1, _notice(0))]
    assert hold.holding  # nothing goes to peer 2 in this Ready
    hold.release_all()
    assert _sent(outbox) == [(2, _notice(0))]


def test_no_more_than_the_bound_are_held_for_a_peer() -> None:
    hold, outbox = _hold()
    for slot in range(HELD_PER_PEER_MAX):
        hold.send(1, _notice(slot), now=100)
    assert _sent(outbox) == []
    hold.send(1, _notice(HELD_PER_PEER_MAX), now=100)
    assert _sent(outbox) == [(1, _notice(slot)) for slot in range(HELD_PER_PEER_MAX + 1)]
    assert not hold.holding


def test_zero_quiet_ticks_holds_nothing() -> None:
    hold, outbox = _hold(quiet_after_ticks=0)
    hold.send(1, _notice(0), now=100)
    assert _sent(outbox) == [(1, _notice(0))] and not hold.holding


def test_the_messages_that_show_a_wait_on_commits() -> None:
    assert CAccept in WAITS_ON_COMMITS and ReadIndexRequest in WAITS_ON_COMMITS
    assert CCommit not in WAITS_ON_COMMITS and OCommit not in WAITS_ON_COMMITS


_OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("send"), st.integers(1, 2)),
    st.tuples(st.just("waits"), st.integers(1, 2)),
    st.tuples(st.just("other"), st.integers(1, 2)),  # another message to the peer, then ready()
    st.tuples(st.just("tick"), st.just(0)),
), max_size=200)


@settings(max_examples=200, deadline=None)
@given(_OPERATIONS)
def test_every_notice_leaves_once_in_order_and_none_outlives_a_tick(
        operations: list[tuple[str, int]]) -> None:
    """Against a model: a notice leaves at once to a peer that waited within the quiet window,
    else at the peer's next wait, the next Ready that sends the peer anything, the tick, or
    past the bound; per peer in the order sent, each exactly once."""
    hold, outbox = _hold(quiet_after_ticks=3)
    now, slot = 0, 0
    led_at = {1: -100, 2: -100}
    expected_held: dict[int, list[int]] = {1: [], 2: []}
    left: dict[int, list[int]] = {1: [], 2: []}

    def collect() -> None:
        for peer, message in _sent(outbox):
            if isinstance(message, OCommit):
                left[peer].append(message.slots[0])

    for kind, peer in operations:
        if kind == "send":
            hold.send(peer, _notice(slot), now)
            if now - led_at[peer] <= 3:
                assert not expected_held[peer]
            else:
                expected_held[peer].append(slot)
                if len(expected_held[peer]) > HELD_PER_PEER_MAX:
                    expected_held[peer].clear()
            slot += 1
        elif kind == "waits":
            hold.waits(peer, now)
            led_at[peer] = now
            expected_held[peer].clear()
        elif kind == "other":
            outbox.send(peer, CAccept(ME, 0, ME, slot, 0, ()))
            hold.release_riding()
            expected_held[peer].clear()
        else:
            now += 1
            hold.release_all()
            expected_held = {1: [], 2: []}
        collect()
        assert hold.holding == any(expected_held.values())
    hold.release_all()
    collect()
    sent = sorted(left[1] + left[2])
    assert sent == list(range(slot))
    assert all(left[peer] == sorted(left[peer]) for peer in (1, 2))


# --- in a cluster ------------------------------------------------------------------------------

def _warm_cluster() -> Stepper:
    cluster = Stepper(3, notices_quiet_after_ticks=QUIET_AFTER_TICKS)
    for _ in range(20):
        cluster.round()
    assert cluster.node(0).inspect.is_sequencer
    for _ in range(QUIET_AFTER_TICKS + 1):  # the election's messages age out
        cluster.round()
    return cluster


def _kinds(cluster: Stepper, source: int, target: int) -> list[str]:
    return [type(m).__name__ for s, t, m in cluster.queue if (s, t) == (source, target)]


def _put(cluster: Stepper, payload: bytes) -> None:
    """The sequencer proposes; everything is delivered and processed, nothing ticks."""
    cluster.node(0).propose(payload)
    for _ in range(6):
        cluster.process_all()
        cluster.deliver(lambda s, t, m: t != 2 or not isinstance(m, CCommit | OCommit))


def test_the_acceptors_notices_ride_on_the_next_accepts_and_the_idle_followers_wait() -> None:
    cluster = _warm_cluster()
    executed = {replica: len(cluster.executed[replica]) for replica in range(3)}
    _put(cluster, b"a")
    assert len(cluster.executed[0]) == executed[0] + 1
    assert len(cluster.executed[1]) == executed[1]  # its notices are held
    assert _kinds(cluster, 0, 2) == []
    cluster.node(0).propose(b"b")
    cluster.process(0)
    # One delivery to the acceptor carries the second put's accepts and the first's commits
    assert sorted(_kinds(cluster, 0, 1)) == ["CAccept", "CCommit", "OAccept", "OCommit"]
    assert _kinds(cluster, 0, 2) == []
    cluster.deliver(lambda s, t, m: (s, t) == (0, 1))
    cluster.process(1)
    assert len(cluster.executed[1]) == executed[1] + 1
    cluster.tick([0])
    cluster.process(0)
    assert _kinds(cluster, 0, 2) == ["CCommit", "OCommit"]  # the first put's, at the tick
    cluster.deliver()
    cluster.process_all()
    assert len(cluster.executed[2]) == executed[2] + 1


def test_a_follower_that_starts_a_read_gets_the_held_notices_with_its_answer() -> None:
    cluster = _warm_cluster()
    _put(cluster, b"a")
    executed_before = len(cluster.executed[2])
    cluster.node(2).read(1)
    cluster.process(2)
    assert _kinds(cluster, 2, 0) == ["ReadIndexRequest"]
    cluster.deliver(lambda s, t, m: (s, t) == (2, 0))
    cluster.process(0)
    assert {"CCommit", "OCommit", "ReadIndexReply"} <= set(_kinds(cluster, 0, 2))
    for _ in range(3):
        cluster.deliver()
        cluster.process_all()
    assert len(cluster.executed[2]) == executed_before + 1
    assert [read_id for read_id, _ in cluster.reads[2]] == [1]
