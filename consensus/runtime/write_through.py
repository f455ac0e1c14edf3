"""A frame written by the task that makes it, when the connection's writer has nothing to do.

Frames to a connection queue in an outbox, and one writer task per connection takes what is
queued and writes it, many frames a write (consensus/runtime/outbox.py, peers.py). At one
caller that costs a turn of the loop and a task's wake-up for every frame, and the frame waits
for the producer to finish its turn first: a follower's acknowledgement left only after it had
also applied the last commit and built its next Ready.

`WriteThrough` lets the producer write the frame itself, at once, through the writer's
`write_now` (consensus/runtime/direct_write.py: the same bytes, no await), when that cannot
change the order or the batching of what is written:
- only while the writer task sleeps with nothing queued (its outbox sets `waiting`), so
  nothing queued earlier can be overtaken, and the writer is not in the middle of a write;
- only the first frame of a turn of the loop: after one, the gate closes until the loop's next
  turn (`call_soon`), and the frames that follow in the same turn queue for the writer, which
  merges them into one write as before. Under load, with many callers a turn, batching is
  unchanged but for that one frame;
- only where the writer can write without waiting (anyio's asyncio backend, a transport taking
  data): otherwise `write_now` declines and the frame is queued as always.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

WriteNow = Callable[[Sequence[bytes]], bool]


class WriteThrough:
    """The gate of one connection's writer: see the module docstring."""

    __slots__ = ("_loop", "_open", "_write_now", "waiting")

    def __init__(self, write_now: WriteNow, loop: asyncio.AbstractEventLoop) -> None:
        self._write_now = write_now  # False: nothing written, the frame must be queued
        self._loop = loop
        self._open = True  # no frame written through yet in this turn of the loop
        self.waiting = False  # set by the outbox while its writer sleeps with nothing queued

    def write(self, frame: bytes) -> bool:
        """Whether `frame` was written now; False: queue it for the writer."""
        if not (self.waiting and self._open) or not self._write_now((frame,)):
            return False
        self._open = False
        self._loop.call_soon(self._reopen)
        return True

    def _reopen(self) -> None:
        self._open = True


def write_through(write_now: WriteNow | None) -> WriteThrough | None:
    """A gate for a writer's `write_now`, or None where frames must always be queued (no
    `write_now`, or not on an asyncio loop)."""
    if write_now is None:
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # trio: its writers never write without awaiting
        return None
    return WriteThrough(write_now, loop)
