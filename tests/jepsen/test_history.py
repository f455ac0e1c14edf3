"""Histories: the recorder's API, the event rules History enforces, and how events pair up."""

from __future__ import annotations

import pytest

from jepsen.errors import HistoryError
from jepsen.history import Event, EventType, History, HistoryRecorder, freeze


def test_the_recorder_gives_events_their_real_time_order() -> None:
    recorder = HistoryRecorder()
    write = recorder.invoke(0, "write", 1)
    read = recorder.invoke(1, "read")
    recorder.ok(read, 1)
    recorder.nemesis("partition", ["n1", "n2"])
    recorder.ok(write, 1)
    history = recorder.history()
    assert [event.index for event in history.events] == [0, 1, 2, 3, 4]
    assert [(event.process, event.type) for event in history.events] == [
        (0, EventType.INVOKE), (1, EventType.INVOKE), (1, EventType.OK),
        ("nemesis", EventType.INFO), (0, EventType.OK)]
    assert history.events[3].value == ("n1", "n2")
    write_op, read_op = history.operations
    assert (write_op.call, write_op.ret, write_op.input) == (0, 4, 1)
    assert (read_op.call, read_op.ret, read_op.output) == (1, 2, 1)
    assert len(history.other_events) == 1
    assert len(history.client_events) == 4


def test_an_operation_never_completed_counts_as_info() -> None:
    recorder = HistoryRecorder()
    recorder.invoke(3, "write", 7)
    history = recorder.history()
    (operation,) = history.operations
    assert operation.status is EventType.INFO
    assert operation.ret is None
    assert operation.output is None


def test_fail_and_info_outcomes_keep_no_output() -> None:
    recorder = HistoryRecorder()
    first = recorder.invoke(0, "cas", [1, 2])
    recorder.fail(first, [1, 2])
    second = recorder.invoke(0, "write", 5)
    recorder.info(second, "timed-out")
    first_op, second_op = recorder.history().operations
    assert (first_op.status, first_op.output, first_op.input) == (EventType.FAIL, None, (1, 2))
    assert (second_op.status, second_op.output, second_op.ret) == (EventType.INFO, None, 3)


def test_a_process_may_invoke_again_after_an_info() -> None:
    recorder = HistoryRecorder()
    recorder.info(recorder.invoke(0, "write", 1))
    recorder.ok(recorder.invoke(0, "read"), 1)
    assert [op.status for op in recorder.history().operations] == [EventType.INFO, EventType.OK]


def test_keys_travel_from_invocation_to_operation() -> None:
    recorder = HistoryRecorder()
    handle = recorder.invoke(0, "put", "v", key="k")
    recorder.ok(handle)
    history = recorder.history()
    assert history.events[1].key == "k"
    assert history.operations[0].key == "k"


@pytest.mark.parametrize("misuse", ["invoke-twice", "complete-twice", "complete-with-invoke",
                                    "string-client", "integer-nemesis"])
def test_the_recorder_refuses_misuse(misuse: str) -> None:
    recorder = HistoryRecorder()
    handle = recorder.invoke(0, "read")
    with pytest.raises(HistoryError):
        if misuse == "invoke-twice":
            recorder.invoke(0, "write", 1)
        elif misuse == "complete-twice":
            recorder.ok(handle, 1)
            recorder.ok(handle, 1)
        elif misuse == "complete-with-invoke":
            recorder.complete(handle, "invoke")
        elif misuse == "string-client":
            recorder.invoke("client", "read")  # type: ignore[arg-type]
        else:
            recorder.nemesis("kill", process=3)  # type: ignore[arg-type]


def events(*rows: tuple[object, str, str, object]) -> list[Event]:
    return [Event(index, process, EventType(kind), f, freeze(value))  # type: ignore[arg-type]
            for index, (process, kind, f, value) in enumerate(rows)]


@pytest.mark.parametrize(("rows", "message"), [
    ([(0, "ok", "read", 1)], "no pending invocation"),
    ([(0, "invoke", "read", None), (0, "invoke", "read", None)], "still pending"),
    ([(0, "invoke", "read", None), (0, "ok", "write", 1)], "invoked read"),
])
def test_history_refuses_events_that_do_not_pair(rows: list[tuple[object, str, str, object]],
                                                 message: str) -> None:
    with pytest.raises(HistoryError, match=message) as caught:
        History(events(*rows))
    assert caught.value.index == len(rows) - 1


@pytest.mark.parametrize("completion_key", [True, 1.0, "1"])
def test_a_completion_for_another_key_is_refused_even_when_python_calls_it_equal(
        completion_key: object) -> None:
    invocation = Event(0, 0, EventType.INVOKE, "get", None, 1)
    completion = Event(1, 0, EventType.OK, "get", "v", completion_key)  # type: ignore[arg-type]
    with pytest.raises(HistoryError, match="completion for key"):
        History([invocation, completion])
    assert History([invocation, Event(1, 0, EventType.OK, "get", "v", 1)]).operations[0].key == 1


def test_history_refuses_out_of_order_indices() -> None:
    event = Event(5, 0, EventType.INVOKE, "read")
    with pytest.raises(HistoryError, match="index"):
        History([event])


def test_nemesis_events_need_no_pairing() -> None:
    history = History(events(("nemesis", "info", "start", None), ("nemesis", "ok", "stop", 1)))
    assert history.operations == ()
    assert len(history.other_events) == 2


def test_freeze_turns_lists_into_tuples_and_refuses_maps() -> None:
    assert freeze([1, [2, "x"], None]) == (1, (2, "x"), None)
    with pytest.raises(TypeError):
        freeze({"a": 1})
