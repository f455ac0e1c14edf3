"""The GPU-allocation state machine as a checker model: histories of real envelopes and the
replies the machine gave are linearizable; swap two replies and they are not."""

from __future__ import annotations

from jepsen.checker import check
from jepsen.history import HistoryRecorder
from jepsen.models import model_named
from jepsen.verdict import Verdict
from statemachine import Machine
from tests.statemachine.workload import workload_log

STEPS = 25


def replies(log: list[bytes]) -> list[bytes]:
    machine = Machine()
    return [machine.apply(entry) for entry in log]


def test_a_sequential_history_of_real_commands_is_linearizable() -> None:
    log = workload_log(3, STEPS)
    recorder = HistoryRecorder()
    for entry, reply in zip(log, replies(log), strict=True):
        handle = recorder.invoke(0, "apply", entry.hex())
        recorder.ok(handle, reply.hex())
    result = check(model_named("gpu"), recorder.history(), max_steps=200_000)
    assert result.verdict is Verdict.LINEARIZABLE


def test_two_overlapping_commands_linearize_in_the_order_that_explains_the_replies() -> None:
    log = workload_log(4, STEPS)
    answers = replies(log)
    recorder = HistoryRecorder()
    for position in range(0, len(log) - 1, 2):
        first = recorder.invoke(0, "apply", log[position].hex())
        second = recorder.invoke(1, "apply", log[position + 1].hex())
        recorder.ok(second, answers[position + 1].hex())  # completes first, applied second
        recorder.ok(first, answers[position].hex())
    result = check(model_named("gpu"), recorder.history(), max_steps=500_000)
    assert result.verdict is Verdict.LINEARIZABLE


def test_a_reply_the_machine_could_not_give_is_refuted() -> None:
    log = workload_log(5, STEPS)
    answers = replies(log)
    swap = next(index for index in range(len(answers) - 1)
                if answers[index] != answers[index + 1])
    answers[swap], answers[swap + 1] = answers[swap + 1], answers[swap]
    recorder = HistoryRecorder()
    for entry, reply in zip(log, answers, strict=True):
        handle = recorder.invoke(0, "apply", entry.hex())
        recorder.ok(handle, reply.hex())
    result = check(model_named("gpu"), recorder.history(), max_steps=200_000)
    assert result.verdict is Verdict.NOT_LINEARIZABLE
