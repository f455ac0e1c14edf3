"""The checker against a brute-force search over every order, on small generated histories.

Hypothesis interleaves a few clients' invocations and completions (ok with a random result,
info, fail) on small value domains, so about half the histories are linearizable. For each the
checker must agree with trying every order of every allowed subset of operations; its witness
must replay on the model; its failure window must be illegal on its own; partitioning a
key-value history must not change the verdict.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from jepsen.checker import check
from jepsen.history import EventType, History, HistoryRecorder, Operation
from jepsen.models import KvModel, Model, RegisterModel, as_unknown_outcome
from jepsen.verdict import Verdict
from tests.jepsen.helpers import brute_force, witness_is_valid

VALUES = (0, 1, 2)
STRINGS = ("", "x", "y", "xy", "yx")
OPERATIONS_MAX = 6


def _invocation(draw: st.DrawFn, functions: Sequence[str], keys: Sequence[str | None],
                values: Sequence[object]) -> tuple[str, object, str | None]:
    f = draw(st.sampled_from(functions))
    key = draw(st.sampled_from(keys))
    if f in ("read", "get"):
        return f, None, key
    if f == "cas":
        return f, [draw(st.sampled_from(values)), draw(st.sampled_from(values))], key
    if f == "append":
        return f, draw(st.sampled_from(["x", "y"])), key
    return f, draw(st.sampled_from(values)), key


def _output(draw: st.DrawFn, f: str, argument: object, values: Sequence[object]) -> object:
    if f in ("read", "get"):
        return draw(st.sampled_from(values))
    if f == "cas":
        return draw(st.sampled_from([argument, False]))
    return argument


@st.composite
def histories(draw: st.DrawFn, functions: Sequence[str],
              keys: Sequence[str | None] = (None,),
              values: Sequence[object] = VALUES) -> History:
    recorder = HistoryRecorder()
    pending: dict[int, tuple[object, str, object]] = {}
    invoked = 0
    for _ in range(draw(st.integers(0, 2 * OPERATIONS_MAX))):
        process = draw(st.integers(0, 2))
        if process in pending:
            handle, f, argument = pending.pop(process)
            kind = draw(st.sampled_from(["ok", "ok", "ok", "info", "fail"]))
            output = _output(draw, f, argument, values) if kind == "ok" else None
            recorder.complete(handle, kind, output)  # type: ignore[arg-type]
        elif invoked < OPERATIONS_MAX:
            f, argument, key = _invocation(draw, functions, keys, values)
            pending[process] = (recorder.invoke(process, f, argument, key=key), f, argument)
            invoked += 1
    return recorder.history()


def _agrees_with_brute_force(model: Model, hist: History) -> Verdict:
    result = check(model, hist)
    expected = brute_force(model, hist.operations)
    assert result.verdict is (Verdict.LINEARIZABLE if expected else Verdict.NOT_LINEARIZABLE)
    if expected:
        for part in result.partitions:
            steps = [(step.operation, step.state) for step in part.linearization]
            assert witness_is_valid(part.model, hist, steps)
    return result.verdict


def _window_is_illegal(model: Model, hist: History) -> None:
    failure = check(model, hist).failure
    if failure is None:
        return
    cut = failure.prefix_events
    kept: list[Operation] = []
    for original in hist.operations:
        op = original
        if op.status is EventType.OK and op.ret is not None and op.ret > cut:
            op = as_unknown_outcome(op)  # pending at the cut
        if op.call > cut or (op.id not in failure.window and model.is_read_only(op)):
            continue
        kept.append(op)
    relaxed = frozenset(op.id for op in kept if op.id not in failure.window)
    assert not brute_force(model, kept, skippable=relaxed)
    assert failure.operation in failure.window


@settings(max_examples=300)
@given(histories(["read", "write"]))
def test_register_agrees_with_brute_force(hist: History) -> None:
    _agrees_with_brute_force(RegisterModel(0), hist)


@settings(max_examples=300)
@given(histories(["read", "write", "cas"]))
def test_cas_register_agrees_with_brute_force(hist: History) -> None:
    _agrees_with_brute_force(RegisterModel(0, cas=True), hist)


@settings(max_examples=150)
@given(histories(["get", "put", "cas"], keys=("a", "b")))
def test_kv_agrees_with_brute_force_partitioned_or_not(hist: History) -> None:
    verdict = _agrees_with_brute_force(KvModel(0), hist)
    assert check(KvModel(0, partitioned=False), hist).verdict is verdict


@settings(max_examples=150)
@given(histories(["get", "put", "append"], keys=("a", "b"), values=STRINGS))
def test_kv_with_appends_agrees_with_brute_force(hist: History) -> None:
    _agrees_with_brute_force(KvModel(""), hist)


@settings(max_examples=200)
@given(histories(["read", "write", "cas"]))
def test_the_failure_window_is_illegal_on_its_own(hist: History) -> None:
    _window_is_illegal(RegisterModel(0, cas=True), hist)
