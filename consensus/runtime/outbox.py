"""Frames for one connection, queued without waiting and written by one task in few writes.

Under load a connection carries many small frames (a response per command, a request per
call); writing each on its own costs a TLS record and a system call apiece. Callers `put`
frames (never blocking: the caller bounds how many can be queued, e.g. by requests in flight)
and one writer task takes everything queued since its last write and sends it with one
`send_many`. The writer ends, and `put` raises, once the connection is broken.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from consensus.runtime.deadlines import Doorbell
from consensus.runtime.streams import FrameStream


class Outbox:
    __slots__ = ("_doorbell", "_frames", "_on_written", "_stream", "broken")

    def __init__(self, stream: FrameStream,
                 on_written: Callable[[int], None] | None = None) -> None:
        self._stream = stream
        self._frames: list[bytes] = []
        self._doorbell = Doorbell()
        self._on_written = on_written  # told how many frames each write carried
        self.broken = False

    def put(self, frame: bytes) -> None:
        if self.broken:
            raise anyio.BrokenResourceError
        self._frames.append(frame)
        self._doorbell.ring()

    async def run(self) -> None:
        """Write queued frames until the stream breaks (or this task is cancelled)."""
        try:
            while True:
                while not self._frames:
                    await self._doorbell.sleep()
                frames, self._frames = self._frames, []
                await self._stream.send_many(frames)
                if self._on_written is not None:
                    self._on_written(len(frames))
        finally:
            self.broken = True
            self._frames.clear()
