"""A frame reader on anyio's asyncio backend reads without anyio's awaits (consensus/runtime/
direct_read.py): the same frames arrive over TLS and plain TCP, split across many chunks or
many to a chunk; a reader far behind its writer holds at most the bound plus one chunk, with
the transport paused; EOF, truncation and an abrupt close raise what they raised before; a
reader cancelled while waiting loses nothing; anyio's own receive still works beside it; and
trio's streams never take the short way. On asyncio and uvloop, and trio, over loopback."""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from anyio.abc import ByteStream, SocketAttribute
from anyio.streams.tls import TLSStream

from consensus.runtime.direct_read import RECEIVE_QUEUE_BYTES_MAX, DirectRead, direct_read
from consensus.runtime.framing import FrameReader, FrameWriter, Metrics, TruncatedFrame
from tests.consensus.runtime.tls_loopback import (
    ASYNCIO_BACKENDS,
    all_backends,  # noqa: F401  (fixture)
    exchange,
    on_asyncio,
    tls_connection,
    tls_pair_fixture,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.anyio
FRAME_BYTES_MAX = 4 << 20
READ_CHUNK_BYTES_MAX = 256 << 10  # the most one transport read hands the protocol


@pytest.fixture(params=["tls", "tcp"])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[tuple[ByteStream, ByteStream]]:
    """(dialer's stream, listener's stream) over loopback TCP, with TLS or without."""
    async with tls_connection(tls=request.param == "tls") as streams:
        yield streams


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def socket_of(stream: ByteStream) -> Any:
    return stream.transport_stream if isinstance(stream, TLSStream) else stream


async def test_frames_arrive_whole_and_in_order(
        pair: tuple[ByteStream, ByteStream], anyio_backend: tuple[str, dict[str, Any]]
) -> None:
    """Frames of one byte to a megabyte (split across many chunks), and batches of small
    ones (many to a chunk)."""
    dialed, accepted = pair
    assert (direct_read(accepted) is not None) == on_asyncio(anyio_backend)
    writer = FrameWriter(dialed, frame_bytes_max=FRAME_BYTES_MAX, metrics=Metrics())
    reader = FrameReader(accepted, frame_bytes_max=FRAME_BYTES_MAX)
    batches = [[bytes([index % 251]) * size for size in (1, 17, index * 97, 300 << index % 3)]
               for index in range(40)]
    batches += [[bytes([index]) * (1 << 20)] for index in range(4)]
    batches += [[bytes([index % 256, 7]) for index in range(2000)]]
    sent = [payload for batch in batches for payload in batch]
    received = await exchange(writer, reader, batches)
    assert received == sent


@pytest.mark.parametrize("anyio_backend", ASYNCIO_BACKENDS, indirect=True)
async def test_a_reader_far_behind_holds_a_bounded_queue(
        pair: tuple[ByteStream, ByteStream]) -> None:
    """A writer megabytes ahead: the transport is paused once the queue passes the bound,
    the queue never holds more than the bound plus one chunk, and every frame arrives."""
    dialed, accepted = pair
    reader = FrameReader(accepted, frame_bytes_max=FRAME_BYTES_MAX)
    direct = direct_read(accepted)
    assert direct is not None
    transport = socket_of(accepted)._transport
    sent = [bytes([index % 256]) * 1000 for index in range(8000)]  # 8 MB
    received: list[bytes] = []
    peak_bytes = 0
    paused = False

    async def write_all() -> None:
        writer = FrameWriter(dialed, frame_bytes_max=FRAME_BYTES_MAX, metrics=Metrics())
        for start in range(0, len(sent), 100):
            await writer.send_many(sent[start:start + 100])

    async with anyio.create_task_group() as group:
        group.start_soon(write_all)
        received.append(await reader.receive())  # reading is on from here
        for _ in range(200):  # the reader sleeps while the loop reads for it
            await anyio.sleep(0.002)
            peak_bytes = max(peak_bytes, direct.queued_bytes)
            paused = paused or not transport.is_reading()
        assert paused
        while len(received) < len(sent):
            received.extend(await reader.receive_batch())
            peak_bytes = max(peak_bytes, direct.queued_bytes)
    assert received == sent
    assert 0 < peak_bytes <= RECEIVE_QUEUE_BYTES_MAX + READ_CHUNK_BYTES_MAX


@pytest.mark.parametrize("anyio_backend", ASYNCIO_BACKENDS, indirect=True)
async def test_no_read_is_made_that_can_only_want_more_bytes(
        tls_pair: tuple[ByteStream, ByteStream]) -> None:
    """Frames sent one record at a time are each read by one `SSLObject.read` that gives
    data: the reader takes a chunk before reading, never reading an empty BIO for the
    SSLWantReadError it would raise. A record split across chunks still wants more bytes
    after its first piece, and arrives whole."""
    dialed, accepted = tls_pair
    reader = FrameReader(accepted, frame_bytes_max=FRAME_BYTES_MAX)
    direct = direct_read(accepted)
    assert isinstance(direct, DirectRead) and direct._read is not None
    reader._direct = direct
    outcomes: list[str] = []
    read = direct._read

    def counted_read(max_bytes: int) -> bytes:
        try:
            data = read(max_bytes)
        except ssl.SSLWantReadError:
            outcomes.append("wants")
            raise
        outcomes.append("data")
        return data

    direct._read = counted_read
    for index in range(30):
        await dialed.send(frame(bytes([index]) * 40))
        assert await reader.receive() == bytes([index]) * 40
    assert outcomes == ["data"] * 30
    outcomes.clear()
    raw_stream = socket_of(dialed)
    tls_object = dialed._ssl_object  # type: ignore[attr-defined]
    tls_object.write(frame(b"split"))
    sealed = dialed._write_bio.read()  # type: ignore[attr-defined]
    received: list[bytes] = []

    async def receive() -> None:
        received.append(await reader.receive())

    async with anyio.create_task_group() as group:
        group.start_soon(receive)
        await raw_stream.send(sealed[:9])
        await anyio.sleep(0.01)
        await raw_stream.send(sealed[9:])
    assert received == [b"split"]
    assert outcomes == ["wants", "data"]


async def test_eof_between_frames_ends_the_stream(
        pair: tuple[ByteStream, ByteStream]) -> None:
    dialed, accepted = pair
    reader = FrameReader(accepted, frame_bytes_max=FRAME_BYTES_MAX)
    await dialed.send(frame(b"last"))
    async with anyio.create_task_group() as group:
        group.start_soon(dialed.aclose)  # over TLS: close_notify, then awaits the answer
        assert await reader.receive() == b"last"
        with pytest.raises(anyio.EndOfStream):
            await reader.receive()
        group.cancel_scope.cancel()


async def test_eof_inside_a_frame_is_a_truncated_frame(
        pair: tuple[ByteStream, ByteStream]) -> None:
    dialed, accepted = pair
    reader = FrameReader(accepted, frame_bytes_max=FRAME_BYTES_MAX)
    await dialed.send(frame(b"whole") + frame(b"cut short")[:7])
    async with anyio.create_task_group() as group:
        group.start_soon(dialed.aclose)  # over TLS: close_notify, then awaits the answer
        assert await reader.receive() == b"whole"
        with pytest.raises(TruncatedFrame):
            await reader.receive()
        group.cancel_scope.cancel()


async def test_an_abrupt_close_raises_as_before(
        pair: tuple[ByteStream, ByteStream]) -> None:
    """The peer resets the connection: over TLS that is BrokenResourceError, as with anyio's
    own receive; over plain TCP anyio's asyncio backend calls it the end of the stream, and
    trio a broken resource."""
    dialed, accepted = pair
    reader = FrameReader(accepted, frame_bytes_max=FRAME_BYTES_MAX)
    await dialed.send(frame(b"before"))
    assert await reader.receive() == b"before"
    raw: socket.socket = dialed.extra(SocketAttribute.raw_socket)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await anyio.aclose_forcefully(dialed)  # a reset, without close_notify
    errors = (anyio.BrokenResourceError, anyio.EndOfStream, TruncatedFrame)
    with pytest.raises(errors) as raised:
        await reader.receive()
    if isinstance(accepted, TLSStream):
        assert raised.type is anyio.BrokenResourceError


async def test_reading_a_closed_stream_raises_as_before(
        pair: tuple[ByteStream, ByteStream]) -> None:
    _, accepted = pair
    reader = FrameReader(accepted, frame_bytes_max=FRAME_BYTES_MAX)
    await anyio.aclose_forcefully(accepted)
    with pytest.raises((anyio.ClosedResourceError, anyio.BrokenResourceError)):
        await reader.receive()


async def test_a_reader_cancelled_while_waiting_loses_nothing(
        pair: tuple[ByteStream, ByteStream]) -> None:
    dialed, accepted = pair
    reader = FrameReader(accepted, frame_bytes_max=FRAME_BYTES_MAX)
    for index in range(20):
        with anyio.move_on_after(0.005) as scope:
            await reader.receive()
        assert scope.cancelled_caught
        await dialed.send(frame(bytes([index])) + frame(b"half")[:5])  # a frame and a piece
        assert await reader.receive() == bytes([index])
        with anyio.move_on_after(0.005):
            await reader.receive()  # cancelled with a piece of a frame held
        await dialed.send(frame(b"half")[5:])
        assert await reader.receive() == b"half"
    if direct_read(accepted) is not None:  # it waits on the protocol's event: none is left
        assert not socket_of(accepted)._protocol.read_event._waiters


@pytest.mark.parametrize("anyio_backend", ASYNCIO_BACKENDS, indirect=True)
async def test_anyio_s_own_receive_still_works_beside_it(
        pair: tuple[ByteStream, ByteStream]) -> None:
    """anyio's receive, called on the same stream between direct reads, pauses the transport
    after it; the direct reader resumes it when it must wait, and the bytes stay in order."""
    dialed, accepted = pair
    direct = direct_read(accepted)
    assert isinstance(direct, DirectRead)
    transport = socket_of(accepted)._transport
    expected = b"".join(bytes([index]) * 300 for index in range(60))
    got = bytearray()

    async def read_all() -> None:
        for turn in range(10 ** 6):
            if len(got) == len(expected):
                return
            want = len(expected) - len(got)
            got.extend(await (direct.receive(min(want, 1000)) if turn % 2
                              else accepted.receive(min(want, 1000))))

    async with anyio.create_task_group() as group:
        group.start_soon(read_all)
        for index in range(60):
            await dialed.send(bytes([index]) * 300)
            await anyio.sleep(0.001)
    assert bytes(got) == expected
    with anyio.move_on_after(0.01):
        await direct.receive(10)  # waiting: reading was resumed
    assert transport.is_reading()
    await accepted.send(b"x")  # and the stream still writes
    assert await dialed.receive() == b"x"


async def test_a_memory_stream_goes_anyio_s_way() -> None:
    send, receive = anyio.create_memory_object_stream[bytes](4)
    async with send, receive:
        assert direct_read(receive) is None
