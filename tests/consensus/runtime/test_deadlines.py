"""Request deadlines on one timer, on asyncio and on trio: requests awaited by key get their answer
or expire at their deadline (an earlier one added later included), closing expires them all, a
cancelled waiter leaves cleanly, and the heap stays bounded by the keys still awaited."""

from __future__ import annotations

from collections.abc import Awaitable

import anyio
import pytest

from consensus.runtime.deadlines import COMPACT_ENTRIES_MIN, Awaited, Doorbell

pytestmark = pytest.mark.anyio


async def test_an_answer_before_the_deadline_wakes_the_waiter_with_it() -> None:
    answers: Awaited[str] = Awaited()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(answers.run)
        awaited = answers.wait(1, anyio.current_time() + 5.0)
        tasks.start_soon(_answer_soon, answers, 1, "answer")
        assert await awaited == "answer"
        answers.answer(1, "again")  # a second answer changes nothing, raises nothing
        answers.forget(1)
        assert answers.waiting == 0
        tasks.cancel_scope.cancel()


async def _answer_soon(answers: Awaited[str], key: int, answer: str) -> None:
    await anyio.sleep(0.01)
    answers.answer(key, answer)


async def test_waiters_expire_at_their_deadlines_an_earlier_one_added_later_first() -> None:
    answers: Awaited[str] = Awaited()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(answers.run)
        started = anyio.current_time()
        answers.wait(1, started + 5.0)
        await anyio.sleep(0.01)  # `run` is now asleep until the late deadline
        assert await answers.wait(2, started + 0.05) is None
        waited_s = anyio.current_time() - started
        assert 0.05 <= waited_s < 1.0  # woken for the early deadline, not the late one
        assert answers.waiting == 1  # the late one still waits
        tasks.cancel_scope.cancel()


async def test_closing_expires_every_waiter_and_ends_the_timer() -> None:
    answers: Awaited[str] = Awaited()
    got: list[str | None] = []
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(answers.run)
        for key in range(3):
            tasks.start_soon(_collect, answers.wait(key, anyio.current_time() + 60.0), got)
        await anyio.sleep(0.01)
        answers.close()
    assert got == [None, None, None]  # and the task group ended: `run` returned
    with anyio.fail_after(1.0):
        assert await answers.wait(4, anyio.current_time() + 60.0) is None  # at once


async def _collect(awaited: Awaitable[str | None], got: list[str | None]) -> None:
    got.append(await awaited)


async def test_a_cancelled_waiter_can_still_be_answered_or_expired() -> None:
    answers: Awaited[str] = Awaited()
    awaited = answers.wait(1, anyio.current_time() + 0.01)
    with anyio.move_on_after(0.001):
        await awaited
    answers.answer(1, "late")  # its waiting task is gone: nothing to wake, nothing raised
    answers.wait(2, anyio.current_time() + 0.01)
    answers.expire_due(anyio.current_time() + 1.0)  # key 2 never awaited: expired all the same
    assert answers.waiting == 0 and len(answers) == 0


async def test_the_heap_is_rebuilt_from_the_keys_still_awaited_as_it_grows() -> None:
    answers: Awaited[str] = Awaited()
    far = anyio.current_time() + 60.0
    kept = [answers.wait(key, far) for key in range(10)]
    for key in range(10, 10 + 10 * COMPACT_ENTRIES_MIN):
        answers.wait(key, far)
        answers.answer(key, str(key))  # answered at once, as under load
        answers.forget(key)
        assert len(answers) <= COMPACT_ENTRIES_MIN
    assert answers.waiting == 10
    answers.expire_due(far)
    assert len(answers) == 0 and answers.waiting == 0
    assert [await awaited for awaited in kept] == [None] * 10


async def test_a_doorbell_wakes_its_sleeper_and_forgets_a_ring_with_none_asleep() -> None:
    doorbell = Doorbell()
    doorbell.ring()  # nobody asleep: not remembered, so the next sleep runs to its timeout
    started = anyio.current_time()
    await doorbell.sleep(0.05)
    assert anyio.current_time() - started >= 0.04
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_ring_soon, doorbell)
        with anyio.fail_after(2.0):
            await doorbell.sleep()  # no timeout: only the ring ends it


async def _ring_soon(doorbell: Doorbell) -> None:
    await anyio.sleep(0.01)
    doorbell.ring()


async def test_the_timer_sleeps_past_answered_requests_to_the_first_still_awaited() -> None:
    """One caller's requests, each answered long before its deadline: once the first deadline
    passes, the timer re-arms for the one request still awaited, not for the next answered
    one (it had woken once a request, for requests long answered)."""
    answers: Awaited[str] = Awaited()
    expiries: list[int] = []
    expire_due = answers.expire_due

    def counted(now: float) -> None:
        expiries.append(1)
        expire_due(now)

    answers.expire_due = counted  # type: ignore[method-assign]
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(answers.run)
        started = anyio.current_time()
        for key in range(1, 101):  # deadlines 0.02 s apart; all but the last answered at once
            answers.wait(key, started + 0.05 + key * 0.02)
            if key < 100:
                answers.answer(key, "answer")
                answers.forget(key)
        await anyio.sleep(0.1)  # past the first deadlines: the timer wakes
        woken = len(expiries)
        await anyio.sleep(0.3)  # fifteen answered requests' deadlines pass meanwhile
        assert len(expiries) == woken  # asleep until the last request's deadline
        assert answers.waiting == 1
        tasks.cancel_scope.cancel()
