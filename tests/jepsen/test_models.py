"""The models' steps, their refusals, partitions, and a state machine as a model."""

from __future__ import annotations

import hashlib

import pytest

from jepsen.checker import check
from jepsen.errors import ModelError, ModelUnavailable
from jepsen.history import EventType, HistoryRecorder, Operation, Value, exact
from jepsen.models import (
    ILLEGAL,
    KvModel,
    Model,
    RegisterModel,
    StateMachineModel,
    describe_operation,
    model_named,
)
from jepsen.verdict import Verdict
from tests.jepsen.helpers import history


def op(f: str, input: Value = None, output: Value = None, *, status: str = "ok",
       key: Value = None, number: int = 0) -> Operation:
    return Operation(id=number, process=0, f=f, key=key, input=input, output=output,
                     status=EventType(status), call=0, ret=1)


@pytest.mark.parametrize(("operation", "state", "after"), [
    (op("read", output=3), 3, 3),
    (op("read", output=3), 4, ILLEGAL),
    (op("read", output=None), None, None),  # nil is a value: the key is absent
    (op("read", output=None), 0, ILLEGAL),
    (op("read", status="info"), 7, 7),  # an unknown read constrains nothing
    (op("write", 5, 5), 0, 5),
    (op("write", 5, status="info"), 0, 5),
    (op("write", None, 5), 0, 5),  # an invocation without its value: the completion's
    (op("cas", (1, 2), (1, 2)), 1, 2),
    (op("cas", (1, 2), (1, 2)), 3, ILLEGAL),
    (op("cas", (1, 2), False), 3, 3),  # the compare failed: nothing changed
    (op("cas", (1, 2), False), 1, ILLEGAL),
    (op("cas", (1, 2), status="info"), 1, 2),
    (op("cas", (1, 2), status="info"), 0, ILLEGAL),
])
def test_cas_register_steps(operation: Operation, state: Value, after: object) -> None:
    assert RegisterModel(0, cas=True).step(state, operation) == after


def test_a_register_has_no_keys() -> None:
    with pytest.raises(ModelError, match="names key"):
        RegisterModel(0).compile(op("write", 1, key="k"))


def test_a_plain_register_has_no_cas() -> None:
    with pytest.raises(ModelError, match="no function 'cas'"):
        RegisterModel(0).compile(op("cas", (1, 2)))


@pytest.mark.parametrize("arguments", [3, (1,), (1, 2, 3), None])
def test_cas_needs_two_arguments(arguments: Value) -> None:
    with pytest.raises(ModelError, match="expected new"):
        RegisterModel(0, cas=True).compile(op("cas", arguments))


@pytest.mark.parametrize(("operation", "state", "after"), [
    (op("get", output="", key="k"), "", ""),
    (op("put", "x", key="k"), "", "x"),
    (op("append", "y", key="k"), "x", "xy"),
    (op("append", "y", key="k"), None, "y"),  # appending to an absent key
    (op("cas", ("x", "z"), None, key="k"), "x", "z"),
    (op("get", output="x", key="k"), "xy", ILLEGAL),
])
def test_kv_steps_on_one_key(operation: Operation, state: Value, after: object) -> None:
    (part,) = KvModel("").partition([operation]) or []
    assert part.model.step(state, operation) == after


def test_kv_unpartitioned_keeps_the_whole_map() -> None:
    model = KvModel(None, partitioned=False)
    state = model.initial_state()
    for operation in (op("put", 1, key="a"), op("append", "s", key="b"),
                      op("get", output=1, key="a")):
        state = model.step(state, operation)
    assert model.step(state, op("get", output=2, key="a")) is ILLEGAL
    assert model.describe_state(state) == '{"a" 1, "b" "s"}'


def test_kv_partitions_are_sorted_by_key() -> None:
    operations = [op("put", 1, key=key, number=index)
                  for index, key in enumerate(["b", "a", "c", "a"])]
    parts = KvModel().partition(operations)
    assert parts is not None
    assert [part.label for part in parts] == ['key "a"', 'key "b"', 'key "c"']
    assert [len(part.operations) for part in parts] == [2, 1, 1]


def test_append_needs_a_string() -> None:
    with pytest.raises(ModelError, match="append takes a string"):
        KvModel().compile(op("append", 3, key="k"))


def test_operations_are_described_the_jepsen_way() -> None:
    assert describe_operation(op("read", output=3)) == "read -> 3"
    assert describe_operation(op("read", output=None)) == "read -> nil"
    assert describe_operation(op("write", 3, 3)) == "write 3"
    assert describe_operation(op("cas", (1, 2), False)) == "cas [1 2] -> false"
    assert describe_operation(op("put", "v", key="k", status="info")) == 'put "k" "v" -> ?'


# --- values compare by type: true is not 1, false is not 0, 2.0 is not 2 ---------------------

# Templates: {0} is a value, {1} the value seen or compared with later.
READ_AFTER_WRITE = "0 invoke write {0}\n0 ok write {0}\n1 invoke read\n1 ok read {1}"
GET_AFTER_PUT = "0 invoke put {0} key=k\n0 ok put {0} key=k\n1 invoke get key=k\n1 ok get {1} key=k"
CAS_AFTER_WRITE = """
    0 invoke write {0}
    0 ok write {0}
    1 invoke cas [{1}, 5]
    1 ok cas [{1}, 5]
    2 invoke read
    2 ok read 5"""

# (model, template, a value, a value of another type that Python's == says is equal to it):
# with the value in both places the history is linearizable; with the other one, it is not.
MIXED_TYPES = [
    (RegisterModel(0), READ_AFTER_WRITE, "1", "true"),
    (RegisterModel(0), READ_AFTER_WRITE, "0", "false"),
    (RegisterModel(0), READ_AFTER_WRITE, "2", "2.0"),
    (RegisterModel(0), READ_AFTER_WRITE, "[1]", "[true]"),  # inside a list too
    (RegisterModel(0), "1 invoke read\n1 ok read {1}", "0", "false"),  # the initial value
    (RegisterModel(0, cas=True), CAS_AFTER_WRITE, "1", "true"),
    (RegisterModel(0, cas=True), CAS_AFTER_WRITE, "1", "1.0"),
    (KvModel(), GET_AFTER_PUT, "1", "true"),
    (KvModel(partitioned=False), GET_AFTER_PUT, "0", "false"),
]


@pytest.mark.parametrize(("model", "template", "value", "other"), MIXED_TYPES,
                         ids=[f"{case[0].name}-{case[2]}-{case[3]}" for case in MIXED_TYPES])
def test_a_value_of_another_type_is_another_value(model: Model, template: str, value: str,
                                                  other: str) -> None:
    assert check(model, history(template.format(value, value))).is_linearizable
    assert check(model, history(template.format(value, other))).verdict \
        is Verdict.NOT_LINEARIZABLE


def test_the_search_does_not_merge_states_equal_only_to_python() -> None:
    # Two concurrent writes, of 1 and of true, then a read of 1 and a read of true: no order
    # works. Taking write-true-then-write-1 first (state 1), the search must not then skip
    # write-1-then-write-true (state true) as a configuration already seen, nor the reverse.
    concurrent = """
        0 invoke write 1
        1 invoke write true
        0 ok write 1
        1 ok write true
        2 invoke read
        2 ok read {}"""
    for last in ("1", "true"):
        assert check(RegisterModel(None), history(concurrent.format(last))).is_linearizable
    assert check(RegisterModel(None), history(concurrent.format("1") + """
        2 invoke read
        2 ok read true""")).verdict is Verdict.NOT_LINEARIZABLE


def test_exact_values_keep_python_s_equal_numbers_apart() -> None:
    values: list[Value] = [True, 1, 1.0, False, 0, 0.0, (1,), (True,), (1.0,), "1", None]
    assert len({exact(value) for value in values}) == len(values)
    assert exact((1, "a", None)) == (1, "a", None)  # nothing to wrap: left as it is
    assert exact(2.5) == exact(2.5)


def test_model_names() -> None:
    assert model_named("register", 0).name == "register"
    assert model_named("cas-register").name == "cas-register"
    assert isinstance(model_named("kv", ""), KvModel)
    assert model_named("gpu").name == "gpu"
    with pytest.raises(ModelUnavailable, match="no model named"):
        model_named("queue")


class Counter:
    """A toy deterministic state machine behind consensus's StateMachine protocol."""

    def __init__(self) -> None:
        self.value = 0

    def apply(self, command: bytes) -> bytes:
        if command == b"inc":
            self.value += 1
        return self.value.to_bytes(8, "big")

    def query(self, query: bytes) -> bytes:
        return self.value.to_bytes(8, "big")

    def snapshot(self) -> bytes:
        return self.value.to_bytes(8, "big")

    def restore(self, snapshot: bytes) -> None:
        self.value = int.from_bytes(snapshot, "big")

    def digest(self) -> bytes:
        return hashlib.blake2b(self.snapshot(), digest_size=16).digest()


def counter_history(replies: list[int], *, concurrent: bool) -> HistoryRecorder:
    recorder = HistoryRecorder()
    handles = []
    for process in range(len(replies)):
        handles.append(recorder.invoke(process, "apply", b"inc".hex()))
        if not concurrent:
            recorder.ok(handles[-1], replies[process].to_bytes(8, "big").hex())
    if concurrent:
        for process, handle in enumerate(handles):
            recorder.ok(handle, replies[process].to_bytes(8, "big").hex())
    return recorder


@pytest.mark.parametrize(("replies", "concurrent", "verdict"), [
    ([1, 2, 3], False, Verdict.LINEARIZABLE),
    ([3, 1, 2], True, Verdict.LINEARIZABLE),  # overlapping increments in any order
    ([1, 1, 2], True, Verdict.NOT_LINEARIZABLE),  # two increments saw the same count
    ([2, 1, 3], False, Verdict.NOT_LINEARIZABLE),
])
def test_a_state_machine_as_a_model(replies: list[int], concurrent: bool,
                                    verdict: Verdict) -> None:
    recorder = counter_history(replies, concurrent=concurrent)
    query = recorder.invoke(9, "query", b"".hex())
    recorder.ok(query, (3 if verdict is Verdict.LINEARIZABLE else 2).to_bytes(8, "big").hex())
    result = check(StateMachineModel(Counter, name="counter"), recorder.history())
    assert result.verdict is verdict
    assert len(result.partitions) == 1


def test_a_state_machine_model_wants_hex() -> None:
    model = StateMachineModel(Counter)
    with pytest.raises(ModelError, match="not hex"):
        model.compile(op("apply", "zz"))
    with pytest.raises(ModelError, match="no function"):
        model.compile(op("write", "00"))
