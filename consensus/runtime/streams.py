"""What the client protocol needs of a connection: whole frames in and out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class FrameStream(Protocol):
    @property
    def frame_bytes_max(self) -> int:
        """The largest frame `send` and `send_many` take: a larger one raises ValueError before
        anything is written (the reader at the other end would have to drop the connection)."""
        ...

    async def send(self, frame: bytes) -> None:
        """Send one frame; raises on a broken connection."""
        ...

    async def send_many(self, frames: Sequence[bytes]) -> None:
        """Send `frames` in order, in as few writes as the stream allows."""
        ...

    async def receive(self) -> bytes:
        """The next frame; raises anyio.EndOfStream (or a broken-resource error) at the end."""
        ...

    async def aclose(self) -> None: ...
