"""Replicas faked at the client's end of a connection (`FrameStream`s a client's `Connect`
returns): one that hears every request and answers none, one that answers every request with
the same reply."""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from consensus.runtime.client_codec import decode_request, encode_ok


class SilentReplica:
    """A connection that reads every request and answers none; `heard` gets its endpoint once
    per request."""

    frame_bytes_max = 1 << 20

    def __init__(self, endpoint: str, heard: list[str]) -> None:
        self._endpoint, self._heard = endpoint, heard
        self._closed = anyio.Event()

    async def send(self, frame: bytes) -> None:
        await self.send_many([frame])

    async def send_many(self, frames: Sequence[bytes]) -> None:
        for frame in frames:
            decode_request(frame)  # a well-formed request
            self._heard.append(self._endpoint)

    async def receive(self) -> bytes:
        await self._closed.wait()
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        self._closed.set()


class AnsweringReplica:
    """A connection whose replica answers every request OK, with `reply`."""

    frame_bytes_max = 1 << 20

    def __init__(self, reply: bytes) -> None:
        self._reply = reply
        self._answers_out, self._answers = anyio.create_memory_object_stream[bytes](1000)

    async def send(self, frame: bytes) -> None:
        await self.send_many([frame])

    async def send_many(self, frames: Sequence[bytes]) -> None:
        for frame in frames:
            self._answers_out.send_nowait(encode_ok(decode_request(frame).request_id,
                                                    self._reply))

    async def receive(self) -> bytes:
        return await self._answers.receive()  # EndOfStream once closed

    async def aclose(self) -> None:
        self._answers_out.close()
