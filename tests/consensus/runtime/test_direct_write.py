"""A frame writer on anyio's asyncio backend writes without anyio's awaits (consensus/runtime/
direct_write.py): the frames arrive whole and in order over TLS, a full transport is waited
for, a paused, closed or broken stream and an SSL object of another class are left to anyio's
way, and trio's streams never take
the short way. On asyncio and uvloop, and trio, over loopback TLS."""

from __future__ import annotations

import ssl
from typing import Any

import anyio
import pytest
from anyio.abc import ByteStream

from consensus.runtime.direct_read import direct_read
from consensus.runtime.direct_write import direct_write
from consensus.runtime.framing import FrameReader, FrameWriter, Metrics
from tests.consensus.runtime.tls_loopback import (
    ASYNCIO_BACKENDS,
    all_backends,  # noqa: F401  (fixture)
    exchange,
    on_asyncio,
    tls_pair_fixture,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.anyio
FRAME_BYTES_MAX = 4 << 20


async def test_frames_arrive_whole_and_in_order(
        tls_pair: tuple[ByteStream, ByteStream], anyio_backend: tuple[str, dict[str, Any]]
) -> None:
    dialed, accepted = tls_pair
    writer = FrameWriter(dialed, frame_bytes_max=FRAME_BYTES_MAX, metrics=Metrics())
    assert (direct_write(dialed) is not None) == on_asyncio(anyio_backend)
    reader = FrameReader(accepted, frame_bytes_max=FRAME_BYTES_MAX)
    batches = [[bytes([index % 251]) * size for size in (1, 17, index * 97, 300 << index % 3)]
               for index in range(60)]
    sent = [frame for batch in batches for frame in batch]
    received = await exchange(writer, reader, batches)
    assert received == sent
    assert writer.metrics["transport.frames_sent"] == len(sent)
    assert writer.metrics["transport.writes"] == len(batches)


async def test_a_full_transport_is_waited_for(
        tls_pair: tuple[ByteStream, ByteStream]) -> None:
    """A reader that starts late: writes of megabytes fill the socket buffers, the writer
    waits for them to drain, and every byte arrives."""
    dialed, accepted = tls_pair
    writer = FrameWriter(dialed, frame_bytes_max=FRAME_BYTES_MAX, metrics=Metrics())
    reader = FrameReader(accepted, frame_bytes_max=FRAME_BYTES_MAX)
    sent = [bytes([index]) * (1 << 20) for index in range(24)]
    received = await exchange(writer, reader, [[frame] for frame in sent], read_after_s=0.2)
    assert received == sent


@pytest.mark.parametrize("anyio_backend", ASYNCIO_BACKENDS, indirect=True)
async def test_a_paused_transport_is_left_to_anyio(
        tls_pair: tuple[ByteStream, ByteStream]) -> None:
    dialed, accepted = tls_pair
    direct = direct_write(dialed)
    assert direct is not None
    protocol = dialed.transport_stream._protocol  # type: ignore[attr-defined]
    protocol.write_event.clear()  # as the transport's pause_writing does
    assert direct.paused
    assert not direct.write(b"held")
    protocol.write_event.set()
    assert direct.write(b"\x00\x00\x00\x02ok")
    reader = FrameReader(accepted, frame_bytes_max=FRAME_BYTES_MAX)
    assert await reader.receive() == b"ok"  # only the second write reached the wire


async def test_a_closed_stream_raises_as_before(
        tls_pair: tuple[ByteStream, ByteStream]) -> None:
    dialed, _ = tls_pair
    writer = FrameWriter(dialed, frame_bytes_max=FRAME_BYTES_MAX, metrics=Metrics())
    await anyio.aclose_forcefully(dialed)
    direct = direct_write(dialed)
    assert direct is None or not direct.write(b"late")
    with pytest.raises((anyio.ClosedResourceError, anyio.BrokenResourceError)):
        await writer.send(b"late")
    assert writer.metrics["transport.writes"] == 0


async def test_a_memory_stream_goes_anyio_s_way() -> None:
    send, receive = anyio.create_memory_object_stream[bytes](4)
    async with send, receive:
        assert direct_write(send) is None


@pytest.mark.parametrize("anyio_backend", ASYNCIO_BACKENDS, indirect=True)
async def test_an_ssl_object_of_another_class_goes_anyio_s_way(
        tls_pair: tuple[ByteStream, ByteStream]) -> None:
    """The short ways call the C read and write an `ssl.SSLObject` wraps; an SSL object whose
    class changes `read` or `write` (a context's `sslobject_class`) is left to anyio, which
    calls its methods, and the frames still arrive."""
    calls: list[str] = []

    class Recording(ssl.SSLObject):
        def read(self, len: int = 1024, buffer: Any = None) -> Any:
            calls.append("read")
            return super().read(len, buffer)

        def write(self, data: Any) -> int:
            calls.append("write")
            return super().write(data)

    dialed, accepted = tls_pair
    for stream in (dialed, accepted):
        stream._ssl_object.__class__ = Recording  # type: ignore[attr-defined]
        assert direct_write(stream) is None and direct_read(stream) is None
    writer = FrameWriter(dialed, frame_bytes_max=FRAME_BYTES_MAX, metrics=Metrics())
    reader = FrameReader(accepted, frame_bytes_max=FRAME_BYTES_MAX)
    assert not writer.writes_now
    received = await exchange(writer, reader, [[b"one", b"two"], [b"three"]])
    assert received == [b"one", b"two", b"three"]
    assert "read" in calls and "write" in calls
