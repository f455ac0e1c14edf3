"""The checker on textbook histories, with info operations, budgets and fair partitions.

Each history is small enough to reason about by hand; the comment above it says why it is or is
not linearizable. A checker that accepted everything, or refused everything, fails here.
"""

from __future__ import annotations

import itertools

import pytest

from jepsen.checker import check
from jepsen.history import EventType, History, HistoryRecorder
from jepsen.models import KvModel, Model, RegisterModel
from jepsen.verdict import Verdict
from tests.jepsen.helpers import brute_force, history, witness_is_valid

REGISTER = RegisterModel(0)
CAS = RegisterModel(0, cas=True)

TEXTBOOK = [
    ("sequential write then read of it", REGISTER, Verdict.LINEARIZABLE, """
        0 invoke write 1
        0 ok write 1
        1 invoke read
        1 ok read 1"""),
    ("stale read after two sequential writes", REGISTER, Verdict.NOT_LINEARIZABLE, """
        0 invoke write 1
        0 ok write 1
        0 invoke write 2
        0 ok write 2
        1 invoke read
        1 ok read 1"""),
    ("a read of a value nobody wrote", REGISTER, Verdict.NOT_LINEARIZABLE, """
        0 invoke write 1
        1 invoke read
        1 ok read 3
        0 ok write 1"""),
    ("a read concurrent with a write may see the old value", REGISTER, Verdict.LINEARIZABLE, """
        0 invoke write 1
        1 invoke read
        1 ok read 0
        0 ok write 1"""),
    ("... or the new one", REGISTER, Verdict.LINEARIZABLE, """
        0 invoke write 1
        1 invoke read
        1 ok read 1
        0 ok write 1"""),
    ("new then old during one write: the second read went back in time", REGISTER,
     Verdict.NOT_LINEARIZABLE, """
        0 invoke write 1
        1 invoke read
        1 ok read 1
        2 invoke read
        2 ok read 0
        0 ok write 1"""),
    ("old then new during one write is fine", REGISTER, Verdict.LINEARIZABLE, """
        0 invoke write 1
        1 invoke read
        1 ok read 0
        2 invoke read
        2 ok read 1
        0 ok write 1"""),
    ("overlapping writes may take effect in either order", REGISTER, Verdict.LINEARIZABLE, """
        0 invoke write 1
        1 invoke write 2
        1 ok write 2
        0 ok write 1
        2 invoke read
        2 ok read 2"""),
    ("a write that returned before another began cannot be the later one", REGISTER,
     Verdict.NOT_LINEARIZABLE, """
        0 invoke write 1
        0 ok write 1
        1 invoke write 2
        1 ok write 2
        2 invoke read
        2 ok read 1
        3 invoke read
        3 ok read 2"""),
    ("a crashed write may take effect long after it was invoked", REGISTER,
     Verdict.LINEARIZABLE, """
        0 invoke write 1
        0 info write
        1 invoke read
        1 ok read 0
        1 invoke read
        1 ok read 1"""),
    ("... or never", REGISTER, Verdict.LINEARIZABLE, """
        0 invoke write 1
        1 invoke read
        1 ok read 0"""),
    ("... but once seen it cannot be unseen", REGISTER, Verdict.NOT_LINEARIZABLE, """
        0 invoke write 1
        0 info write
        1 invoke read
        1 ok read 1
        1 invoke read
        1 ok read 0"""),
    ("a crashed write cannot take effect before it was invoked", REGISTER,
     Verdict.NOT_LINEARIZABLE, """
        1 invoke read
        1 ok read 1
        0 invoke write 1
        0 info write"""),
    ("two successful cas from the same value", CAS, Verdict.NOT_LINEARIZABLE, """
        0 invoke cas [0, 1]
        0 ok cas [0, 1]
        1 invoke cas [0, 2]
        1 ok cas [0, 2]"""),
    ("two concurrent cas: one must see the other's value", CAS, Verdict.LINEARIZABLE, """
        0 invoke cas [0, 1]
        1 invoke cas [1, 2]
        1 ok cas [1, 2]
        0 ok cas [0, 1]
        2 invoke read
        2 ok read 2"""),
    ("a failed cas did not happen", CAS, Verdict.LINEARIZABLE, """
        0 invoke cas [0, 5]
        0 fail cas [0, 5]
        1 invoke read
        1 ok read 0"""),
    ("a cas that reports its compare failed, though it matched", CAS, Verdict.NOT_LINEARIZABLE,
     """
        0 invoke cas [0, 5]
        0 ok cas false
        1 invoke read
        1 ok read 0"""),
    ("a crashed cas cannot explain a value it could not have written", CAS,
     Verdict.NOT_LINEARIZABLE, """
        0 invoke cas [3, 4]
        0 info cas
        1 invoke read
        1 ok read 4"""),
    ("a crashed cas whose compare held may have taken effect", CAS, Verdict.LINEARIZABLE, """
        0 invoke cas [0, 4]
        0 info cas
        1 invoke read
        1 ok read 4"""),
    ("the nemesis is no client", REGISTER, Verdict.LINEARIZABLE, """
        nemesis info partition "n1 | n2 n3"
        0 invoke write 1
        0 ok write 1
        nemesis info heal
        1 invoke read
        1 ok read 1"""),
    ("an empty history", REGISTER, Verdict.LINEARIZABLE, ""),
]


@pytest.mark.parametrize(("name", "model", "verdict", "text"), TEXTBOOK,
                         ids=[row[0] for row in TEXTBOOK])
def test_textbook_histories(name: str, model: Model, verdict: Verdict, text: str) -> None:
    hist = history(text)
    result = check(model, hist)
    assert result.verdict is verdict, name
    if verdict is Verdict.LINEARIZABLE:
        (part,) = result.partitions
        steps = [(step.operation, step.state) for step in part.linearization]
        assert witness_is_valid(model, hist, steps)
        ok_ops = {op.id for op in hist.operations if op.status is EventType.OK}
        assert ok_ops <= {number for number, _ in steps}
    else:
        assert result.failure is not None


def test_a_stale_read_is_explained_by_its_window() -> None:
    hist = history("""
        0 invoke write 1
        0 ok write 1
        0 invoke write 2
        0 ok write 2
        2 invoke read
        2 ok read 2
        1 invoke read
        1 ok read 1""")
    result = check(REGISTER, hist)
    failure = result.failure
    assert failure is not None
    assert failure.operation == 3  # the stale read
    assert failure.prefix_events == 7  # its completion
    assert [step.operation for step in failure.linearization] == [0, 1, 2]
    # Whatever the writes did, a read of 2 followed by a read of 1 needs write 1 after write 2.
    assert failure.window == (2, 3)
    assert failure.window_events == (4, 7)
    assert failure.exact


def test_the_window_is_illegal_on_its_own() -> None:
    """Drop the reads outside the window and let every other operation outside it take effect
    or not: no order may work, or the window would explain nothing."""
    hist = history("""
        0 invoke write 1
        1 invoke write 2
        0 ok write 1
        1 ok write 2
        2 invoke read
        2 ok read 2
        3 invoke write 3
        3 ok write 3
        2 invoke read
        2 ok read 1
        3 invoke read
        3 ok read 1""")
    failure = check(REGISTER, hist).failure
    assert failure is not None
    assert failure.operation == 4  # the read of 1 after write 3 returned
    # two operations suffice: write 3 then the read of 1, or the read of 2 then the read of 1
    assert len(failure.window) == 2
    assert failure.operation in failure.window
    kept = [op for op in hist.operations
            if op.id in failure.window or not REGISTER.is_read_only(op)]
    others = frozenset(op.id for op in kept if op.id not in failure.window)
    assert not brute_force(REGISTER, [op for op in kept if op.call <= failure.prefix_events],
                           skippable=others)
    # and the window is minimal: relaxing either of its operations makes it linearizable
    for number in failure.window:
        if number != failure.operation:
            assert brute_force(REGISTER, kept, skippable=others | {number})


def stale_key(recorder: HistoryRecorder, key: str, first: int) -> None:
    """Sequential ops on one key ending in a stale read: illegal, found in a few steps."""
    for value in range(first, first + 20):
        recorder.ok(recorder.invoke(0, "put", value, key=key), value)
    recorder.ok(recorder.invoke(0, "get", key=key), first)


def hard_key(recorder: HistoryRecorder, key: str, width: int) -> None:
    """Many crashed writes, then reads that pin them down one by one, then an impossible read:
    refuting it means trying (nearly) every subset of the crashed writes."""
    for value in range(1, width + 1):
        recorder.invoke(100 + value, "put", value, key=key)
    for value in range(width, 0, -1):
        recorder.ok(recorder.invoke(1, "get", key=key), value)
    recorder.ok(recorder.invoke(1, "get", key=key), -1)


def test_a_hard_partition_alone_runs_out_of_steps() -> None:
    recorder = HistoryRecorder()
    hard_key(recorder, "hard", 14)
    result = check(KvModel(0), recorder.history(), max_steps=5_000)
    assert result.verdict is Verdict.UNKNOWN
    assert "step budget" in result.reason
    assert result.failure is None


def test_fair_scheduling_finds_the_bad_partition_behind_a_hard_one() -> None:
    recorder = HistoryRecorder()
    hard_key(recorder, "hard", 14)  # smaller: searched first
    stale_key(recorder, "stale", 1_000)
    result = check(KvModel(0), recorder.history(), max_steps=5_000)
    assert result.verdict is Verdict.NOT_LINEARIZABLE
    assert result.failure is not None
    assert result.failure.partition == 'key "stale"'


def test_the_time_budget_gives_unknown_never_a_guess() -> None:
    recorder = HistoryRecorder()
    hard_key(recorder, "hard", 16)
    ticks = itertools.count()
    result = check(KvModel(0), recorder.history(), timeout_s=3.0,
                   clock=lambda: float(next(ticks)))
    assert result.verdict is Verdict.UNKNOWN
    assert "time budget" in result.reason


def test_the_memory_budget_gives_unknown_before_the_process_runs_out() -> None:
    """The memoisation grows with every configuration tried, each as wide as the history: a
    hard history would take the process's memory (and a kill reads as a failed check), so the
    search stops within its memory budget and says why."""
    recorder = HistoryRecorder()
    hard_key(recorder, "hard", 16)
    cache_bytes_max = 400_000
    result = check(KvModel(0), recorder.history(), cache_bytes_max=cache_bytes_max)
    assert result.verdict is Verdict.UNKNOWN
    assert "memory budget" in result.reason
    easy = HistoryRecorder()
    stale_key(easy, "a", 10)  # refuted well within the same budget
    assert check(KvModel(0), easy.history(), cache_bytes_max=cache_bytes_max).verdict \
        is Verdict.NOT_LINEARIZABLE


def test_a_model_without_a_partition_is_never_partitioned() -> None:
    recorder = HistoryRecorder()
    recorder.ok(recorder.invoke(0, "put", 1, key="a"), 1)
    recorder.ok(recorder.invoke(0, "put", 2, key="b"), 2)
    recorder.ok(recorder.invoke(1, "get", key="a"), 1)
    hist = recorder.history()
    assert len(check(KvModel(0), hist).partitions) == 2
    unpartitioned = check(KvModel(0, partitioned=False), hist)
    assert len(unpartitioned.partitions) == 1
    assert unpartitioned.verdict is Verdict.LINEARIZABLE


@pytest.mark.parametrize("partitioned", [True, False])
def test_keys_of_other_types_are_other_keys(partitioned: bool) -> None:
    """`true` is not `1`, and `1.0` is not `1`, for keys as for values (JSON histories carry
    keys of any type): a put of nil to key true does not explain nil read from key 1, and a
    read of key 1.0 is not a read of key 1."""
    model = KvModel(partitioned=partitioned)
    recorder = HistoryRecorder()
    recorder.ok(recorder.invoke(0, "put", "a", key=1), "a")
    recorder.ok(recorder.invoke(1, "put", None, key=True), None)
    recorder.ok(recorder.invoke(2, "get", key=1), None)
    assert check(model, recorder.history()).verdict is Verdict.NOT_LINEARIZABLE
    recorder = HistoryRecorder()
    recorder.ok(recorder.invoke(0, "put", "a", key=1), "a")
    recorder.ok(recorder.invoke(2, "get", key=1.0), None)
    result = check(model, recorder.history())
    assert result.verdict is Verdict.LINEARIZABLE
    assert len(result.partitions) == (2 if partitioned else 1)


def test_fail_and_info_reads_never_enter_the_search() -> None:
    hist = history("""
        0 invoke read
        0 fail read
        1 invoke read
        1 info read
        2 invoke write 5
        2 ok write 5""")
    result = check(REGISTER, hist)
    assert result.verdict is Verdict.LINEARIZABLE
    assert result.operations == 3
    assert result.checked == 1


def test_the_verdict_is_deterministic() -> None:
    hist = history(TEXTBOOK[5][3])
    first, second = check(REGISTER, hist), check(REGISTER, hist)
    assert first.failure == second.failure
    assert first.steps == second.steps


def test_check_result_knows_if_linearizable() -> None:
    assert check(REGISTER, History([])).is_linearizable


def test_the_explanation_stops_at_the_deadline_but_the_verdict_stands() -> None:
    hist = history("""
        0 invoke write 1
        0 ok write 1
        0 invoke write 2
        0 ok write 2
        2 invoke read
        2 ok read 2
        1 invoke read
        1 ok read 1""")
    ticks = itertools.count()
    result = check(REGISTER, hist, timeout_s=2.0, clock=lambda: float(next(ticks)))
    assert result.verdict is Verdict.NOT_LINEARIZABLE
    assert result.failure is not None
    assert not result.failure.exact
    assert check(REGISTER, hist).failure.exact  # type: ignore[union-attr]
