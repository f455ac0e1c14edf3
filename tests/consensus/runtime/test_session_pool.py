"""The client's session pool, on asyncio and on trio: a session given back goes to the caller
that waited longest, a newcomer never overtakes it, and a caller waits only until its
deadline."""

from __future__ import annotations

import anyio
import pytest

from consensus.runtime.session_pool import SessionPool

pytestmark = pytest.mark.anyio


async def test_a_session_given_back_goes_to_the_longest_waiter_not_a_newcomer() -> None:
    pool = SessionPool(1)
    held = pool.take_nowait()
    assert held is not None and pool.take_nowait() is None
    served: list[str] = []

    async def wait(name: str) -> None:
        session = await pool.take(5.0)
        assert session is held
        served.append(name)
        pool.give_back(session)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            for name in ("first", "second", "third"):
                tasks.start_soon(wait, name)
                await anyio.sleep(0.01)  # in this order
            pool.give_back(held)
            assert pool.take_nowait() is None  # handed on to "first", not free for anyone
    assert served == ["first", "second", "third"]
    assert pool.take_nowait() is held  # free once nobody waits


async def test_a_caller_waits_only_until_its_deadline_and_loses_its_turn() -> None:
    pool = SessionPool(1)
    held = pool.take_nowait()
    assert held is not None
    with anyio.fail_after(5):
        started = anyio.current_time()
        assert await pool.take(0.1) is None
        assert anyio.current_time() - started >= 0.1
    pool.give_back(held)  # the caller that gave up is skipped
    assert pool.take_nowait() is held


async def test_a_waiter_cancelled_as_it_is_handed_a_session_gives_it_back() -> None:
    pool = SessionPool(1)
    held = pool.take_nowait()
    assert held is not None

    async def use() -> None:  # as `propose` does
        session = await pool.take(5.0)
        assert session is not None
        try:
            await anyio.sleep(5)
        finally:
            pool.give_back(session)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(use)
            await anyio.sleep(0.01)
            pool.give_back(held)  # handed to `use`, cancelled before it runs again
            tasks.cancel_scope.cancel()
    assert pool.take_nowait() is held


async def test_waiters_give_up_each_at_its_own_deadline_whatever_order_they_came_in() -> None:
    """On asyncio the waiters share one timer: a newcomer with a nearer deadline than those
    already waiting must pull it in, and each gives up at its own deadline, no sooner."""
    pool = SessionPool(1)
    held = pool.take_nowait()
    assert held is not None
    gave_up_after_s: dict[float, float] = {}

    async def wait(timeout_s: float) -> None:
        started = anyio.current_time()
        assert await pool.take(timeout_s) is None
        gave_up_after_s[timeout_s] = anyio.current_time() - started

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            for timeout_s in (0.6, 0.15, 0.4, 0.05):  # the nearest deadline comes last
                tasks.start_soon(wait, timeout_s)
    assert sorted(gave_up_after_s) == [0.05, 0.15, 0.4, 0.6]
    for timeout_s, waited_s in gave_up_after_s.items():
        assert timeout_s <= waited_s < timeout_s + 0.25, (timeout_s, waited_s)
    pool.give_back(held)  # every waiter gave up: it goes back to the pool
    assert pool.take_nowait() is held


async def test_a_waiter_served_in_time_is_not_expired_by_the_shared_timer() -> None:
    """A waiter handed a session keeps it though its deadline passes while it holds it, and
    waiters still queued behind it give up on time."""
    pool = SessionPool(1)
    held = pool.take_nowait()
    assert held is not None
    outcomes: list[str] = []

    async def wait(name: str, timeout_s: float) -> None:
        session = await pool.take(timeout_s)
        outcomes.append(f"{name}:{'served' if session is not None else 'gave up'}")
        if session is not None:
            await anyio.sleep(0.3)  # past its deadline, holding it
            pool.give_back(session)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(wait, "first", 0.1)
            await anyio.sleep(0.01)
            tasks.start_soon(wait, "second", 0.15)
            await anyio.sleep(0.01)
            pool.give_back(held)  # to "first"; "second" times out while "first" holds it
    assert outcomes == ["first:served", "second:gave up"]
    assert pool.take_nowait() is held


def test_a_timer_left_armed_in_an_event_loop_now_gone_does_not_strand_the_next_loops_waiters(
        ) -> None:
    """Asyncio only (the shared timer): a waiter cancelled in one loop leaves the timer armed
    there for its deadline; a waiter in the next loop with a later deadline still gives up."""
    pool = SessionPool(1)
    held = pool.take_nowait()
    assert held is not None

    async def cancelled_waiter() -> None:
        with anyio.move_on_after(0.01):
            await pool.take(0.5)  # the timer is armed for 0.5 s and stays so

    async def later_waiter() -> float:
        started = anyio.current_time()
        with anyio.fail_after(5):
            assert await pool.take(0.6) is None  # past the dead loop's 0.5 s
        return anyio.current_time() - started

    anyio.run(cancelled_waiter, backend="asyncio")
    waited_s = anyio.run(later_waiter, backend="asyncio")
    assert 0.6 <= waited_s < 1.5
