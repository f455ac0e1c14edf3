"""The driver hands the core's outputs over as `consensus.ready` demands: after-persist messages
leave only once the records are synced, then `advance`; nothing after a failed sync, which
stops the replica. On the loop and in the worker thread, with and without compaction. And
what the runtime puts around the core must not stop it: a promise over instances of full
batches fits the peer mesh's frame cap (the mesh had dropped it, and a recovery never got
its majority); the 2**32-th proposal of one life starts a new epoch (an assert had stopped
the driver); a snapshot record (the whole state) is written off the event loop."""

from __future__ import annotations

import errno
import pathlib
import threading
from collections.abc import Sequence

import anyio
import pytest

from consensus.codec import decode_messages
from consensus.command_log import initial_ballot, next_ballot
from consensus.config import ReplicaConfig
from consensus.leader import TAG_COUNTER_BITS
from consensus.messages import CAccept, Command, CPrepare, Heartbeat, Message, SnapshotMeta
from consensus.prng import Prng
from consensus.ready import Ready
from consensus.records import Record, SnapshotRecord, ViewRecord
from consensus.replica import Replica
from consensus.runtime.driver import Driver, DriverConfig
from consensus.runtime.framing import FRAMES_DROPPED_OVERSIZED
from consensus.runtime.metrics import Metrics
from consensus.runtime.node_config import LIMIT_DEFAULTS
from consensus.runtime.peers import PeerMesh
from consensus.runtime.storage_errors import StorageFailed
from tests.consensus.runtime.kv_machine import SessionKv

pytestmark = pytest.mark.anyio

BEFORE = Heartbeat(sender=0, view=0, commit_prefix=0, lease_round=1)
AFTER = Heartbeat(sender=0, view=0, commit_prefix=0, lease_round=2)


class Store:
    def __init__(self, events: list[str], *, fail: bool = False,
                 sync_is_long: bool = False) -> None:
        self.events = events
        self.fail = fail
        self.sync_is_long = sync_is_long

    def append(self, records: Sequence[Record]) -> None:
        self.events.append(f"append:{threading.current_thread() is threading.main_thread()}")

    def sync(self) -> None:
        self.events.append(f"sync:{threading.current_thread() is threading.main_thread()}")
        if self.fail:
            raise StorageFailed(pathlib.Path("x"), "fdatasync", OSError(errno.EIO, "EIO"))


class Recording(Replica):
    events: list[str]

    def advance(self) -> None:
        self.events.append("advance")
        super().advance()


def _driver(events: list[str], **store: bool) -> Driver:
    replica = Recording(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    replica.events = events

    def send(peer: int, frame: bytes) -> bool:
        for message in decode_messages(frame):
            assert isinstance(message, Heartbeat)
            events.append(f"send:{message.lease_round}")
        return True

    return Driver(replica, Store(events, **store), SessionKv(), send, Metrics())


def _ready() -> Ready:
    messages: list[tuple[int, Message]] = [(1, BEFORE)]
    after: list[tuple[int, Message]] = [(1, AFTER)]
    return Ready(records=[ViewRecord(view=1)], must_sync=True, messages=messages,
                 messages_after_persist=after)


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize("compacting", [False, True])
async def test_after_persist_messages_leave_only_after_the_sync(threaded: bool,
                                                                compacting: bool) -> None:
    events: list[str] = []
    driver = _driver(events, sync_is_long=compacting)
    driver._inputs_last_turn = 2 if threaded else 1
    await driver._handle(_ready())
    assert events.index("send:1") < events.index("send:2")
    sync = next(i for i, e in enumerate(events) if e.startswith("sync"))
    assert sync < events.index("send:2") < events.index("advance")


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize("compacting", [False, True])
async def test_a_failed_sync_sends_nothing_that_promised_it_and_stops(threaded: bool,
                                                                      compacting: bool) -> None:
    events: list[str] = []
    driver = _driver(events, fail=True, sync_is_long=compacting)
    driver._inputs_last_turn = 2 if threaded else 1
    with pytest.raises(StorageFailed):
        await driver._handle(_ready())
    assert "send:2" not in events and "advance" not in events


async def test_a_replica_serves_on_after_four_billion_proposals_in_one_life() -> None:
    """The command tag is epoch << 32 | counter, and the counter is never renewed within a
    life: the 2**32-th proposal of a process trips an assert inside the driver's task, which
    stops the replica (every replica with a similar load at about the same time). The driver
    should refuse the command (or the core start a new epoch), not die."""
    replica = Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    replica._leader._counter = (1 << TAG_COUNTER_BITS) - 2  # a long life, fast-forwarded
    driver = Driver(replica, Store([]), SessionKv(), lambda peer, frame: True, Metrics(),
                    config=DriverConfig(tick_ms=5))
    outcomes: list[Exception | None] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            await tasks.start(driver.run)
            for _ in range(2):
                driver.submit(b"x", 0.2, lambda reply, error: outcomes.append(error))
            await anyio.sleep(0.5)
            assert driver.running, "the driver died on the tag counter"
            tasks.cancel_scope.cancel()


def test_a_promise_over_instances_of_full_batches_reaches_the_recoverer() -> None:
    """An acceptor answers a recovery's (or a retaking owner's) C-prepare with every instance
    it holds from `from_index`, up to `fetch_instances_max` (256) of them, with no bound on
    their bytes; each instance may hold `batch_bytes_max` (1 MiB) of commands. Twelve full
    instances make a CPromise over the peer mesh's frame cap (8 MiB, the node's default and
    floor), which the mesh drops, every time it is resent: the round never gets its majority
    and execution, everywhere, waits on that space for ever. (FetchReply is bounded in bytes
    for exactly this reason, catchup.py.)"""
    config = ReplicaConfig(replica_id=1, replica_count=3)
    acceptor = Replica(config, Prng(1))
    payload = b"p" * (config.batch_bytes_max // 8 - 64)
    for index in range(12):  # a loaded leader's full batches, accepted here, then it crashed
        batch = tuple(Command(0, index * 8 + n, payload) for n in range(8))
        acceptor.step(CAccept(0, 0, 0, index, initial_ballot(0), batch))
    handed = acceptor.ready()
    acceptor.advance()
    assert handed.records  # accepted
    acceptor.step(CPrepare(2, 0, 0, 0, next_ballot(initial_ballot(0), 2)))
    ready = acceptor.ready()
    assert [type(m).__name__ for _, m in ready.messages_after_persist] == ["CPromise"]

    mesh = PeerMesh(1, ("127.0.0.1", 0), {0: ("127.0.0.1", 1), 2: ("127.0.0.1", 2)}, None,
                    on_frame=lambda sender, frame: None, insecure=True,
                    frame_bytes_max=LIMIT_DEFAULTS["frame_bytes_max"])
    driver = Driver(acceptor, Store([]), SessionKv(), mesh.send, Metrics())
    driver._send_messages(ready.messages_after_persist)
    assert mesh.metrics[FRAMES_DROPPED_OVERSIZED] == 0, "the promise was dropped as oversized"
    assert mesh.queued(2) == 1


async def test_a_large_snapshot_record_is_written_off_the_event_loop() -> None:
    """The driver sends a compacting sync to the worker thread so that a whole-log rewrite
    never leaves peers and clients unserved; but the snapshot record itself (the state
    machine's whole state, up to ~1 GiB; the KV machine holds up to 512 MiB), appended and
    fdatasync'ed in the Ready after `compact` or after an install, is written on the loop
    whenever the last turn took at most one input (a tick-only wake-up: the common case right
    after `compact`, which no input precedes). Seconds of a blocked loop, against a 400 ms
    lease. The stand-in sync waits until something else has run on the loop."""
    served = threading.Event()

    class SlowStore(Store):
        # as DurableLog: encoding, MAC and write of 64 MiB took 0.29 s here, the fdatasync
        # 0.42 s; the sync goes to the thread when it compacts (usually so at a new snapshot),
        # the append never does
        def append(self, records: Sequence[Record]) -> None:
            assert served.wait(2.0), "nothing else ran on the loop while the snapshot was written"

        def sync(self) -> None:
            assert served.wait(2.0), "nothing else ran on the loop while the snapshot synced"

    async def serve() -> None:
        served.set()

    meta = SnapshotMeta(slot=5, exec_counts=(5, 0, 0), o_counts=(5, 0, 0), dedup_low=(0, 0, 0),
                        dedup_tags=((), (), ()))
    driver = Driver(Replica(ReplicaConfig(replica_id=0, replica_count=3), Prng(0)),
                    SlowStore([], sync_is_long=True), SessionKv(), lambda target, frame: True,
                    Metrics())
    driver._inputs_last_turn = 0  # the Ready right after compact(): no input since
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(serve)
        await driver._handle(Ready(records=[SnapshotRecord(meta, b"s" * (64 << 20))],
                                   must_sync=True))
