"""Length-prefixed frames over a byte stream, with a size cap and merged writes.

A frame on the wire is a 4-byte big-endian payload length followed by the payload. The transport
only frames: what a payload means is the core's business (`consensus.codec` decodes and
validates it).

- `FrameDecoder` is the sans-IO part: bytes in, whole frames out. A declared length above the
  cap raises `FrameTooLarge` before any of the payload is buffered, so a peer cannot make us
  hold more than one capped frame plus one read. There is no way to find the next frame boundary
  after a bad length, so the connection must then be closed.
- `FrameReader` and `FrameWriter` put it on an anyio byte stream. The reader hands out every
  frame one read brought (`receive_batch`), the writer joins many frames into one `send`
  (merged flushing: one write, one TLS record batch, one system call for a batch of small
  messages), so the per-frame cost stays a few Python operations. On anyio's asyncio
  backend the writer writes without anyio's awaits while the transport takes data (the same
  bytes: consensus/runtime/direct_write.py), and the reader reads without them, leaving the
  transport reading between reads (the same bytes: consensus/runtime/direct_read.py).
- `FramedConnection` is both over one stream, as handed to the client listener's handlers.

The counter names every transport module uses are defined here, so they are spelled once.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Iterable, Sequence

import anyio
import anyio.abc

from consensus.errors import ConsensusError
from consensus.runtime.direct_read import direct_read
from consensus.runtime.direct_write import direct_write
from consensus.runtime.write_through import WriteNow

HEADER = struct.Struct(">I")
HEADER_BYTES = HEADER.size
FRAME_BYTES_LIMIT = (1 << 32) - 1  # what a 4-byte length can say
RECEIVE_BYTES = 1 << 16  # one read when no large frame is pending
RECEIVE_BYTES_MAX = 1 << 20  # one read while a large frame is coming in
WRITE_BYTES_MAX = 1 << 20  # a merged write stops growing here (a larger frame goes alone)
TAKE_FRAMES_MAX = 4096  # frames decoded in one go

Metrics = collections.Counter[str]

# Counters, all in one `Metrics`. Sending side:
FRAMES_SENT = "transport.frames_sent"
WRITES = "transport.writes"  # frames_sent / writes is how much merging there was
BYTES_SENT = "transport.bytes_sent"
FRAMES_DROPPED_QUEUE_FULL = "transport.frames_dropped_queue_full"
FRAMES_DROPPED_OVERSIZED = "transport.frames_dropped_oversized"
FRAMES_DROPPED_DISCONNECTED = "transport.frames_dropped_disconnected"
# Receiving side:
FRAMES_RECEIVED = "transport.frames_received"
FRAMES_REFUSED_OVERSIZED = "transport.frames_refused_oversized"
FRAMES_TRUNCATED = "transport.frames_truncated"
# Connections:
CONNECTIONS_ACCEPTED = "transport.connections_accepted"
CONNECTIONS_REFUSED_LIMIT = "transport.connections_refused_limit"
# A client identity already holding its share of the client listener's places
CONNECTIONS_REFUSED_PRINCIPAL = "transport.connections_refused_principal"
HANDSHAKES_REFUSED_LIMIT = "transport.handshakes_refused_limit"  # too many not authenticated
HANDSHAKES_REFUSED_BARRED = "transport.handshakes_refused_barred"  # host failed too many
CONNECTIONS_LOST = "transport.connections_lost"
TLS_REFUSED = "transport.tls_refused"  # handshake failed: no certificate, wrong CA, garbage
IDENTITY_REFUSED = "transport.identity_refused"  # a valid certificate, but the wrong identity
# A peer whose hello names other lease timing than ours (or that sent no hello): peers.py
TIMING_REFUSED = "transport.peers_refused_timing"
PROTOCOL_REFUSED = "transport.peers_refused_protocol"  # a peer of another build (peers.py)
LIFE_REFUSED = "transport.peers_refused_life"  # a peer that forgot (peer_lives.py)
PEER_REJOINED = "transport.peers_rejoined"  # a peer heard on a new disk, rejoining
DIALS_FAILED = "transport.dials_failed"
RECONNECTS = "transport.reconnects"


class TransportError(ConsensusError):
    """Base of the transport's expected conditions; the connection concerned is closed."""


class FrameTooLarge(TransportError):
    """A peer declared a frame longer than the cap; the stream cannot be resynchronised."""

    def __init__(self, length: int, frame_bytes_max: int) -> None:
        super().__init__(f"frame of {length} bytes, more than {frame_bytes_max}")
        self.length = length
        self.frame_bytes_max = frame_bytes_max


class TruncatedFrame(TransportError):
    """The stream ended inside a frame."""


def check_frame_bytes_max(frame_bytes_max: int) -> None:
    if not 0 < frame_bytes_max <= FRAME_BYTES_LIMIT:
        raise ValueError(f"frame_bytes_max: {frame_bytes_max} is not in [1, {FRAME_BYTES_LIMIT}]")


def encode_frames(frames: Iterable[bytes]) -> bytes:
    """The wire form of `frames`, in order, as one buffer."""
    pack = HEADER.pack
    return b"".join([part for frame in frames for part in (pack(len(frame)), frame)])


class FrameDecoder:
    """Bytes in, frames out; no I/O.

    Invariant: the buffer holds at most one partial frame (header included) plus the last
    chunk fed, so its size is bounded by `frame_bytes_max + HEADER_BYTES + len(chunk)`.
    """

    def __init__(self, *, frame_bytes_max: int) -> None:
        check_frame_bytes_max(frame_bytes_max)
        self.frame_bytes_max = frame_bytes_max
        self._buffer = bytearray()
        self._start = 0  # frames before this offset have been taken

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer) - self._start

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def take_frames(self, frames_max: int = TAKE_FRAMES_MAX) -> list[bytes]:
        """The whole frames buffered, oldest first, up to `frames_max`; empty until more come.

        Raises `FrameTooLarge` at a length above the cap, once the frames before it are taken.
        """
        buffer, start, end = self._buffer, self._start, len(self._buffer)
        frames: list[bytes] = []
        with memoryview(buffer) as view:
            while len(frames) < frames_max and end - start >= HEADER_BYTES:
                length: int = HEADER.unpack_from(buffer, start)[0]
                if length > self.frame_bytes_max:
                    self._start = start
                    if frames:
                        return frames  # raise on the next call, after these are handled
                    raise FrameTooLarge(length, self.frame_bytes_max)
                if end - start - HEADER_BYTES < length:
                    break
                frames.append(bytes(view[start + HEADER_BYTES:start + HEADER_BYTES + length]))
                start += HEADER_BYTES + length
        self._start = start
        if len(frames) < frames_max:
            # Waiting for more: compact. Draining a whole chunk first keeps this linear.
            del buffer[:start]
            self._start = 0
            assert len(buffer) < HEADER_BYTES + self.frame_bytes_max
        return frames

    def next_frame(self) -> bytes | None:
        """The next whole frame, or None until more bytes are fed. Raises `FrameTooLarge`."""
        frames = self.take_frames(1)
        return frames[0] if frames else None

    def bytes_wanted(self) -> int:
        """How many more bytes would complete the frame being received (at least 1)."""
        if self.buffered_bytes < HEADER_BYTES:
            return HEADER_BYTES - self.buffered_bytes
        length: int = HEADER.unpack_from(self._buffer, self._start)[0]
        return max(1, HEADER_BYTES + length - self.buffered_bytes)


class FrameReader:
    """Reads frames from a byte stream, enforcing the size cap."""

    def __init__(self, stream: anyio.abc.ByteReceiveStream, *, frame_bytes_max: int) -> None:
        self._stream = stream
        self._decoder = FrameDecoder(frame_bytes_max=frame_bytes_max)
        self.frame_bytes_max = frame_bytes_max
        self._pending: collections.deque[bytes] = collections.deque()
        # Each read yields at least one byte, so one frame never takes more reads than this.
        self._reads_per_frame_max = HEADER_BYTES + frame_bytes_max + 1
        # anyio's receive without its awaits where it can (consensus/runtime/direct_read.py)
        self._direct = direct_read(stream)

    def widen(self, frame_bytes_max: int) -> None:
        """Raise the cap, for a stream whose first frames were read under a smaller one (a
        peer's hello is read under `HELLO_BYTES_MAX` until it has named a replica)."""
        if frame_bytes_max < self.frame_bytes_max:
            raise ValueError(f"a reader's cap only widens: {frame_bytes_max} is below "
                             f"{self.frame_bytes_max}")
        check_frame_bytes_max(frame_bytes_max)
        self._decoder.frame_bytes_max = self.frame_bytes_max = frame_bytes_max
        self._reads_per_frame_max = HEADER_BYTES + frame_bytes_max + 1

    @property
    def frames_waiting(self) -> int:
        """Frames already read, that `receive` hands out without waiting."""
        return len(self._pending)

    async def receive(self) -> bytes:
        """The next frame; see `receive_batch` for what it raises."""
        if not self._pending:
            self._pending.extend(await self.receive_batch())
        return self._pending.popleft()

    async def receive_batch(self) -> list[bytes]:
        """The next frames: at least one, and every other one already read (one await for all).

        Raises `anyio.EndOfStream` when the stream ends between frames, `TruncatedFrame` when
        it ends inside one, `FrameTooLarge` for a length above the cap, and whatever the stream
        raises when it breaks.
        """
        if self._pending:
            pending = list(self._pending)
            self._pending.clear()
            return pending
        for _ in range(self._reads_per_frame_max):
            frames = self._decoder.take_frames()
            if frames:
                return frames
            wanted = min(RECEIVE_BYTES_MAX, max(RECEIVE_BYTES, self._decoder.bytes_wanted()))
            direct = self._direct
            try:
                data = await (self._stream.receive(wanted) if direct is None
                              else direct.receive(wanted))
            except anyio.EndOfStream:
                if self._decoder.buffered_bytes:
                    raise TruncatedFrame(
                        f"stream ended with {self._decoder.buffered_bytes} bytes of a frame"
                    ) from None
                raise
            self._decoder.feed(data)
        raise AssertionError("a frame took more reads than it has bytes")


class FrameWriter:
    """Writes frames to a byte stream, many in one `send` where it can."""

    def __init__(self, stream: anyio.abc.ByteSendStream, *, frame_bytes_max: int,
                 metrics: Metrics) -> None:
        check_frame_bytes_max(frame_bytes_max)
        self._stream = stream
        self.frame_bytes_max = frame_bytes_max
        self.metrics = metrics
        # anyio's send without its awaits where it can (consensus/runtime/direct_write.py)
        self._direct = direct_write(stream)

    @property
    def writes_now(self) -> bool:
        """Whether `write_now` may write (anyio's asyncio backend); if not, it always declines."""
        return self._direct is not None

    def write_now(self, frames: Sequence[bytes]) -> bool:
        """Write `frames` (each within the cap, checked by the caller) in one write at once,
        with no await, if the transport takes data now; False: nothing was written, send them
        with `send_many` (consensus/runtime/write_through.py)."""
        direct = self._direct
        if direct is None:
            return False
        data = encode_frames(frames)
        if not direct.write(data):
            return False
        self._count(data, len(frames))
        return True

    async def send(self, frame: bytes) -> None:
        await self.send_many((frame,))

    async def send_many(self, frames: Sequence[bytes]) -> None:
        """Write `frames` in order, merged into writes of up to WRITE_BYTES_MAX each.

        Raises ValueError, before writing anything, if a frame is over the cap: the reader at
        the other end would have to drop the whole connection.
        """
        total = 0
        for frame in frames:
            if len(frame) > self.frame_bytes_max:
                raise ValueError(f"frame of {len(frame)} bytes, more than {self.frame_bytes_max}")
            total += HEADER_BYTES + len(frame)
        if total <= WRITE_BYTES_MAX:  # the common case: one write
            await self._write(encode_frames(frames), len(frames))
            return
        start = 0
        while start < len(frames):  # each write takes at least one frame
            end = merged_batch_end(frames, start, WRITE_BYTES_MAX)
            await self._write(encode_frames(frames[start:end]), end - start)
            start = end

    async def _write(self, data: bytes, frames: int) -> None:
        direct = self._direct
        if direct is None or not direct.write(data):
            await self._stream.send(data)
        elif direct.paused:
            await direct.drain()
        self._count(data, frames)

    def _count(self, data: bytes, frames: int) -> None:
        self.metrics[WRITES] += 1
        self.metrics[FRAMES_SENT] += frames
        self.metrics[BYTES_SENT] += len(data)


def merged_batch_end(frames: Sequence[bytes], start: int, write_bytes_max: int) -> int:
    """The end of the batch from `start`: at least one frame, else up to `write_bytes_max`."""
    assert start < len(frames)
    end = start + 1
    total = HEADER_BYTES + len(frames[start])
    while end < len(frames) and total + HEADER_BYTES + len(frames[end]) <= write_bytes_max:
        total += HEADER_BYTES + len(frames[end])
        end += 1
    return end


class FramedConnection:
    """Frames in both directions over one byte stream (a TLS stream, or plain TCP in dev)."""

    def __init__(self, stream: anyio.abc.ByteStream, *, frame_bytes_max: int,
                 metrics: Metrics, receive_bytes_max: int | None = None) -> None:
        """`receive_bytes_max`: a lower cap on the frames received than on those sent (a
        client's requests are far smaller than the answers it may be sent); by default
        `frame_bytes_max` both ways."""
        self.stream = stream
        self.metrics = metrics
        self._reader = FrameReader(stream, frame_bytes_max=frame_bytes_max
                                   if receive_bytes_max is None
                                   else min(frame_bytes_max, receive_bytes_max))
        self._writer = FrameWriter(stream, frame_bytes_max=frame_bytes_max, metrics=metrics)

    @property
    def frame_bytes_max(self) -> int:
        """The cap on frames sent: `send` raises ValueError beyond it (and `receive` raises
        FrameTooLarge beyond `receive_bytes_max`, at most this)."""
        return self._writer.frame_bytes_max

    @property
    def receive_bytes_max(self) -> int:
        """The cap on frames received: `receive` raises FrameTooLarge beyond it."""
        return self._reader.frame_bytes_max

    async def receive(self) -> bytes:
        """The next frame; see `FrameReader.receive_batch` for what it raises."""
        frame = await self._reader.receive()
        self.metrics[FRAMES_RECEIVED] += 1
        return frame

    @property
    def frames_waiting(self) -> int:
        """Frames already read, that `receive` hands out without waiting."""
        return self._reader.frames_waiting

    async def send(self, frame: bytes) -> None:
        await self._writer.send(frame)

    async def send_many(self, frames: Sequence[bytes]) -> None:
        await self._writer.send_many(frames)

    @property
    def write_now(self) -> WriteNow | None:
        """The writer's `write_now`, where it may write at once (else None)."""
        return self._writer.write_now if self._writer.writes_now else None

    async def aclose(self) -> None:
        await self.stream.aclose()
