"""A frame is written by the task that makes it while its connection's writer sleeps with
nothing queued (consensus/runtime/write_through.py): at once, before the producer yields; only
the first of a turn of the loop, the rest merged by the writer as before; never ahead of a
frame already queued; queued as before where the transport cannot take it now, and on trio.
Over loopback TLS (the client's and server's outbox, a peer's outbox) and with stub writers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from anyio.abc import ByteStream

from consensus.runtime.framing import FRAMES_SENT, WRITES, FramedConnection, Metrics
from consensus.runtime.outbox import Outbox
from consensus.runtime.peers import Outbox as PeerOutbox
from consensus.runtime.write_through import write_through
from tests.consensus.runtime.tls_loopback import (
    ALL_BACKENDS,
    ASYNCIO_BACKENDS,
    all_backends,  # noqa: F401  (fixture)
    on_asyncio,
    tls_pair_fixture,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.anyio
FRAME_BYTES_MAX = 1 << 20


async def _writer_asleep() -> None:
    for _ in range(5):  # the writer task runs up to its sleep
        await anyio.lowlevel.checkpoint()


async def _receive(connection: FramedConnection, count: int) -> list[bytes]:
    with anyio.fail_after(10):
        return [await connection.receive() for _ in range(count)]


async def test_a_frame_leaves_before_its_producer_yields(
        tls_pair: tuple[ByteStream, ByteStream], anyio_backend: tuple[str, dict[str, Any]]
) -> None:
    dialed, accepted = tls_pair
    metrics = Metrics()
    sending = FramedConnection(dialed, frame_bytes_max=FRAME_BYTES_MAX, metrics=metrics)
    receiving = FramedConnection(accepted, frame_bytes_max=FRAME_BYTES_MAX, metrics=Metrics())
    written: list[tuple[int, int]] = []
    outbox = Outbox(sending, on_written=lambda frames, size: written.append((frames, size)))
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(outbox.run)
        await _writer_asleep()
        outbox.put(b"first")
        # on asyncio it is written (and reported) right here; on trio it waits for the writer
        assert (metrics[WRITES], written) == ((1, [(1, 5)]) if on_asyncio(anyio_backend)
                                              else (0, []))
        assert await _receive(receiving, 1) == [b"first"]
        await _writer_asleep()
        outbox.put(b"second")  # a later turn of the loop: written at once again
        assert metrics[WRITES] == (2 if on_asyncio(anyio_backend) else metrics[WRITES])
        assert await _receive(receiving, 1) == [b"second"]
        tasks.cancel_scope.cancel()
    assert written == [(1, 5), (1, 6)]


@pytest.mark.parametrize("anyio_backend", ASYNCIO_BACKENDS, indirect=True)
async def test_the_rest_of_a_turn_is_merged_by_the_writer(
        tls_pair: tuple[ByteStream, ByteStream]) -> None:
    dialed, accepted = tls_pair
    metrics = Metrics()
    sending = FramedConnection(dialed, frame_bytes_max=FRAME_BYTES_MAX, metrics=metrics)
    receiving = FramedConnection(accepted, frame_bytes_max=FRAME_BYTES_MAX, metrics=Metrics())
    outbox = Outbox(sending)
    frames = [b"frame %d" % index for index in range(50)]
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(outbox.run)
        await _writer_asleep()
        for frame in frames:  # one turn: the first leaves now, the others queue
            outbox.put(frame)
        assert (metrics[WRITES], metrics[FRAMES_SENT]) == (1, 1)
        assert await _receive(receiving, 50) == frames
        assert (metrics[WRITES], metrics[FRAMES_SENT]) == (2, 50)  # 49 in one write
        tasks.cancel_scope.cancel()


class StubWriter:
    """A connection whose `write_now` takes frames only while `takes` (a paused transport
    when not), recording how each frame left."""

    frame_bytes_max = FRAME_BYTES_MAX

    def __init__(self) -> None:
        self.takes = True
        self.left: list[tuple[str, bytes]] = []

    def write_now(self, frames: Sequence[bytes]) -> bool:
        if self.takes:
            self.left.extend(("now", frame) for frame in frames)
        return self.takes

    async def send(self, frame: bytes) -> None:
        await self.send_many((frame,))

    async def send_many(self, frames: Sequence[bytes]) -> None:
        self.left.extend(("writer", frame) for frame in frames)
        await anyio.sleep(0.01)  # a slow write: more frames queue meanwhile

    async def receive(self) -> bytes:
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("anyio_backend", ASYNCIO_BACKENDS, indirect=True)
async def test_never_ahead_of_a_queued_frame_nor_through_a_paused_transport() -> None:
    stub = StubWriter()
    outbox = Outbox(stub)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(outbox.run)
        await _writer_asleep()
        stub.takes = False  # paused: queued, and written by the writer
        outbox.put(b"a")
        stub.takes = True  # the transport takes data again before the writer ran
        outbox.put(b"a2")  # the writer still sleeps, the gate is open, but "a" waits
        await anyio.lowlevel.checkpoint()  # the writer takes them and is writing
        outbox.put(b"b")  # the writer is busy: queued behind
        await anyio.sleep(0.05)
        await _writer_asleep()
        outbox.put(b"c")
        tasks.cancel_scope.cancel()
    assert stub.left == [("writer", b"a"), ("writer", b"a2"), ("writer", b"b"), ("now", b"c")]


@pytest.mark.parametrize("anyio_backend", ASYNCIO_BACKENDS, indirect=True)
async def test_a_peer_outbox_writes_through_its_waiting_writer_only() -> None:
    stub = StubWriter()
    outbox = PeerOutbox(frames_max=10, bytes_max=1000)
    through = write_through(stub.write_now)
    assert outbox.push(b"queued")  # no writer waits: queued
    assert len(outbox) == 1
    taken: list[list[bytes]] = []

    async def writer() -> None:
        while True:
            await outbox.wait(through)
            taken.append(outbox.take(10, 1000))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(writer)
        await _writer_asleep()
        assert taken == [[b"queued"]] and len(outbox) == 0
        assert outbox.push(b"now") and outbox.push(b"same turn")
        assert stub.left == [("now", b"now")] and len(outbox) == 1
        await _writer_asleep()
        assert taken == [[b"queued"], [b"same turn"]]
        tasks.cancel_scope.cancel()
    assert outbox.push(b"writer gone") and len(outbox) == 1  # queued for the next connection


@pytest.mark.parametrize("anyio_backend", [ALL_BACKENDS[-1]], indirect=True)  # trio
async def test_no_gate_off_an_asyncio_loop() -> None:
    assert write_through(None) is None
    assert write_through(StubWriter().write_now) is None  # not in a running asyncio loop


def test_write_through_needs_a_running_loop() -> None:
    loop = asyncio.new_event_loop()
    try:
        async def made() -> bool:
            return write_through(StubWriter().write_now) is not None
        assert loop.run_until_complete(made())
    finally:
        loop.close()
