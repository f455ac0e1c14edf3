"""The driver's inbox, on asyncio and on trio: items come out in order, an offer beyond the
bound (in items or in bytes) is refused and leaves the queue as it was, an offer wakes a
sleeping consumer at once, a consumer with nothing to take wakes at its deadline, and a
cancelled wait leaves cleanly."""

from __future__ import annotations

import anyio
import pytest

from consensus.runtime.inbox import Inbox

pytestmark = pytest.mark.anyio


async def test_items_come_out_in_order_and_the_bound_refuses_the_rest() -> None:
    inbox: Inbox[int] = Inbox(items_max=3, bytes_max=1 << 20)
    assert [inbox.offer(n) for n in range(5)] == [True, True, True, False, False]
    assert len(inbox) == 3
    assert inbox.take(2) == [0, 1]
    assert inbox.offer(9)
    assert inbox.take(10) == [2, 9]
    assert inbox.take(10) == [] and len(inbox) == 0


async def test_items_past_the_bound_in_bytes_are_refused_until_some_are_taken() -> None:
    inbox: Inbox[str] = Inbox(items_max=8, bytes_max=10)
    assert [inbox.offer("a", 4), inbox.offer("b", 4), inbox.offer("c", 4)] == [True, True, False]
    assert inbox.offer("sized nothing") and inbox.queued_bytes == 8
    assert inbox.take(1) == ["a"] and inbox.queued_bytes == 4
    assert inbox.offer("c", 4) and inbox.queued_bytes == 8
    assert inbox.take(8) == ["b", "sized nothing", "c"] and inbox.queued_bytes == 0


async def test_an_item_larger_than_the_bound_is_taken_into_an_empty_queue_alone() -> None:
    inbox: Inbox[str] = Inbox(items_max=8, bytes_max=10)
    assert inbox.offer("large", 40) and not inbox.offer("small", 1)
    assert inbox.take(8) == ["large"] and inbox.offer("small", 1)


async def test_an_offer_wakes_a_sleeping_consumer_before_its_deadline() -> None:
    inbox: Inbox[str] = Inbox(items_max=8, bytes_max=1 << 20)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_offer_soon, inbox, "frame")
        started = anyio.current_time()
        await inbox.wait(timeout_s=5.0)
        assert anyio.current_time() - started < 2.0
        assert inbox.take(8) == ["frame"]


async def _offer_soon(inbox: Inbox[str], item: str) -> None:
    await anyio.sleep(0.01)
    assert inbox.offer(item)


async def test_a_consumer_with_nothing_to_take_wakes_at_its_deadline() -> None:
    inbox: Inbox[str] = Inbox(items_max=8, bytes_max=1 << 20)
    started = anyio.current_time()
    await inbox.wait(timeout_s=0.05)
    assert anyio.current_time() - started >= 0.04
    assert inbox.take(8) == []
    assert inbox.offer("later") and inbox.take(8) == ["later"]  # no stale sleeper remains


async def test_a_wait_with_items_queued_returns_at_once() -> None:
    inbox: Inbox[str] = Inbox(items_max=8, bytes_max=1 << 20)
    inbox.offer("queued")
    with anyio.fail_after(1.0):
        await inbox.wait(timeout_s=60.0)


async def test_a_cancelled_wait_leaves_the_inbox_usable() -> None:
    inbox: Inbox[str] = Inbox(items_max=8, bytes_max=1 << 20)
    with anyio.move_on_after(0.02):
        await inbox.wait(timeout_s=60.0)
    assert inbox.offer("after") and inbox.take(8) == ["after"]
    inbox.offer("next")
    await inbox.wait(timeout_s=60.0)
    assert inbox.take(8) == ["next"]


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="items_max"):
        Inbox(items_max=0, bytes_max=1 << 20)
    with pytest.raises(ValueError, match="bytes_max"):
        Inbox(items_max=8, bytes_max=0)
