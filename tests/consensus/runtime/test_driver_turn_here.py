"""The driver's turn run on the task an input came on (`claim_turn`, `turn_here`): it takes the
input without waking the driver's task, only while that task sleeps and the replica is at
one caller's pace, one turn at a time, whole even when its task is cancelled, and what it
raises stops the driver."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.lowlevel
import pytest

from consensus.config import ReplicaConfig
from consensus.prng import Prng
from consensus.records import CAcceptRecord, Record
from consensus.replica import Replica
from consensus.runtime.driver import Driver, DriverConfig
from consensus.runtime.metrics import Metrics
from jepsen.sim.kv_codec import encode_put
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.local import MemoryStore

pytestmark = pytest.mark.anyio

# The driver's task wakes on its own only every 5 s: any wake-up here is an input's
SLEEPY = DriverConfig(tick_ms=50, idle_wake_ticks=100)


def ignore(reply: bytes | None, error: Exception | None) -> None:
    pass


def lone_driver(store: MemoryStore) -> Driver:
    """Replica 1 of 3, its peers absent: a command proposed there is appended at once."""
    replica = Replica(ReplicaConfig(replica_id=1, replica_count=3), Prng(1))
    return Driver(replica, store, SessionKv(), lambda target, frame: True, Metrics(),
                  config=SLEEPY)


async def parked(driver: Driver) -> None:
    """Until the driver's task sleeps for inputs, with none queued."""
    with anyio.fail_after(5):
        while not driver._parked or driver._inbox:
            await anyio.sleep(0.001)


@asynccontextmanager
async def running(driver: Driver) -> AsyncIterator[anyio.abc.TaskGroup]:
    async with anyio.create_task_group() as tasks:
        await tasks.start(driver.run)
        await parked(driver)
        yield tasks
        tasks.cancel_scope.cancel()


async def test_an_input_to_a_sleeping_driver_is_taken_on_the_task_that_hands_it_in() -> None:
    store = MemoryStore()
    driver = lone_driver(store)
    async with running(driver):
        wakeups = driver.metrics.counter("driver.wakeups")
        assert driver.claim_turn()
        driver.submit(encode_put("k", 1), 5.0, ignore)
        await driver.turn_here()
        assert store.records  # the command's acceptance, appended within the turn
        assert driver.metrics.counter("driver.turns_here") == 1
        await anyio.sleep(0.05)
        assert driver.metrics.counter("driver.wakeups") == wakeups  # its task slept on
        # an input handed in without a claim wakes the driver's task, as before
        appended = len(store.records)
        driver.submit(encode_put("k", 2), 5.0, ignore)
        with anyio.fail_after(5):
            while len(store.records) == appended:
                await anyio.sleep(0.001)
        assert driver.metrics.counter("driver.wakeups") == wakeups + 1


async def test_no_turn_is_claimed_unless_the_driver_sleeps_at_one_callers_pace() -> None:
    driver = lone_driver(MemoryStore())
    assert not driver.claim_turn()  # its task has not started
    async with running(driver):
        assert driver.claim_turn()
        assert not driver.claim_turn()  # one turn at a time
        driver.submit(encode_put("k", 1), 5.0, ignore)
        await driver.turn_here()
        driver.submit(encode_put("k", 2), 5.0, ignore)  # queued: the driver's task takes it
        assert not driver.claim_turn()
        await parked(driver)
        # two commands of this replica's clients wait (their peers are absent): no longer
        # one caller's pace
        assert len(driver._proposals) == 2
        assert not driver.claim_turn()


async def test_a_turn_cancelled_at_an_await_still_ends_whole_and_the_driver_waits_for_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn yields before its sync (its accepts may leave first); its task is cancelled
    there (a peer's connection replaced), and the driver's task is woken meanwhile: the
    command is still appended, synced and handled, and the driver's task takes the next
    input only after it."""
    store = MemoryStore()
    driver = lone_driver(store)
    release = anyio.Event()
    yielded = anyio.Event()
    checkpoint = anyio.lowlevel.checkpoint

    async def held_checkpoint() -> None:
        yielded.set()
        await release.wait()
        await checkpoint()

    async def reader(scope: anyio.CancelScope) -> None:
        with scope:
            assert driver.claim_turn()
            driver.submit(encode_put("k", 1), 5.0, ignore)
            await driver.turn_here()
            await anyio.sleep(5)  # cancelled here, after the turn

    async with running(driver) as tasks:
        monkeypatch.setattr(anyio.lowlevel, "checkpoint", held_checkpoint)
        scope = anyio.CancelScope()
        tasks.start_soon(reader, scope)
        with anyio.fail_after(5):
            await yielded.wait()
        monkeypatch.setattr(anyio.lowlevel, "checkpoint", checkpoint)
        scope.cancel()
        driver.submit(encode_put("k", 2), 5.0, ignore)  # offered while the turn runs
        driver._inbox.wake()  # as the driver's tick would
        await anyio.sleep(0.05)
        assert store.records == [] and len(driver._inbox) == 1  # all wait for the turn
        release.set()
        with anyio.fail_after(5):
            while len(driver._proposals) < 2 or len(driver._inbox):
                await anyio.sleep(0.001)
        assert store.syncs >= 1 and not driver.replica.has_ready()
        assert accepted_puts(store.records) == [encode_put("k", 1), encode_put("k", 2)]


def accepted_puts(records: list[Record]) -> list[bytes]:
    """The commands of the C-instances accepted, in the order their records were appended."""
    return [command.payload for record in records if isinstance(record, CAcceptRecord)
            for command in record.batch]


async def test_what_a_turn_raises_stops_the_driver_not_the_task_that_ran_it() -> None:
    class FailingStore(MemoryStore):
        def append(self, records: list[Record]) -> None:  # type: ignore[override]
            raise OSError(28, "No space left on device")

    driver = lone_driver(FailingStore())
    ran: list[str] = []
    with pytest.raises(BaseExceptionGroup) as raised:
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)
            await parked(driver)
            assert driver.claim_turn()
            driver.submit(encode_put("k", 1), 5.0, ignore)
            await driver.turn_here()  # returns: the reader goes on reading
            ran.append("returned")
            assert not driver.claim_turn()  # and takes no further turn
            await anyio.sleep(5)  # the driver's task fails, cancelling this
    assert ran == ["returned"]
    errors = raised.value.exceptions
    assert len(errors) == 1 and isinstance(errors[0], OSError) and errors[0].errno == 28
    assert not driver.running


async def test_commit_notices_held_by_a_turn_wake_a_driver_asleep_for_longer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's task slept for `idle_wake_ticks`; a turn on another task left commit
    notices to send at the next tick: the task is woken to sleep one tick instead."""
    driver = lone_driver(MemoryStore())
    async with running(driver):
        assert not driver._parked_short
        wakeups = driver.metrics.counter("driver.wakeups")
        monkeypatch.setattr(Replica, "holds_notices", property(lambda replica: True))
        assert driver.claim_turn()
        await driver.turn_here()
        with anyio.fail_after(2):  # its own wake-up was 5 s away
            while driver.metrics.counter("driver.wakeups") == wakeups:
                await anyio.sleep(0.001)
        await parked(driver)
        assert driver._parked_short
