"""What the client protocol needs of a connection: whole frames in and out."""

from __future__ import annotations

from typing import Protocol


class FrameStream(Protocol):
    async def send(self, frame: bytes) -> None:
        """Send one frame; raises on a broken connection."""
        ...

    async def receive(self) -> bytes:
        """The next frame; raises anyio.EndOfStream (or a broken-resource error) at the end."""
        ...

    async def aclose(self) -> None: ...
