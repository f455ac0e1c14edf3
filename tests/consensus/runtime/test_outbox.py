"""The outbox: frames queued by many callers leave in order, many per write, and a broken
stream, or closing it, stops it and refuses further frames."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from consensus.runtime.outbox import Outbox

pytestmark = pytest.mark.anyio


class RecordingStream:
    def __init__(self, *, fail_after_writes: int | None = None) -> None:
        self.writes: list[list[bytes]] = []
        self.fail_after_writes = fail_after_writes

    frame_bytes_max = 1 << 20

    async def send(self, frame: bytes) -> None:
        await self.send_many([frame])

    async def send_many(self, frames: Sequence[bytes]) -> None:
        if self.fail_after_writes is not None and len(self.writes) >= self.fail_after_writes:
            raise anyio.BrokenResourceError
        self.writes.append(list(frames))
        await anyio.sleep(0.01)  # a slow write: more frames queue meanwhile

    async def receive(self) -> bytes:
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        pass


async def test_frames_leave_in_order_and_batched() -> None:
    stream = RecordingStream()
    written: list[int] = []
    written_bytes: list[int] = []

    def on_written(frames: int, size: int) -> None:
        written.append(frames)
        written_bytes.append(size)

    outbox = Outbox(stream, on_written=on_written)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(outbox.run)
        for index in range(50):
            outbox.put(b"%d" % index)
            if index % 10 == 9:
                await anyio.sleep(0.002)
        while sum(written) < 50:
            await anyio.sleep(0.005)
        tasks.cancel_scope.cancel()
    assert [frame for write in stream.writes for frame in write] == \
        [b"%d" % index for index in range(50)]
    assert len(stream.writes) < 50 and written == [len(write) for write in stream.writes]
    assert written_bytes == [sum(map(len, write)) for write in stream.writes]


async def test_a_broken_stream_ends_the_writer_and_refuses_frames() -> None:
    outbox = Outbox(RecordingStream(fail_after_writes=0))
    outbox.put(b"first")
    with pytest.raises(anyio.BrokenResourceError):
        await outbox.run()
    assert outbox.broken
    with pytest.raises(anyio.BrokenResourceError):
        outbox.put(b"second")


async def test_closing_ends_the_writer_and_drops_what_waits() -> None:
    stream = RecordingStream()
    outbox = Outbox(stream)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(outbox.run)
            await anyio.sleep(0.01)  # the writer sleeps on its doorbell
            outbox.close()  # and returns: the task group can end
    assert outbox.broken and stream.writes == []
    with pytest.raises(anyio.BrokenResourceError):
        outbox.put(b"late")
