"""A late accept of an older round reaching a replica that learned the instance's chosen value
without promising its round: the race behind acd7d32, stepped by hand so that it holds whatever
the simulator's schedules do (its swarm seeds move with every change to message flows).

5 replicas. Leader 1 proposes "x" at (1, 0) and sends its C-accepts to its nearest peers 2
and 3: the one to 2 is held on its link, the one to 3 lost; the sequencer orders (1, 0) all
the same. 1 crashes. Replica 3 recovers (1, 0) at a higher ballot: its quorum {0, 3, 4} holds
nothing there, so it chooses a no-op. Replica 2 never sees the round's prepare or accept, so it
never promises its ballot, and learns the no-op either from the round's commit or from a
catch-up fetch. Then 1's old accept (round-0 ballot, "x") reaches 2. Learning a chosen value
promises its ballot (`Space.commit`), so 2 refuses the accept with a nack naming that ballot;
before acd7d32 it passed the promise check, met the committed no-op and stopped on the
C-agreement assert (a live run's replica did). `commit_without_promise` undoes the fix, for
this test's second half and for the simulator's search for seeds that meet the race."""

from __future__ import annotations

import pytest

from consensus.command_log import Space
from consensus.messages import (
    NOOP,
    Batch,
    CAccept,
    CAck,
    CCommit,
    CNack,
    CPrepare,
    FetchReply,
    FetchRequest,
)
from consensus.records import CAcceptRecord, CPromiseRecord
from tests.consensus.stepper import Queued, Stepper

LEADER, LAGGARD, RECOVERER, SEQUENCER = 1, 2, 3, 0
INDEX = 0  # the leader's first instance
WARM_ROUNDS = 20  # the view is established and the sequencer serves
RECOVERY_ROUNDS = 8  # prepare, promises, accepts, acks, commit: with room to spare
FETCH_TICKS_MAX = 100  # the laggard stalls on (1, 0) and asks a peer within a repair period
LEARN_PATHS = ["commit", "catch-up"]


def commit_without_promise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Undo acd7d32: learning a chosen value no longer promises its ballot."""
    commit = Space.commit

    def unpromised(self: Space, index: int, ballot: int, batch: Batch | None) -> bool | None:
        promised = self.promised
        learned = commit(self, index, ballot, batch)
        self.promised = promised
        return learned

    monkeypatch.setattr(Space, "commit", unpromised)


def _accept(held: list[Queued]) -> CAccept:
    """The one C-accept held on its link."""
    [(_, _, message)] = held
    assert isinstance(message, CAccept)
    return message


def _about_the_recovery(source: int, target: int, message: object) -> bool:
    """What would make the laggard promise or accept in the recovery's round, or learn its
    outcome from the round itself."""
    return target == LAGGARD and isinstance(message, CPrepare | CAccept | CCommit) and \
        message.space == LEADER


def _noop_learned_unpromised(learn: str) -> tuple[Stepper, list[Queued], int]:
    """Steps 1 and 2: the cluster, the leader's accept held for the laggard, and the recovery's
    ballot; the laggard holds the chosen no-op at (1, 0), learned by `learn`."""
    cluster = Stepper(5)
    for _ in range(WARM_ROUNDS):
        cluster.round()
    late = _propose_and_crash(cluster)
    hidden = _recover_noop(cluster)
    ballot = next(m.ballot for _, _, m in hidden if isinstance(m, CPrepare))
    assert ballot > _accept(late).ballot
    laggard = cluster.node(LAGGARD)
    assert laggard.inspect.committed_c(LEADER, INDEX) is None
    if learn == "commit":
        cluster.queue += [item for item in hidden if isinstance(item[2], CCommit)]
        cluster.deliver(lambda s, t, m: t == LAGGARD and isinstance(m, CCommit))
    else:
        _catch_up(cluster)
    cluster.process(LAGGARD)
    assert laggard.inspect.committed_c(LEADER, INDEX) == NOOP, learn
    assert not any(isinstance(record, CPromiseRecord | CAcceptRecord) and
                   record.space == LEADER for record in cluster.records[LAGGARD])
    cluster.queue.clear()
    return cluster, late, ballot


def _propose_and_crash(cluster: Stepper) -> list[Queued]:
    """Step 1: the leader proposes "x" at (1, 0); its accept to the laggard is held (returned),
    the one to the recoverer lost; the sequencer orders (1, 0); the leader crashes."""
    assert cluster.node(SEQUENCER).inspect.is_sequencer
    leader = cluster.node(LEADER)
    assert leader.inspect.exec_count(LEADER) == INDEX
    leader.propose(b"x")
    cluster.process(LEADER)
    late = cluster.drop(lambda s, t, m: s == LEADER and t == LAGGARD and isinstance(m, CAccept))
    assert [_accept(late).index, _accept(late).batch[0].payload] == [INDEX, b"x"], late
    lost = cluster.drop(lambda s, t, m: s == LEADER and isinstance(m, CAccept))
    assert [t for _, t, _ in lost] == [RECOVERER], lost
    # The C-request orders (1, 0): everyone, the laggard included, stalls on it.
    for _ in range(4):
        cluster.deliver()
        cluster.process_all()
    assert all(cluster.node(r).inspect.committed_o(0) == LEADER for r in range(5))
    cluster.crash(LEADER)
    return late


def _recover_noop(cluster: Stepper) -> list[Queued]:
    """Step 2: the recoverer chooses a no-op at (1, 0) with {0, 3, 4}; what the laggard would
    have heard of the round is held back (returned)."""
    cluster.node(RECOVERER)._recovery.start(LEADER, INDEX)
    hidden: list[Queued] = []
    for _ in range(RECOVERY_ROUNDS):
        cluster.process_all()
        hidden += cluster.drop(_about_the_recovery)
        cluster.deliver()
    cluster.process_all()
    hidden += cluster.drop(_about_the_recovery)
    assert cluster.node(RECOVERER).inspect.committed_c(LEADER, INDEX) == NOOP
    assert {type(m) for _, _, m in hidden} == {CPrepare, CAccept, CCommit}, hidden
    return hidden


def _catch_up(cluster: Stepper) -> None:
    """The laggard, stalled on (1, 0), fetches it from a peer."""
    def fetching(source: int, target: int, message: object) -> bool:
        return LAGGARD in (source, target) and isinstance(message, FetchRequest | FetchReply)

    for _ in range(FETCH_TICKS_MAX):
        cluster.tick([LAGGARD])
        cluster.process(LAGGARD)
        if any(fetching(*item) for item in cluster.queue):
            break
    cluster.deliver(fetching)  # the request
    cluster.process_all()
    replies = [m for s, t, m in cluster.queue if t == LAGGARD and isinstance(m, FetchReply)]
    assert [(entry.space, entry.index, entry.batch) for reply in replies
            for entry in reply.c_entries] == [(LEADER, INDEX, NOOP)], replies
    cluster.deliver(fetching)


def _deliver_late_accept(cluster: Stepper, late: list[Queued]) -> None:
    """Step 3: the crashed leader's old accept, held on its link until now, arrives."""
    cluster.queue += late
    cluster.deliver(lambda s, t, m: s == LEADER and t == LAGGARD)
    cluster.process(LAGGARD)


@pytest.mark.parametrize("learn", LEARN_PATHS)
def test_a_replica_that_learned_a_recovered_noop_refuses_the_leaders_late_accept(
        learn: str) -> None:
    cluster, late, ballot = _noop_learned_unpromised(learn)
    records = len(cluster.records[LAGGARD])
    _deliver_late_accept(cluster, late)
    laggard = cluster.node(LAGGARD)
    assert laggard.inspect.committed_c(LEADER, INDEX) == NOOP
    assert laggard._ctx.clog[LEADER].promised == ballot
    answers = [(t, m) for s, t, m in cluster.queue if s == LAGGARD]
    assert answers == [(LEADER, CNack(LAGGARD, 0, LEADER, INDEX, ballot))], answers
    assert not any(isinstance(m, CAck) for _, m in answers)
    assert cluster.records[LAGGARD][records:] == []  # no acceptance of "x" on disk
    assert cluster.executed[LAGGARD] == [(0, "noop")]


@pytest.mark.parametrize("learn", LEARN_PATHS)
def test_without_the_promise_the_late_accept_meets_the_chosen_noop(
        monkeypatch: pytest.MonkeyPatch, learn: str) -> None:
    """The same script with acd7d32 undone: the laggard, which promised nothing above the
    leader's round-0 ballot, takes the accept for its round and meets the committed no-op."""
    commit_without_promise(monkeypatch)
    cluster, late, _ = _noop_learned_unpromised(learn)
    assert cluster.node(LAGGARD)._ctx.clog[LEADER].promised == _accept(late).ballot
    with pytest.raises(AssertionError, match="C-agreement"):
        _deliver_late_accept(cluster, late)
