"""Replicas faked at the client's end of a connection (`FrameStream`s a client's `Connect`
returns): one that hears every request and answers none, one that answers every request with
the same reply, a base for ones a test scripts request by request; and the dialers tests build
from them."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence

import anyio

from consensus.runtime.client import ClientConfig
from consensus.runtime.client_codec import Request, decode_request, encode_ok
from consensus.runtime.streams import FrameStream

# Quick tries and pauses, so a test moves on from a silent replica at once.
RETRYING_CONFIG = ClientConfig(attempt_timeout_s=0.05, deadline_s=5.0, retry_backoff_s=0.01)


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


class ScriptedReplica:
    """A connection whose replica a test scripts: `hear` gets each request as it is sent, and
    `answer` queues a frame for the client (dropped once the connection is closed)."""

    frame_bytes_max = 1 << 20

    def __init__(self) -> None:
        self._out, self._answers = anyio.create_memory_object_stream[bytes](100)

    def hear(self, request: Request, frame: bytes) -> None:
        raise NotImplementedError

    def answer(self, frame: bytes) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._out.send_nowait(frame)

    async def send(self, frame: bytes) -> None:
        await self.send_many([frame])

    async def send_many(self, frames: Sequence[bytes]) -> None:
        for frame in frames:
            self.hear(decode_request(frame), frame)

    async def receive(self) -> bytes:
        return await self._answers.receive()

    async def aclose(self) -> None:
        self._out.close()


def silent_then_answering(reply: bytes) -> Callable[[str], Awaitable[FrameStream]]:
    """A dialer for endpoints "a" and "b": "a" hears and never answers, "b" answers `reply`."""
    async def connect(endpoint: str) -> FrameStream:
        return SilentReplica(endpoint, []) if endpoint == "a" else AnsweringReplica(reply)
    return connect


class NeverDialled:
    """A dialer that records each endpoint asked for and fails: to show nothing was sent."""

    def __init__(self) -> None:
        self.dialled: list[str] = []

    async def __call__(self, endpoint: str) -> FrameStream:
        self.dialled.append(endpoint)
        raise OSError("never dialled")
