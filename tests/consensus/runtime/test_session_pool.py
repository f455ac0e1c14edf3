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
