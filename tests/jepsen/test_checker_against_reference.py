"""The checker against an independent brute-force reference.

The reference below shares no code with `jepsen.models`: it has its own sequential semantics of
get/put/cas on a map (type-strict equality, as JSON sees values), its own real-time order and
its own treatment of ok/fail/info/pending, and enumerates every order of every allowed subset.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from jepsen import checker as checker_module
from jepsen.checker import check
from jepsen.history import History, HistoryRecorder
from jepsen.models import KvModel, RegisterModel
from jepsen.verdict import Verdict

VALUES: tuple[object, ...] = (None, 0, 1, True, False, 1.0)
Ev = tuple[int, int, str, str, object, object]
State = dict[object, object]  # time, process, type, f, key, value


def _strict_eq(first: object, second: object) -> bool:
    if type(first) is not type(second):
        return False
    if isinstance(first, tuple):
        assert isinstance(second, tuple)
        return len(first) == len(second) and all(
            _strict_eq(a, b) for a, b in zip(first, second, strict=True))
    return first == second


@dataclass(frozen=True)
class _Op:
    f: str
    key: object
    arg: object
    status: str
    output: object
    call: int
    ret: int | None

    def returns(self) -> float:
        return self.ret if self.status == "ok" and self.ret is not None else float("inf")


def _ops_of(events: Sequence[Ev]) -> list[_Op]:
    """(time, process, type, f, key, value) events -> operations, independently paired."""
    open_: dict[int, tuple[int, str, object, object]] = {}
    ops: list[_Op] = []
    for time, process, kind, f, key, value in events:
        if kind == "invoke":
            open_[process] = (time, f, key, value)
            continue
        call, f0, key0, arg = open_.pop(process)
        assert f0 == f
        ops.append(_Op(f, key0, arg, kind, value if kind == "ok" else None, call, time))
    for call, f, key, arg in open_.values():  # never completed: outcome unknown
        ops.append(_Op(f, key, arg, "info", None, call, None))
    return ops


def _apply(state: State, op: _Op, initial: object) -> State | None:
    current = state.get(op.key, initial)
    if op.f in ("get", "read"):
        return state if _strict_eq(current, op.output) else None
    if op.f in ("put", "write"):
        return {**state, op.key: op.arg}
    assert op.f == "cas"
    assert isinstance(op.arg, tuple)
    expected, new = op.arg
    if op.status == "ok" and op.output is False:
        return state if not _strict_eq(current, expected) else None
    if _strict_eq(current, expected):
        return {**state, op.key: new}
    return None if op.status == "ok" else state  # info: a failed compare changes nothing


def reference(ops: list[_Op], initial: object) -> bool:
    required = [op for op in ops if op.status == "ok"]
    optional = [op for op in ops if op.status == "info" and op.f not in ("get", "read")]
    for size in range(len(optional) + 1):
        for chosen in itertools.combinations(optional, size):
            for order in itertools.permutations([*required, *chosen]):
                if any(later.returns() < earlier.call
                       for i, earlier in enumerate(order) for later in order[i + 1:]):
                    continue
                state: State | None = {}
                for op in order:
                    state = _apply(state, op, initial) if state is not None else None
                if state is not None:
                    return True
    return False


@st.composite
def raw_histories(draw: st.DrawFn, keys: Sequence[object], cas: bool) -> list[Ev]:
    functions = ["get", "put", "cas"] if cas else ["get", "put"]
    events: list[Ev] = []
    pending: dict[int, tuple[str, object, object]] = {}
    invoked = 0
    for _ in range(draw(st.integers(0, 10))):
        process = draw(st.integers(0, 2))
        if process in pending:
            f, key, arg = pending.pop(process)
            kind = draw(st.sampled_from(["ok", "ok", "ok", "info", "fail"]))
            value = None
            if kind == "ok":
                if f == "get":
                    value = draw(st.sampled_from(VALUES))
                elif f == "cas":
                    value = draw(st.sampled_from([arg, False]))
                else:
                    value = arg
            events.append((len(events), process, kind, f, key, value))
        elif invoked < 5:
            f = draw(st.sampled_from(functions))
            key = draw(st.sampled_from(keys))
            arg = None
            if f == "put":
                arg = draw(st.sampled_from(VALUES))
            elif f == "cas":
                arg = (draw(st.sampled_from(VALUES)), draw(st.sampled_from(VALUES)))
            pending[process] = (f, key, arg)
            events.append((len(events), process, "invoke", f, key, arg))
            invoked += 1
    return events


def _history(events: list[Ev], register: bool = False) -> History:
    recorder = HistoryRecorder()
    handles: dict[int, object] = {}
    for _, process, kind, f, key, value in events:
        name = {"get": "read", "put": "write"}.get(f, f) if register else f
        if kind == "invoke":
            handles[process] = recorder.invoke(process, name,
                                               list(value) if isinstance(value, tuple) else value,
                                               key=None if register else key)
        else:
            recorder.complete(handles.pop(process), kind,  # type: ignore[arg-type]
                              list(value) if isinstance(value, tuple) else value)
    return recorder.history()


def _expected(ok: bool) -> Verdict:
    return Verdict.LINEARIZABLE if ok else Verdict.NOT_LINEARIZABLE


@settings(max_examples=400, deadline=None)
@given(raw_histories(keys=("a", "b"), cas=True))
def test_kv_matches_independent_reference(events: list[Ev]) -> None:
    expected = _expected(reference(_ops_of(events), None))
    hist = _history(events)
    assert check(KvModel(None), hist).verdict is expected
    assert check(KvModel(None, partitioned=False), hist).verdict is expected


@settings(max_examples=300, deadline=None)
@given(raw_histories(keys=(None,), cas=True))
def test_cas_register_matches_independent_reference(events: list[Ev]) -> None:
    expected = _expected(reference(_ops_of(events), None))
    assert check(RegisterModel(None, cas=True), _history(events, register=True)).verdict \
        is expected


def _knossos_style(events: list[Ev], blank: list[bool]) -> list[Ev]:
    """Invocations of ok writes and successful cas carry nil; the completion carries the
    arguments (as Knossos histories often do)."""
    out = list(events)
    invoked_at: dict[int, int] = {}
    for position, (time, process, kind, f, key, value) in enumerate(events):
        if kind == "invoke":
            invoked_at[process] = position
            continue
        start = invoked_at.pop(process)
        arg = events[start][5]
        if kind == "ok" and f in ("put", "cas") and value is not False and blank[position]:
            out[start] = (*events[start][:5], None)
            out[position] = (time, process, kind, f, key, arg)
    return out


@settings(max_examples=300, deadline=None)
@given(raw_histories(keys=("a", "b"), cas=True), st.lists(st.booleans(), min_size=10,
                                                          max_size=10))
def test_kv_with_valueless_invocations_matches_reference(events: list[Ev],
                                                         blank: list[bool]) -> None:
    expected = _expected(reference(_ops_of(events), None))
    hist = _history(_knossos_style(events, blank))
    result = check(KvModel(None), hist)  # diagnosis included
    assert result.verdict is expected


@settings(max_examples=300, deadline=None)
@given(raw_histories(keys=("a", "b"), cas=True))
def test_one_step_slices_give_the_same_verdict(events: list[Ev]) -> None:
    """The search resumed after every single step (round-robin over the keys) agrees."""
    checker = checker_module
    expected = _expected(reference(_ops_of(events), None))
    saved = checker.SLICE_STEPS_FIRST, checker.SLICE_STEPS_MAX
    checker.SLICE_STEPS_FIRST = checker.SLICE_STEPS_MAX = 1
    try:
        assert check(KvModel(None), _history(events)).verdict is expected
    finally:
        checker.SLICE_STEPS_FIRST, checker.SLICE_STEPS_MAX = saved


@settings(max_examples=300, deadline=None)
@given(raw_histories(keys=("a", "b"), cas=True), st.integers(1, 40))
def test_a_step_budget_gives_the_verdict_or_unknown_never_a_wrong_one(
        events: list[Ev], max_steps: int) -> None:
    expected = _expected(reference(_ops_of(events), None))
    result = check(KvModel(None), _history(events), max_steps=max_steps)
    assert result.verdict in (expected, Verdict.UNKNOWN)
    assert result.is_linearizable is (result.verdict is Verdict.LINEARIZABLE)
