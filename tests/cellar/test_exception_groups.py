"""`run_unwrapped`: what a command's `except` clauses see of an error raised in a task group."""

from __future__ import annotations

import anyio
import pytest

from cellar.exception_groups import run_unwrapped, sole_exception
from consensus.runtime.client import ClientError, Unavailable


async def _raise_in_body(error: BaseException) -> None:
    """As the client raises: from the body of its task group, inside another one."""
    async with anyio.create_task_group(), anyio.create_task_group():
        raise error


async def _raise_in_children(*errors: BaseException) -> None:
    async def fail(error: BaseException) -> None:
        raise error

    async with anyio.create_task_group() as tasks:
        for error in errors:
            tasks.start_soon(fail, error)


def test_a_task_group_wraps_even_its_body_s_one_error() -> None:
    """Why the commands need it: anyio.run itself lets no `except ClientError` match."""
    with pytest.raises(BaseExceptionGroup):
        anyio.run(_raise_in_body, Unavailable("no replica took the command"))


def test_the_one_error_comes_out_as_itself() -> None:
    with pytest.raises(ClientError, match="no replica took the command"):
        run_unwrapped(_raise_in_body, Unavailable("no replica took the command"))


def test_system_exit_keeps_its_message_and_status() -> None:
    with pytest.raises(SystemExit) as stopped:
        run_unwrapped(_raise_in_body, SystemExit("the cluster refused the configuration"))
    assert stopped.value.code == "the cluster refused the configuration"


def test_the_error_keeps_its_cause_and_gains_no_group_as_context() -> None:
    cause = OSError("connection refused")
    error = Unavailable("no replica took the command")
    error.__cause__ = cause
    with pytest.raises(Unavailable) as raised:
        run_unwrapped(_raise_in_body, error)
    assert raised.value.__cause__ is cause
    assert not isinstance(raised.value.__context__, BaseExceptionGroup)


def test_several_errors_stay_a_group() -> None:
    with pytest.raises(BaseExceptionGroup) as raised:
        run_unwrapped(_raise_in_children, Unavailable("one"), ValueError("two"))
    assert sorted(type(error).__name__ for error in raised.value.exceptions) == [
        "Unavailable", "ValueError"]


def test_a_result_passes_through() -> None:
    async def answer(value: int) -> int:
        return value

    assert run_unwrapped(answer, 42) == 42


def test_sole_exception_looks_through_nested_groups_of_one() -> None:
    inner = KeyError("k")
    assert sole_exception(BaseExceptionGroup("a", [BaseExceptionGroup("b", [inner])])) is inner
    assert sole_exception(ExceptionGroup("a", [ExceptionGroup("b", [inner, inner])])) is None
