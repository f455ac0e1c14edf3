"""No stale read across the schedules that threaten one: a minority (the old sequencer with or
without a follower) reading after the majority wrote under a new view, a paused sequencer that
wakes and reads, an old sequencer reading at every tick while its followers restart and elect,
and a restarted follower that must not vote while a lease it granted may run; at 3 and 5
replicas. A read "sees" a write when the commands executed before it include it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from consensus.config import Defect
from consensus.messages import Vote, VoteRequest
from tests.consensus.stepper import Stepper

WRITE = b"AFTER"


def _warm(replicas: int, defects: frozenset[Defect] = frozenset()) -> Stepper:
    cluster = Stepper(replicas, defects)
    for _ in range(20):
        cluster.round()
    cluster.node(0).propose(b"w0")
    for _ in range(10):
        cluster.round()
    return cluster


def _step(cluster: Stepper, replicas: list[int], *, cut_off: int | None = None) -> None:
    """A tick of `replicas`, then two rounds of processing; messages to or from `cut_off`
    are lost (a paused replica)."""
    cluster.tick(replicas)
    for _ in range(2):
        for replica in replicas:
            cluster.process(replica)
        if cut_off is not None:
            cluster.drop(lambda source, target, _: cut_off in (source, target))
        cluster.deliver()


def _ran(cluster: Stepper, replica: int, command: bytes) -> bool:
    return any(command.decode() in batch for _, batch in cluster.executed[replica])


def _until(step: Callable[[], None], done: Callable[[], bool], steps_max: int, what: str) -> None:
    for _ in range(steps_max):
        step()
        if done():
            return
    raise AssertionError(f"no {what} within {steps_max} steps")


def _write_under_a_new_sequencer(cluster: Stepper, voters: list[int],
                                 step: Callable[[], None]) -> None:
    """Elect a sequencer among `voters` and have it execute WRITE."""
    _until(step, lambda: any(cluster.node(r).inspect.is_sequencer for r in voters), 3000,
           "new sequencer")
    writer = next(r for r in voters if cluster.node(r).inspect.is_sequencer)
    cluster.node(writer).propose(WRITE)
    _until(step, lambda: _ran(cluster, writer, WRITE), 300, "write")


def _saw_the_write(cluster: Stepper, reader: int, *, after_read: int = -1) -> None:
    """Every read served (a cut-off reader may serve none: it has no lease) saw WRITE."""
    reads = [(read_id, seen) for read_id, seen in cluster.reads[reader] if read_id > after_read]
    for read_id, seen in reads:
        assert any(WRITE.decode() in batch for batch in seen), (read_id, seen)


def _minority_reads_after_the_majority_wrote(replicas: int, reader: int,
                                             defects: frozenset[Defect] = frozenset()) -> None:
    """The reader is in the minority cut off with the old sequencer 0 (at 3 replicas a
    follower there would make it a majority): its read is never served stale."""
    cluster = _warm(replicas, defects)
    minority = [0, 1] if replicas == 5 else [0]
    majority = [r for r in range(replicas) if r not in minority]
    cluster.blocked = {(a, b) for a in minority for b in majority} | \
        {(b, a) for a in minority for b in majority}
    everyone = list(range(replicas))
    _write_under_a_new_sequencer(cluster, majority, lambda: _step(cluster, everyone))
    cluster.node(reader).read(99)
    for _ in range(200):
        _step(cluster, everyone)
    _saw_the_write(cluster, reader)


@pytest.mark.parametrize(("replicas", "reader"), [(3, 0), (5, 0), (5, 1)])
def test_a_minority_reads_what_the_majority_wrote_after_it_was_cut_off(
        replicas: int, reader: int) -> None:
    _minority_reads_after_the_majority_wrote(replicas, reader)


@pytest.mark.parametrize(("replicas", "reader"), [(3, 0), (5, 1)])
def test_reads_served_from_local_state_are_caught(replicas: int, reader: int) -> None:
    """The same schedule with reads served without a read index (Defect.LOCAL_READS) serves a
    stale read, which the check refuses."""
    with pytest.raises(AssertionError, match="w0"):
        _minority_reads_after_the_majority_wrote(replicas, reader,
                                                 frozenset({Defect.LOCAL_READS}))


@pytest.mark.parametrize("replicas", [3, 5])
def test_a_paused_sequencer_that_wakes_reads_the_new_views_write(replicas: int) -> None:
    """Sequencer 0 is paused (no ticks, no processing) while the others elect and write; it
    wakes with its clock far ahead and reads."""
    cluster = _warm(replicas)
    others = list(range(1, replicas))
    _write_under_a_new_sequencer(cluster, others, lambda: _step(cluster, others, cut_off=0))
    for _ in range(200):
        cluster.node(0).tick()
    cluster.node(0).read(5)
    cluster.process(0)
    for _ in range(50):
        _step(cluster, list(range(replicas)))
    _saw_the_write(cluster, 0)


@pytest.mark.parametrize("replicas", [3, 5])
@pytest.mark.parametrize("restart_at", [0, 3, 10, 20, 30, 35])
def test_an_old_sequencer_reading_every_tick_while_followers_restart_reads_nothing_stale(
        replicas: int, restart_at: int) -> None:
    """0 keeps its lease, its followers restart at once and are cut from it; 0 reads at every
    tick (each read at an input, after its tick) while the others elect and write: no read
    invoked after the write executed misses it."""
    cluster = _warm(replicas)
    others = list(range(1, replicas))
    for _ in range(restart_at):
        cluster.round()
    for replica in others:
        cluster.crash(replica)
        cluster.restart(replica)
    cluster.blocked = {(0, b) for b in others} | {(b, 0) for b in others}
    read_ids = iter(range(100, 10**6))
    last_read = 0

    def tick_and_read() -> None:
        nonlocal last_read
        cluster.tick()
        last_read = next(read_ids)
        cluster.node(0).read(last_read)
        for _ in range(2):
            cluster.process_all()
            cluster.deliver()

    _write_under_a_new_sequencer(cluster, others, tick_and_read)
    write_done_at = last_read
    for _ in range(20):
        tick_and_read()
    _saw_the_write(cluster, 0, after_read=write_done_at)


def test_a_restarted_follower_votes_for_no_one_for_a_lease_after_its_restart() -> None:
    cluster = _warm(3)
    assert cluster.node(0)._sequencer.lease_valid()
    cluster.crash(1)
    cluster.restart(1)
    cluster.process(1)
    node = cluster.node(1)
    view = node.inspect.view
    node.step(VoteRequest(sender=2, view=view + 2, from_index=0))
    cluster.process(1)
    assert node.inspect.view == view  # no promise, no vote
    assert not [message for source, _, message in cluster.queue
                if source == 1 and isinstance(message, Vote)]
