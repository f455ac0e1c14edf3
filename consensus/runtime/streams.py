"""What the client protocol needs of a connection: whole frames in and out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class FrameStream(Protocol):
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
