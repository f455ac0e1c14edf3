"""The driver, server and client together, in one process, on trio and on asyncio: three
drivers wired by an in-memory network, a client talking to the replicas over in-memory frame
streams."""

from __future__ import annotations

import inspect
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import anyio
import pytest

from consensus.codec import decode_messages, encode_envelope, encode_messages, unpack
from consensus.config import ReplicaConfig
from consensus.envelope import Envelope, Principal, Role
from consensus.messages import (
    NO_INDEX,
    Command,
    Heartbeat,
    LeaseGrant,
    Message,
    ReadIndexReply,
    ReadIndexRequest,
    SnapshotMeta,
)
from consensus.prng import Prng
from consensus.ready import Executed, Ready
from consensus.records import SnapshotRecord, ViewRecord
from consensus.replica import Replica
from consensus.runtime import driver as driver_module
from consensus.runtime.client import CellarClient, ClientConfig, OutcomeUnknown
from consensus.runtime.client_codec import Propose, encode_request
from consensus.runtime.driver import (
    SNAPSHOT_EVERY_BYTES,
    TICK_CLOCK,
    TICKS_REPLAYED_MAX,
    Driver,
    DriverConfig,
    _Callback,
)
from consensus.runtime.driver import OutcomeUnknown as DriverOutcomeUnknown
from consensus.runtime.metrics import Metrics
from consensus.runtime.server import ClientServer
from jepsen.sim.kv_codec import decode_reply, encode_get, encode_put
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.local import (
    SCHEDULER,
    LocalCluster,
    MemoryFrames,
    MemoryStore,
    local_cluster,
)

pytestmark = pytest.mark.anyio


def kvs(cluster: LocalCluster) -> list[SessionKv]:
    machines = [machine for machine in cluster.machines if isinstance(machine, SessionKv)]
    assert len(machines) == len(cluster.machines)
    return machines


async def test_commands_are_replicated_and_reads_see_them() -> None:
    with anyio.fail_after(30):
        async with local_cluster(SessionKv) as (cluster, client):
            for index in range(20):
                reply = unpack(await client.propose(encode_put("k", index)), bytes_max=1 << 20,
                               what="reply")
                assert reply[0] == "scheduler:tester"
            assert decode_reply(await client.read(encode_get("k"))) == (True, 19)
            await anyio.sleep(0.3)
            assert {machine.kv.data.get("k") for machine in kvs(cluster)} == {19}


async def test_concurrent_commands_are_each_applied_once() -> None:
    expected = sorted(encode_put(f"k{index}", index) for index in range(40))
    with anyio.fail_after(30):
        async with local_cluster(SessionKv) as (cluster, client):
            async with anyio.create_task_group() as tasks:
                for index in range(40):
                    tasks.start_soon(client.propose, encode_put(f"k{index}", index))
            while any(len(machine.applied_bodies) < 40 for machine in kvs(cluster)):
                await anyio.sleep(0.01)
            await anyio.sleep(0.1)
    for machine in kvs(cluster):
        assert sorted(machine.applied_bodies) == expected


async def test_a_replica_failure_is_survived_by_retrying_elsewhere() -> None:
    with anyio.fail_after(40):
        async with local_cluster(SessionKv) as (cluster, client):
            await client.propose(encode_put("a", 1))
            cluster.down.add(0)  # the sequencer stops talking
            await client.propose(encode_put("a", 2))
            assert decode_reply(await client.read(encode_get("a"))) == (True, 2)
            assert cluster.drivers[1].replica.inspect.view > 0


async def test_a_client_that_prefers_the_sequencer_sends_it_its_commands() -> None:
    """The route is found in the background (the first commands go to the client's own
    replica), then every command goes to the sequencer; after a view change they follow the
    new one."""
    config = ClientConfig(attempt_timeout_s=0.5, deadline_s=8.0, prefer_sequencer=True)

    def sequencer() -> int:
        claims = [(driver.replica.status().view, index)
                  for index, driver in enumerate(cluster.drivers)
                  if driver.replica.status().is_sequencer and index not in cluster.down]
        return max(claims)[1] if claims else -1

    async def led_by_the_sequencer(client: CellarClient) -> bool:
        """Whether the next 10 commands are all proposed by the sequencer."""
        before = [driver.metrics.counter("driver.proposals") for driver in cluster.drivers]
        for index in range(10):
            await client.propose(encode_put("a", index))
        gained = [driver.metrics.counter("driver.proposals") - earlier
                  for driver, earlier in zip(cluster.drivers, before, strict=True)]
        return gained == [10 if index == sequencer() else 0 for index in range(3)]

    with anyio.fail_after(40):
        async with local_cluster(SessionKv) as (cluster, _), \
                cluster.client(SCHEDULER, config, first=2) as client:
            await client.propose(encode_put("a", 0))
            assert sequencer() != 2  # so the route is not the client's own replica
            while not await led_by_the_sequencer(client):
                await anyio.sleep(0.1)
            old = sequencer()
            cluster.down.add(old)
            await client.propose(encode_put("a", 11))  # through the view change
            cluster.down.clear()
            while not await led_by_the_sequencer(client) or sequencer() == old:
                await anyio.sleep(0.1)


async def test_no_quorum_means_outcome_unknown_not_a_guess() -> None:
    with anyio.fail_after(30):
        async with local_cluster(SessionKv) as (cluster, client):
            await client.propose(encode_put("a", 1))
            cluster.down.update({1, 2})
            with pytest.raises(OutcomeUnknown):
                await client.propose(encode_put("a", 2), deadline_s=1.5)


async def test_watches_resume_from_the_executed_slot() -> None:
    with anyio.fail_after(30):
        async with local_cluster(SessionKv) as (_, client):
            await client.propose(encode_put("w", 1))
            result, slot = await client.watch(encode_get("w"), -1, wait_s=1)
            assert decode_reply(result) == (True, 1) and slot >= 1
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(client.propose, encode_put("w", 2))
                result, later = await client.watch(encode_get("w"), slot, wait_s=5)
            assert later > slot


async def test_a_watch_held_longer_than_a_try_is_waited_for() -> None:
    """The replica holds a watch with no news for its whole wait: the client waits that long
    (here longer than one try's timeout) and gets the unchanged result, not Unavailable."""
    with anyio.fail_after(30):
        async with local_cluster(SessionKv) as (_, client):
            assert client.config.attempt_timeout_s + 1.0 < 2.5
            await client.propose(encode_put("w", 1))
            _, slot = await client.watch(encode_get("w"), -1, wait_s=1)
            started = anyio.current_time()
            # no news past `slot` (an answer below it would be older than what was seen)
            result, later = await client.watch(encode_get("w"), slot, wait_s=2.5)
            assert anyio.current_time() - started >= 2.5
            assert decode_reply(result) == (True, 1) and later == slot


async def test_submitted_commands_call_back_once_with_the_reply_or_an_error() -> None:
    """`Driver.submit`: the reply reaches the callback; without a quorum the callback gets
    OutcomeUnknown at its deadline, from the driver's own expiry (no task waits on it)."""
    outcomes: list[tuple[bytes | None, Exception | None]] = []
    with anyio.fail_after(30):
        async with local_cluster(SessionKv) as (cluster, client):
            await client.propose(encode_put("a", 1))  # a view is established
            driver = cluster.drivers[0]
            driver.submit(envelope_of(encode_put("b", 2)), 5.0,
                          lambda reply, error: outcomes.append((reply, error)))
            while not outcomes:
                await anyio.sleep(0.01)
            assert outcomes[0][0] is not None and outcomes[0][1] is None
            cluster.down.update({0, 2})  # replica 1 is alone: no quorum, no sequencer
            driver = cluster.drivers[1]
            driver.submit(envelope_of(encode_put("c", 3)), 0.3,
                          lambda reply, error: outcomes.append((reply, error)))
            driver.submit_read(encode_get("a"), 0.3,
                               lambda reply, error: outcomes.append((reply, error)))
            while len(outcomes) < 3:
                await anyio.sleep(0.01)
            await anyio.sleep(0.2)
    assert len(outcomes) == 3, outcomes  # each callback exactly once
    assert all(reply is None and isinstance(error, DriverOutcomeUnknown)
               for reply, error in outcomes[1:])


def envelope_of(body: bytes) -> bytes:
    return encode_envelope(Envelope(principal=Principal(Role.ADMIN, "tester"), session="cb",
                                    sequence=next(_sequences), now_ms=1000, body=body))


_sequences = itertools.count(1)


async def test_a_client_hanging_up_with_answers_pending_ends_its_connection_quietly() -> None:
    """Its answers cannot be written (the outbox breaks); serving that connection ends
    without an error, and the replica goes on serving others."""
    with anyio.fail_after(30):
        async with local_cluster(SessionKv) as (cluster, client):
            to_server, from_client = anyio.create_memory_object_stream[bytes](100)
            to_client, from_server = anyio.create_memory_object_stream[bytes](100)
            server = ClientServer(cluster.drivers[0], now_ms=lambda: 1000)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(server.serve, Principal(Role.ADMIN, "gone"),
                                 MemoryFrames(to_client, from_client))
                await from_server.aclose()  # the client stops reading...
                for request_id in range(1, 4):
                    await to_server.send(encode_request(Propose(
                        request_id, "gone", request_id, encode_put("g", request_id), 2000)))
                await anyio.sleep(0.3)
                await to_server.aclose()  # ...and hangs up
            await client.propose(encode_put("after", 1))


def test_a_command_a_peers_snapshot_applied_is_answered_outcome_unknown_at_once() -> None:
    """Its result went with the state the snapshot replaced: the client hears at once, and
    asks again in its session (whose cached reply the snapshot carries)."""
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    driver = Driver(replica, MemoryStore(), SessionKv(), lambda target, frame: True, Metrics())
    outcomes: list[tuple[bytes | None, Exception | None]] = []
    driver._proposals[7] = _Callback(lambda reply, error: outcomes.append((reply, error)),
                                     0.0, 60.0)
    driver._install_and_apply(Ready(covered=[7, 8]))  # 8: its callback already expired
    assert len(outcomes) == 1 and outcomes[0][0] is None
    assert isinstance(outcomes[0][1], DriverOutcomeUnknown)
    assert "same session" in str(outcomes[0][1]) and not driver._proposals
    assert driver.metrics.counter("driver.commands_covered_by_snapshot") == 1


async def _run_alone(driver: Driver, seconds: float) -> float:
    """Run `driver` (its peers absent) for `seconds`; the seconds it ran."""
    async with anyio.create_task_group() as tasks:
        await tasks.start(driver.run)
        started = anyio.current_time()
        await anyio.sleep(seconds)
        tasks.cancel_scope.cancel()
    return anyio.current_time() - started


def _lone_driver(config: DriverConfig, clock: Callable[[], float] = time.monotonic) -> Driver:
    replica = Replica(ReplicaConfig(replica_id=1, replica_count=3), Prng(1))
    return Driver(replica, MemoryStore(), SessionKv(), lambda target, frame: True, Metrics(),
                  config=config, clock=clock)


async def test_an_idle_driver_sleeps_several_ticks_at_a_time_and_keeps_its_clock() -> None:
    driver = _lone_driver(DriverConfig(tick_ms=20, idle_wake_ticks=8))
    ran_s = await _run_alone(driver, 0.6)
    ticks, wakeups = driver._ticks_done, driver.metrics.counter("driver.wakeups")
    assert ticks >= ran_s / 0.020 - 10  # caught up on every tick it slept through
    assert wakeups <= ticks / 3  # about one in 8


async def test_a_driver_with_a_client_waiting_fails_it_within_a_wake_of_its_deadline() -> None:
    """A command in flight (never committed here: the peers are absent) does not keep the
    driver waking every tick, yet its client hears of the deadline at most one wake-up late."""
    driver = _lone_driver(DriverConfig(tick_ms=20, idle_wake_ticks=4))
    failed_at: list[float] = []
    outcomes: list[Exception | None] = []

    def done(reply: bytes | None, error: Exception | None) -> None:
        failed_at.append(time.monotonic())
        outcomes.append(error)

    submitted = time.monotonic()
    driver.submit(encode_put("k", 1), 0.3, done)
    ran_s = await _run_alone(driver, 0.8)
    ticks, wakeups = driver._ticks_done, driver.metrics.counter("driver.wakeups")
    assert ticks >= ran_s / 0.020 - 10  # caught up on every tick it slept through
    assert wakeups <= ticks / 2  # not every tick, client or not
    assert len(outcomes) == 1 and isinstance(outcomes[0], DriverOutcomeUnknown)
    assert "no result in time" in str(outcomes[0])
    assert 0.3 <= failed_at[0] - submitted < 0.3 + 4 * 0.020 + 0.25  # + a loaded machine


async def test_reads_that_expire_are_cancelled_in_the_core_and_free_their_places() -> None:
    """With no sequencer lease no read can be answered; those that expire must leave the
    core's bounded table, or a fresh read would be refused as Overloaded."""
    replica = Replica(ReplicaConfig(replica_id=1, replica_count=3, reads_pending_max=5), Prng(1))
    driver = Driver(replica, MemoryStore(), SessionKv(), lambda target, frame: True, Metrics(),
                    config=DriverConfig(tick_ms=5))
    expired: list[Exception | None] = []
    fresh: list[Exception | None] = []
    async with anyio.create_task_group() as tasks:
        await tasks.start(driver.run)
        for _ in range(5):
            driver.submit_read(encode_get("k"), 0.05, lambda reply, error: expired.append(error))
        await anyio.sleep(0.3)
        driver.submit_read(encode_get("k"), 10.0, lambda reply, error: fresh.append(error))
        await anyio.sleep(0.2)
        tasks.cancel_scope.cancel()
    assert len(expired) == 5 and all(isinstance(e, DriverOutcomeUnknown) for e in expired)
    assert fresh == [] or isinstance(fresh[0], DriverOutcomeUnknown)  # never Overloaded


def test_a_driver_config_refuses_counts_below_one() -> None:
    for name in ("tick_ms", "idle_wake_ticks", "inputs_max", "inputs_bytes_max", "drain_max"):
        with pytest.raises(ValueError, match=name):
            DriverConfig(**cast(dict[str, Any], {name: 0}))


@pytest.mark.parametrize("sending", [False, True])
async def test_a_sync_yields_to_the_writers_only_when_something_may_leave(
        sending: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages that may leave go to the writers (a yield) before the sync blocks the loop;
    with none, the driver syncs at once rather than letting other tasks run first."""
    events: list[str] = []

    class Store(MemoryStore):
        def sync(self) -> None:
            events.append("sync")

    checkpoint = anyio.lowlevel.checkpoint

    async def yield_noted() -> None:
        events.append("yield")
        await checkpoint()

    monkeypatch.setattr(anyio.lowlevel, "checkpoint", yield_noted)
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    driver = Driver(replica, Store(), SessionKv(), lambda target, frame: True, Metrics())
    messages: list[tuple[int, Message]] = [
        (1, Heartbeat(sender=0, view=0, commit_prefix=0, lease_round=1))]
    await driver._handle(Ready(messages=messages if sending else [],
                               records=[ViewRecord(view=1)], must_sync=True))
    assert events == (["yield", "sync"] if sending else ["sync"])


@pytest.mark.parametrize("origin", [0, 1])
async def test_answers_here_go_before_the_sync_and_peers_commands_apply_after_it(
        origin: int) -> None:
    """A Ready that answers a client here applies first (its answer is not queued behind the
    sync); one that only executes peers' commands sends its acknowledgements after the sync
    first and applies while they travel (an acceptor's apply had delayed every ack)."""
    events: list[str] = []

    class Store(MemoryStore):
        def sync(self) -> None:
            events.append("sync")

    class Machine(SessionKv):
        def apply(self, payload: bytes) -> bytes:
            events.append("apply")
            return super().apply(payload)

    def send(target: int, frame: bytes) -> bool:
        events.append("send")
        return True

    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    driver = Driver(replica, Store(), Machine(), send, Metrics())
    command = Command(origin, 5, encode_envelope(Envelope(
        principal=SCHEDULER, session="s", sequence=1, now_ms=1, body=encode_put("k", 1))))
    if origin == 0:
        driver._proposals[5] = _Callback(lambda reply, error: events.append("answer"), 0.0, 60.0)
    await driver._handle(Ready(
        records=[ViewRecord(view=1)], must_sync=True, executed=[Executed(0, 1, 0, (command,))],
        messages_after_persist=[(1, Heartbeat(sender=0, view=0, commit_prefix=0,
                                              lease_round=1))]))
    assert events == (["apply", "answer", "sync", "send"] if origin == 0 else
                      ["sync", "send", "apply"])


async def test_a_sync_that_compacts_the_log_runs_off_the_event_loop_even_for_one_input() -> None:
    """A lone input is persisted on the loop, sparing two thread hand-offs; but a sync that
    rewrites the whole log (16 MiB or more and the snapshot, with fsyncs) would leave peers and
    clients unserved meanwhile, risking a lease or a view change: it goes to the worker thread.
    The stand-in for a slow compaction waits until something else has run on the loop."""
    served = threading.Event()

    class CompactingStore(MemoryStore):
        def sync(self) -> None:
            assert served.wait(2.0), "nothing else ran on the loop while the log compacted"
            super().sync()

    async def serve() -> None:
        served.set()

    store = CompactingStore(sync_is_long=True)
    driver = Driver(Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0)), store,
                    SessionKv(), lambda target, frame: True, Metrics())
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(serve)  # runs only once the driver lets the loop go
        await driver._handle(Ready(records=[ViewRecord(view=1)], must_sync=True))
    assert store.syncs == 1 and store.records == [ViewRecord(view=1)]


HEARTBEAT_FRAME = encode_messages([Heartbeat(sender=0, view=0, commit_prefix=0, lease_round=1)])


async def _ticks_seen_by_inputs(now: list[float], frames: int, seconds_per_input: float,
                                before: Callable[[], None] = lambda: None) -> list[int]:
    """Run a lone driver on the clock `now[0]`; after `before()`, deliver `frames` heartbeat
    frames at once; each takes `seconds_per_input` of that clock. Returns the driver's tick
    count as each frame reached the core."""
    driver = _lone_driver(DriverConfig(tick_ms=10), clock=lambda: now[0])
    replica = driver.replica
    ticks_at_receive: list[int] = []
    receive = replica.receive

    def noting_receive(frame: bytes, sender: int | None = None) -> None:
        ticks_at_receive.append(driver._ticks_done)
        now[0] += seconds_per_input
        receive(frame, sender)

    replica.receive = noting_receive  # type: ignore[method-assign]
    async with anyio.create_task_group() as tasks:
        await tasks.start(driver.run)
        await anyio.sleep(0.05)
        before()
        for _ in range(frames):
            driver.deliver(0, HEARTBEAT_FRAME)  # one batch: the driver takes them at once
        with anyio.fail_after(5):
            while len(ticks_at_receive) < frames:
                await anyio.sleep(0.01)
        tasks.cancel_scope.cancel()
    return ticks_at_receive


async def test_the_ticks_due_are_caught_up_before_any_input_is_taken() -> None:
    """After a pause (a long sync, a collection, a starved process) the core first counts
    the ticks that passed: a lease is never granted or judged on stale time."""
    now = [0.0]

    def a_second_passes() -> None:  # while the task did not run: 100 ticks
        now[0] = 1.0

    assert await _ticks_seen_by_inputs(now, 1, 0.0, a_second_passes) == [100]


async def test_each_input_of_a_batch_sees_the_ticks_the_inputs_before_it_took() -> None:
    ticks = await _ticks_seen_by_inputs([0.0], 5, 0.010)  # a tick each
    assert ticks == list(range(ticks[0], ticks[0] + 5))


async def test_a_lease_that_runs_out_within_a_batch_of_inputs_grants_no_read_index() -> None:
    """Sequencer 0's lease runs to about tick 37. Inputs taken at once take 0.5 s in all,
    then a read-index request comes: judged on the clock read before the batch, the lease
    looked valid, and a deposed sequencer could have answered a stale read index."""
    now = [0.0]
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    sent: list[Message] = []

    def send(target: int, frame: bytes) -> bool:
        sent.extend(decode_messages(frame))
        return True

    driver = Driver(replica, MemoryStore(), SessionKv(), send, Metrics(),
                    config=DriverConfig(tick_ms=10), clock=lambda: now[0])
    receive = replica.receive

    def slow_receive(frame: bytes, sender: int | None = None) -> None:
        receive(frame, sender)
        now[0] += 0.05  # five ticks an input

    grant = encode_messages([LeaseGrant(sender=1, view=0, lease_round=1)])
    async with anyio.create_task_group() as tasks:
        await tasks.start(driver.run)
        now[0] = 0.02  # heartbeat round 1 went out at tick 1
        await anyio.sleep(0.1)
        driver.deliver(1, grant)
        await anyio.sleep(0.1)
        assert replica._sequencer.lease_valid()
        replica.receive = slow_receive  # type: ignore[method-assign]
        for _ in range(10):
            driver.deliver(1, grant)
        driver.deliver(2, encode_messages([ReadIndexRequest(sender=2, view=0, read_id=1,
                                                            epoch=0)]))
        with anyio.fail_after(5):
            while not any(isinstance(message, ReadIndexReply) for message in sent):
                await anyio.sleep(0.01)
        tasks.cancel_scope.cancel()
    assert [message.executed_upto for message in sent
            if isinstance(message, ReadIndexReply)] == [NO_INDEX]


async def test_a_sequencer_paused_past_its_lease_answers_no_read_on_waking() -> None:
    """Sequencer 0 holds a lease from tick 2 to about 37; a read taken at tick 2, before the
    grant, is granted with it. Had it waited for its resend at tick 27, the driver, held up
    for 10 s (a slow sync on the loop, a stopped process) and replaying the missed ticks one
    by one on waking, would have granted it at the replayed tick 27, under a lease that ran
    out 9.6 s before in real time (the peers may have elected another sequencer and written
    meanwhile)."""
    now = [0.0]
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    driver = Driver(replica, MemoryStore(), SessionKv(), lambda target, frame: True, Metrics(),
                    config=DriverConfig(tick_ms=10), clock=lambda: now[0])
    answers: list[bytes | None] = []
    async with anyio.create_task_group() as tasks:
        await tasks.start(driver.run)
        now[0] = 0.02  # two ticks: heartbeat round 1 goes out at tick 1
        await anyio.sleep(0.1)
        assert replica.inspect.is_sequencer and driver._ticks_done == 2
        driver.submit_read(encode_get("k"), 100.0, lambda reply, error: answers.append(reply))
        await anyio.sleep(0.1)
        assert answers == []  # no lease yet
        driver.deliver(1, encode_messages([LeaseGrant(sender=1, view=0, lease_round=1)]))
        await anyio.sleep(0.1)
        answered_in_lease = len(answers)
        now[0] = 10.02  # held up for 10 s; no input reached it meanwhile
        await anyio.sleep(0.2)
        tasks.cancel_scope.cancel()
    assert driver._ticks_done == 1002
    assert [reply for reply in answers[answered_in_lease:] if reply is not None] == []
    assert answered_in_lease == 1


async def test_a_watch_after_a_restart_never_sees_the_state_before_the_snapshot() -> None:
    """A restarted replica replays its snapshot into the core at once, but its state machine
    gets it only with the first Ready: until then a watch must not answer from the empty
    machine under the snapshot's slot count (a state that never existed at that slot)."""
    before = SessionKv()
    for value in range(5):
        before.apply(encode_envelope(Envelope(
            principal=Principal(Role.SCHEDULER, "tester"), session="s", sequence=value + 1,
            now_ms=0, body=encode_put("k", value))))
    meta = SnapshotMeta(slot=5, exec_counts=(5, 0, 0), o_counts=(5, 0, 0),
                        dedup_low=(0, 0, 0), dedup_tags=((), (), ()))
    replica = Replica.restore(ReplicaConfig(replica_id=0, replica_count=3), Prng(0),
                              [SnapshotRecord(meta, before.snapshot())])
    driver = Driver(replica, MemoryStore(), SessionKv(), lambda target, frame: True, Metrics())
    answers: list[tuple[bytes, int]] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)  # running: the server takes watches from now on
            answers.append(await driver.local_read(encode_get("k"), 0, 2.0))
            answers.append(await driver.local_read(encode_get("k"), 4, 2.0))
            tasks.cancel_scope.cancel()
    assert [(decode_reply(answer), slot) for answer, slot in answers] == [((True, 4), 5)] * 2


@pytest.mark.parametrize("every_bytes", [512, SNAPSHOT_EVERY_BYTES])
async def test_a_replica_snapshots_after_a_period_of_command_bytes_whatever_the_slots(
        every_bytes: int) -> None:
    """Slots alone bound the log in commands, not in bytes: 20,000 slots of 1 MiB batches
    would be 20 GiB, held in memory until the next snapshot. With the slots' period out of
    reach, each replica still snapshots once `snapshot_every_bytes` of commands were applied
    since its last, and its core lets the log below go; with the default period, 40 small
    commands take none."""
    with anyio.fail_after(30):
        async with local_cluster(SessionKv, snapshot_every_slots=10**9,
                                 snapshot_every_bytes=every_bytes) as (cluster, client):
            for index in range(40):
                await client.propose(encode_put(f"key-{index % 2}", index))
            assert decode_reply(await client.read(encode_get("key-1"))) == (True, 39)
            await anyio.sleep(0.2)
            for driver in cluster.drivers:
                taken = driver.metrics.counter("driver.snapshots_taken")
                applied = driver._applied_bytes
                if every_bytes == SNAPSHOT_EVERY_BYTES:
                    assert taken == 0 and driver.replica.inspect.log_base == 0
                else:  # one a period of bytes, give or take the last one
                    assert applied >= 40 * 40
                    assert applied // every_bytes - 1 <= taken <= applied // every_bytes + 1
                    assert driver.replica.inspect.log_base > 0


async def test_a_snapshot_too_large_for_one_log_record_is_not_taken(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One the log could not hold as a record would stop the replica at every start (its peers
    at the same slot): the driver leaves the log uncompacted, says so, and goes on serving."""
    monkeypatch.setattr(driver_module, "SNAPSHOT_STATE_BYTES_MAX", 64)
    with anyio.fail_after(30):
        async with local_cluster(SessionKv) as (cluster, client):
            for index in range(120):  # past the cluster's snapshot_every_slots (50)
                await client.propose(encode_put(f"key-{index}", index))
            assert decode_reply(await client.read(encode_get("key-119"))) == (True, 119)
            await anyio.sleep(0.2)
            for driver in cluster.drivers:
                assert driver.metrics.counter("driver.snapshots_too_large") >= 1
                assert driver.metrics.counter("driver.snapshots_taken") == 0


async def test_a_flood_of_client_commands_does_not_crowd_out_peer_frames() -> None:
    """While the driver is held up (a slow fsync) under client load, clients' commands and
    reads take at most half of the input queue; past that they are refused Overloaded (nothing
    proposed: safe to retry), and peers' frames (acknowledgements, lease grants, heartbeats)
    keep the other half, or the replica's own commands would stop committing."""
    driver = _lone_driver(DriverConfig(inputs_max=64))
    errors: list[Exception | None] = []
    for _ in range(40):
        driver.submit(encode_put("k", 1), 10.0, lambda reply, error: errors.append(error))
        driver.submit_read(encode_get("k"), 10.0, lambda reply, error: errors.append(error))
    # Of the clients' 32 places, the last 16 are node agents' (consensus/runtime/proposal_budget.py)
    assert len(errors) == 80 - 16 and all(isinstance(e, driver_module.Overloaded) for e in errors)
    for _ in range(17):
        driver.submit(encode_put("k", 1), 10.0, lambda reply, error: errors.append(error),
                      reserved=True)
    assert len(errors) == 80 - 16 + 1
    for _ in range(32):
        driver.deliver(0, HEARTBEAT_FRAME)
    assert driver.metrics.counter("driver.frames_dropped_queue_full") == 0
    driver.deliver(0, HEARTBEAT_FRAME)  # the whole queue is full now
    assert driver.metrics.counter("driver.frames_dropped_queue_full") == 1
    await driver._next_inputs()  # the driver takes them: clients have their places back
    refused = driver.metrics.counter("driver.proposals_refused")
    driver.submit(encode_put("k", 2), 10.0, lambda reply, error: errors.append(error))
    assert driver.metrics.counter("driver.proposals_refused") == refused


def test_peer_frames_waiting_for_the_driver_are_bounded_in_bytes() -> None:
    """A driver held up (a slow fsync, a long compaction) while peers keep sending: the mesh
    hands it every frame it reads, with no back-pressure on the sockets. At the frame cap of
    8 MiB, 65,536 frames waiting would be 512 GiB: past `inputs_bytes_max` frames are dropped
    and counted as when the queue is full (the protocol resends what matters)."""
    driver = _lone_driver(DriverConfig())
    frame = bytes(8 << 20)  # the mesh's default frame cap; one object, held once
    for _ in range(1024):
        driver.deliver(0, frame)
    queued = driver.config.inputs_bytes_max // len(frame)
    assert len(driver._inbox) == queued == 32
    assert driver.metrics.counter("driver.frames_dropped_queue_full") == 1024 - queued


async def test_a_long_suspend_replays_a_bounded_number_of_ticks() -> None:
    """A sequencer resumed after 1,000 s (100,000 ticks of 10 ms) replays the last
    TICKS_REPLAYED_MAX of them; the clock passes over the rest at once. Replayed one by one, a
    day's suspend took seconds of the loop and queued a heartbeat for every tenth tick."""
    now = [0.0]
    config = ReplicaConfig(replica_id=0, replica_count=3)
    replica = Replica(config, Prng(0))
    sent: list[bytes] = []

    def send(target: int, frame: bytes) -> bool:
        sent.append(frame)
        return True

    driver = Driver(replica, MemoryStore(), SessionKv(), send, Metrics(),
                    config=DriverConfig(tick_ms=10), clock=lambda: now[0])
    replayed = [0]
    tick = replica.tick

    def counted_tick() -> None:
        replayed[0] += 1
        tick()

    replica.tick = counted_tick  # type: ignore[method-assign]
    async with anyio.create_task_group() as tasks:
        await tasks.start(driver.run)
        now[0] = 0.02
        await anyio.sleep(0.1)
        assert replica.inspect.is_sequencer and driver._ticks_done == 2
        replayed[0], heartbeats_before = 0, len(sent)
        now[0] = 1000.02  # suspended for 1,000 s
        await anyio.sleep(0.2)
        tasks.cancel_scope.cancel()
    assert driver._ticks_done == 100_002 and replica.inspect.now == 100_002
    assert replayed[0] == TICKS_REPLAYED_MAX
    assert driver.metrics.counter("driver.ticks_passed") == 100_000 - TICKS_REPLAYED_MAX
    heartbeat_rounds = TICKS_REPLAYED_MAX // config.heartbeat_ticks
    assert len(sent) - heartbeats_before <= 2 * (heartbeat_rounds + 1)


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="CLOCK_BOOTTIME is Linux's")
def test_ticks_count_the_time_a_suspended_machine_slept() -> None:
    """CLOCK_MONOTONIC stops while the machine is suspended: a resumed sequencer would count
    its lease from before the suspend while its peers, counting it all, elected another."""
    boottime_s = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert abs(TICK_CLOCK() - boottime_s) < 1.0
    assert inspect.signature(Driver).parameters["clock"].default is TICK_CLOCK
