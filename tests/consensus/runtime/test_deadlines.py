"""Request deadlines on one timer, on asyncio and on trio: waiters get their answer or expire at
their deadline (an earlier one added later included), closing expires them all, a cancelled
waiter leaves cleanly, and the heap stays bounded by the waiters open."""

from __future__ import annotations

import anyio
import pytest

from consensus.runtime.deadlines import COMPACT_ENTRIES_MIN, Deadlines, Doorbell, Waiter

pytestmark = pytest.mark.anyio


async def test_an_answer_before_the_deadline_wakes_the_waiter_with_it() -> None:
    deadlines: Deadlines[str] = Deadlines()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(deadlines.run)
        waiter = deadlines.waiter(anyio.current_time() + 5.0)
        tasks.start_soon(_finish_soon, waiter, "answer")
        assert await waiter.wait() == "answer"
        waiter.finish("again")  # a second answer changes nothing
        assert waiter.answer == "answer"
        tasks.cancel_scope.cancel()


async def _finish_soon(waiter: Waiter[str], answer: str) -> None:
    await anyio.sleep(0.01)
    waiter.finish(answer)


async def test_waiters_expire_at_their_deadlines_an_earlier_one_added_later_first() -> None:
    deadlines: Deadlines[str] = Deadlines()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(deadlines.run)
        started = anyio.current_time()
        late = deadlines.waiter(started + 5.0)
        await anyio.sleep(0.01)  # `run` is now asleep until the late deadline
        early = deadlines.waiter(started + 0.05)
        assert await early.wait() is None
        waited_s = anyio.current_time() - started
        assert 0.05 <= waited_s < 1.0  # woken for the early deadline, not the late one
        assert late.open
        tasks.cancel_scope.cancel()


async def test_closing_expires_every_waiter_and_ends_the_timer() -> None:
    deadlines: Deadlines[str] = Deadlines()
    answers: list[str | None] = []
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(deadlines.run)
        waiters = [deadlines.waiter(anyio.current_time() + 60.0) for _ in range(3)]
        for waiter in waiters:
            tasks.start_soon(_collect, waiter, answers)
        await anyio.sleep(0.01)
        deadlines.close()
    assert answers == [None, None, None]  # and the task group ended: `run` returned
    assert deadlines.waiter(anyio.current_time() + 60.0).open is False


async def _collect(waiter: Waiter[str], answers: list[str | None]) -> None:
    answers.append(await waiter.wait())


async def test_a_cancelled_waiter_can_still_be_finished_or_expired() -> None:
    deadlines: Deadlines[str] = Deadlines()
    waiter = deadlines.waiter(anyio.current_time() + 0.01)
    with anyio.move_on_after(0.001):
        await waiter.wait()
    waiter.finish("late")  # its waiting task is gone: nothing to wake, nothing raised
    deadlines.expire_due(anyio.current_time() + 1.0)
    assert waiter.answer == "late" and len(deadlines) == 0


async def test_the_heap_is_rebuilt_from_open_waiters_as_it_grows() -> None:
    deadlines: Deadlines[str] = Deadlines()
    far = anyio.current_time() + 60.0
    kept = [deadlines.waiter(far) for _ in range(10)]
    for number in range(10 * COMPACT_ENTRIES_MIN):
        deadlines.waiter(far).finish(str(number))  # answered at once, as under load
        assert len(deadlines) <= COMPACT_ENTRIES_MIN
    assert all(waiter.open for waiter in kept)
    deadlines.expire_due(far)
    assert len(deadlines) == 0 and all(waiter.answer is None for waiter in kept)


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

