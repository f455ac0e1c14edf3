"""Frames for one connection, queued without waiting and written by one task in few writes.

Under load a connection carries many small frames (a response per command, a request per
call); writing each on its own costs a TLS record and a system call apiece. Callers `put`
frames (never blocking: the caller bounds how many can be queued, e.g. by requests in flight)
and one writer task takes everything queued since its last write (up to one merged write's
WRITE_BYTES_MAX, so `on_written` hears of progress a megabyte at a time) and sends it with one
`send_many`. The writer ends, and `put` raises, once the connection is broken or the outbox
closed.

`put` refuses a frame over the stream's cap at once, with ValueError: the caller decides what
becomes of it (the server answers with an error instead, the client refuses the request).
Queued, it would fail the whole write, and the writer with it, in another task.

While the writer sleeps with nothing queued, the first frame of a turn of the loop is written
by `put` itself, at once, where the stream can (consensus/runtime/write_through.py); then
`on_written` is called from `put`.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from consensus.runtime.deadlines import Doorbell
from consensus.runtime.framing import HEADER_BYTES, WRITE_BYTES_MAX, merged_batch_end
from consensus.runtime.streams import FrameStream
from consensus.runtime.write_through import WriteThrough, write_through


class Outbox:
    __slots__ = ("_doorbell", "_frames", "_on_written", "_stream", "_through", "broken",
                 "frame_bytes_max", "queued_bytes")

    def __init__(self, stream: FrameStream,
                 on_written: Callable[[int, int], None] | None = None) -> None:
        self._stream = stream
        self._frames: list[bytes] = []
        self._doorbell = Doorbell()
        self._on_written = on_written  # told how many frames, and bytes, each write carried
        self.broken = False
        self.frame_bytes_max = stream.frame_bytes_max
        self.queued_bytes = 0  # of the frames put and not yet handed to the stream
        self._through: WriteThrough | None = None  # made by `run`, in the loop

    def put(self, frame: bytes) -> None:
        """Queue `frame`; raises BrokenResourceError once the stream broke, ValueError (and
        queues nothing) when `frame` is over the stream's cap."""
        if self.broken:
            raise anyio.BrokenResourceError
        if len(frame) > self.frame_bytes_max:
            raise ValueError(f"frame of {len(frame)} bytes, more than {self.frame_bytes_max}")
        through = self._through
        if through is not None and not self._frames and through.write(frame):
            if self._on_written is not None:
                self._on_written(1, len(frame))
            return
        self._frames.append(frame)
        self.queued_bytes += len(frame)
        self._doorbell.ring()

    def close(self) -> None:
        """Take no more frames, drop those queued, and let `run` return (the stream is the
        caller's to close)."""
        self.broken = True
        self._frames.clear()
        self.queued_bytes = 0
        self._doorbell.ring()

    def _take(self) -> tuple[list[bytes], int]:
        """The frames of the next write and their bytes: all those queued, or, past
        WRITE_BYTES_MAX, as many as one merged write holds (at least one). A write of all of
        them (hundreds of megabytes of answers to a slow reader) told `on_written` nothing
        until its very end: the server took a reader for one that stopped, and dropped it."""
        frames, queued_bytes = self._frames, self.queued_bytes
        if queued_bytes + HEADER_BYTES * len(frames) <= WRITE_BYTES_MAX:
            self._frames, self.queued_bytes = [], 0
            return frames, queued_bytes
        end = merged_batch_end(frames, 0, WRITE_BYTES_MAX)
        taken = frames[:end]
        del frames[:end]
        taken_bytes = sum(map(len, taken))
        self.queued_bytes -= taken_bytes
        return taken, taken_bytes

    async def run(self) -> None:
        """Write queued frames until the stream breaks or `close` (or this task is
        cancelled)."""
        through = self._through = write_through(getattr(self._stream, "write_now", None))
        try:
            while not self.broken:
                if not self._frames:
                    await self._sleep(through)
                    continue
                frames, written_bytes = self._take()
                await self._stream.send_many(frames)
                if self._on_written is not None:
                    self._on_written(len(frames), written_bytes)
        finally:
            self._through = None
            self.close()

    async def _sleep(self, through: WriteThrough | None) -> None:
        """Sleep until a frame is queued (or the outbox closed), letting `put` write through
        meanwhile."""
        if through is None:
            await self._doorbell.sleep()
            return
        through.waiting = True
        try:
            await self._doorbell.sleep()
        finally:
            through.waiting = False
