"""A follower's read refused by the sequencer (NO_INDEX: no lease, as after a gap in its lease
grants) is asked again after a backoff, stepped by hand: the first retry on the next tick, then
waits that double up to `resend_ticks`, from the start again once a read is granted. Before,
it was asked again only `resend_ticks` (25) after it was first asked: a sequencer whose lease
came back a tick later answered the read some 24 ticks late."""

from __future__ import annotations

import itertools

from consensus.messages import NO_INDEX, ReadIndexReply, ReadIndexRequest
from consensus.replica import Replica
from tests.consensus.stepper import Stepper
from tests.consensus.test_election_edges import warmed_up

FOLLOWER = 1
TICKS = 50  # below election_ticks: the follower keeps its sequencer throughout
RETRY_TICKS_MIN = 1  # consensus.reads.RETRY_TICKS_MIN: the first retry, on the next tick


def _requests(node: Replica) -> list[ReadIndexRequest]:
    """The read-index requests the follower sends now."""
    ready = node.ready()
    node.advance()
    return [message for _, message in ready.messages + ready.messages_after_persist
            if isinstance(message, ReadIndexRequest)]


def _answer(node: Replica, request: ReadIndexRequest, executed_upto: int) -> None:
    node.step(ReadIndexReply(node.status().sequencer, request.view, request.read_id,
                             request.epoch, executed_upto))


def _follower() -> tuple[Stepper, Replica]:
    cluster = warmed_up({})
    node = cluster.node(FOLLOWER)
    assert not node.status().is_sequencer
    _requests(node)  # whatever the warm-up left
    return cluster, node


def _asked_at_while_refused(node: Replica, read_ids: list[int]) -> list[tuple[int, int]]:
    """Ask for `read_ids`, refuse every request, tick by hand: (tick, read id) of each ask."""
    start = node.inspect.now
    asked: list[tuple[int, int]] = []
    for read_id in read_ids:
        node.read(read_id)
    for tick in range(TICKS + 1):
        if tick:
            node.tick()
        for request in _requests(node):
            asked.append((node.inspect.now - start, request.read_id))
            _answer(node, request, NO_INDEX)
    return asked


def _expected_ticks(resend_ticks: int) -> list[int]:
    ticks, wait, at = [0], RETRY_TICKS_MIN, 0
    while at + wait <= TICKS:
        at += wait
        ticks.append(at)
        wait = min(wait * 2, resend_ticks)
    return ticks


def test_a_refused_read_is_asked_again_after_a_backoff_capped_at_resend_ticks() -> None:
    _, node = _follower()
    asked = [tick for tick, _ in _asked_at_while_refused(node, [1])]
    resend_ticks = node.config.resend_ticks
    assert asked == _expected_ticks(resend_ticks) == [0, 1, 3, 7, 15, 31]
    assert asked[1] - asked[0] < resend_ticks  # not the full resend wait
    assert all(0 < later - earlier <= resend_ticks for earlier, later in itertools.pairwise(asked))


def test_reads_refused_together_are_asked_again_together_once_per_round() -> None:
    """Many pending reads do not each start a round of their own: a sequencer that refuses
    is asked for each read once per round, no more."""
    _, node = _follower()
    asked = _asked_at_while_refused(node, [1, 2, 3])
    rounds = sorted({tick for tick, _ in asked})
    assert rounds == _expected_ticks(node.config.resend_ticks)
    for tick in rounds:
        assert sorted(read_id for at, read_id in asked if at == tick) == [1, 2, 3]


def test_a_grant_starts_the_backoff_again() -> None:
    _, node = _follower()
    _asked_at_while_refused(node, [1])  # the waits have grown to resend_ticks
    for _ in range(node.config.resend_ticks + 1):  # until read 1's next round
        node.tick()
        if requests := _requests(node):
            break
    else:
        raise AssertionError("read 1 was not asked again")
    (request,) = requests
    _answer(node, request, 0)  # granted: read 1 runs
    asked = [tick for tick, _ in _asked_at_while_refused(node, [2])]
    assert asked[:3] == [0, RETRY_TICKS_MIN, 3 * RETRY_TICKS_MIN]
