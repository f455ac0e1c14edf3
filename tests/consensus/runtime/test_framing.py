"""Framing: frames survive any split of the byte stream, a length above the cap is refused before
its payload is read, a stream ending inside a frame is told apart from one ending between frames,
and the writer merges many small frames into one write.

The async tests run on asyncio and on trio, over small fake streams (no sockets: the peer-mesh
and listener tests cover real ones)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import anyio
import anyio.abc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from consensus.runtime.framing import (
    BYTES_SENT,
    FRAMES_RECEIVED,
    FRAMES_SENT,
    HEADER,
    WRITE_BYTES_MAX,
    WRITES,
    FramedConnection,
    FrameDecoder,
    FrameReader,
    FrameTooLarge,
    FrameWriter,
    Metrics,
    TruncatedFrame,
    encode_frames,
    merged_batch_end,
)

pytestmark = pytest.mark.anyio



class ChunkReceiveStream(anyio.abc.ByteReceiveStream):
    """Hands out the given chunks (cut further to the reader's max_bytes), then ends."""

    def __init__(self, chunks: Sequence[bytes]) -> None:
        self.chunks = [chunk for chunk in chunks if chunk]
        self.reads = 0

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await anyio.lowlevel.checkpoint()
        if not self.chunks:
            raise anyio.EndOfStream
        self.reads += 1
        chunk = self.chunks.pop(0)
        if len(chunk) > max_bytes:
            self.chunks.insert(0, chunk[max_bytes:])
        return chunk[:max_bytes]

    async def aclose(self) -> None:
        self.chunks = []


class RecordingSendStream(anyio.abc.ByteSendStream):
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def send(self, item: bytes) -> None:
        await anyio.lowlevel.checkpoint()
        self.writes.append(bytes(item))

    async def aclose(self) -> None:
        pass


class LoopbackStream(anyio.abc.ByteStream):
    """What is sent can be received: a one-party byte stream for FramedConnection."""

    def __init__(self) -> None:
        self.sent = RecordingSendStream()

    async def send(self, item: bytes) -> None:
        await self.sent.send(item)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await anyio.lowlevel.checkpoint()
        if not self.sent.writes:
            raise anyio.EndOfStream
        data = self.sent.writes.pop(0)
        if len(data) > max_bytes:
            self.sent.writes.insert(0, data[max_bytes:])
        return data[:max_bytes]

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def split(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts} | {0, len(data)})
    return [data[start:end] for start, end in itertools.pairwise(points)]


def decode_all(decoder: FrameDecoder, chunks: Sequence[bytes], frames_max: int) -> list[bytes]:
    frames = []
    for chunk in chunks:
        decoder.feed(chunk)
        for _ in range(len(chunk) + 1):
            taken = decoder.take_frames(frames_max)
            if not taken:
                break
            assert len(taken) <= frames_max
            frames += taken
    return frames


@given(st.lists(st.binary(max_size=40), max_size=20),
       st.lists(st.integers(0, 10_000), max_size=30), st.integers(1, 5))
def test_frames_survive_any_split_of_the_stream(frames: list[bytes], cuts: list[int],
                                                frames_max: int) -> None:
    decoder = FrameDecoder(frame_bytes_max=40)
    assert decode_all(decoder, split(encode_frames(frames), cuts), frames_max) == frames
    assert decoder.buffered_bytes == 0


def test_frames_before_a_bad_length_are_handed_out_first() -> None:
    decoder = FrameDecoder(frame_bytes_max=10)
    decoder.feed(encode_frames([b"one", b"two"]) + HEADER.pack(11) + b"rest")
    assert decoder.take_frames() == [b"one", b"two"]
    with pytest.raises(FrameTooLarge):
        decoder.take_frames()


def test_a_length_above_the_cap_is_refused_from_the_header_alone() -> None:
    decoder = FrameDecoder(frame_bytes_max=1000)
    decoder.feed(HEADER.pack(1001))  # not one byte of payload sent
    with pytest.raises(FrameTooLarge) as refused:
        decoder.next_frame()
    assert (refused.value.length, refused.value.frame_bytes_max) == (1001, 1000)


def test_a_frame_at_the_cap_and_an_empty_frame_pass() -> None:
    decoder = FrameDecoder(frame_bytes_max=5)
    assert decode_all(decoder, [encode_frames([b"12345", b"", b"x"])], 1) == [b"12345", b"",
                                                                             b"x"]
    assert decoder.next_frame() is None


def test_bytes_wanted_says_how_much_completes_the_frame() -> None:
    decoder = FrameDecoder(frame_bytes_max=100)
    assert decoder.bytes_wanted() == 4
    decoder.feed(HEADER.pack(10)[:3])
    assert decoder.bytes_wanted() == 1
    decoder.feed(HEADER.pack(10)[3:] + b"abc")
    assert decoder.next_frame() is None
    assert decoder.bytes_wanted() == 7


@pytest.mark.parametrize("frame_bytes_max", [0, -1, 1 << 32])
def test_the_cap_must_fit_the_length_field(frame_bytes_max: int) -> None:
    with pytest.raises(ValueError, match="frame_bytes_max"):
        FrameDecoder(frame_bytes_max=frame_bytes_max)


async def test_the_reader_returns_frames_then_end_of_stream() -> None:
    frames = [b"a" * 70_000, b"", b"hello", b"b" * 300]
    stream = ChunkReceiveStream(split(encode_frames(frames), [1, 2, 5, 70_003, 70_010]))
    reader = FrameReader(stream, frame_bytes_max=70_000)
    with anyio.fail_after(5):
        assert [await reader.receive() for _ in frames] == frames
        with pytest.raises(anyio.EndOfStream):
            await reader.receive()


async def test_the_reader_tells_a_truncated_frame_from_a_clean_end() -> None:
    stream = ChunkReceiveStream([encode_frames([b"whole", b"half of this"])[:-4]])
    reader = FrameReader(stream, frame_bytes_max=100)
    with anyio.fail_after(5):
        assert await reader.receive() == b"whole"
        with pytest.raises(TruncatedFrame):
            await reader.receive()


async def test_the_reader_refuses_an_absurd_length_without_reading_the_payload() -> None:
    stream = ChunkReceiveStream([b"\xff\xff\xff\xff" + b"junk" * 10])
    reader = FrameReader(stream, frame_bytes_max=1 << 20)
    with anyio.fail_after(5), pytest.raises(FrameTooLarge):
        await reader.receive()
    assert stream.reads == 1


async def test_the_writer_merges_small_frames_into_one_write() -> None:
    stream, metrics = RecordingSendStream(), Metrics()
    frames = [f"message {index}".encode() for index in range(500)]
    with anyio.fail_after(5):
        await FrameWriter(stream, frame_bytes_max=100, metrics=metrics).send_many(frames)
    assert stream.writes == [encode_frames(frames)]
    assert (metrics[WRITES], metrics[FRAMES_SENT]) == (1, 500)
    assert metrics[BYTES_SENT] == len(stream.writes[0])


async def test_the_writer_splits_a_large_batch_at_the_write_limit() -> None:
    stream, metrics = RecordingSendStream(), Metrics()
    frames = [bytes([index]) * 200_000 for index in range(10)] + [b"z" * 1_500_000]
    with anyio.fail_after(5):
        await FrameWriter(stream, frame_bytes_max=2 << 20, metrics=metrics).send_many(frames)
    # Five 200 kB frames fit in one 1 MiB write; the 1.5 MB frame goes alone.
    assert [len(write) for write in stream.writes] == [5 * 200_004, 5 * 200_004, 1_500_004]
    assert b"".join(stream.writes) == encode_frames(frames)
    assert metrics[WRITES] == 3


async def test_the_writer_refuses_a_frame_over_the_cap_and_writes_nothing() -> None:
    stream = RecordingSendStream()
    writer = FrameWriter(stream, frame_bytes_max=10, metrics=Metrics())
    with anyio.fail_after(5), pytest.raises(ValueError, match="more than 10"):
        await writer.send_many([b"fine", b"far too long"])
    assert stream.writes == []


def test_a_merged_batch_takes_at_least_one_frame_and_stays_within_the_limit() -> None:
    frames = [b"x" * 10] * 5
    assert merged_batch_end(frames, 0, 28) == 2  # two frames with headers: 28 bytes
    assert merged_batch_end(frames, 3, 1) == 4  # one frame even when it alone is over
    assert merged_batch_end([b"y" * WRITE_BYTES_MAX] * 2, 0, WRITE_BYTES_MAX) == 1


async def test_a_framed_connection_round_trips_and_counts() -> None:
    metrics = Metrics()
    connection = FramedConnection(LoopbackStream(), frame_bytes_max=64, metrics=metrics)
    with anyio.fail_after(5):
        await connection.send(b"one")
        await connection.send_many([b"two", b"three"])
        assert [await connection.receive() for _ in range(3)] == [b"one", b"two", b"three"]
        await connection.aclose()
    assert (metrics[FRAMES_SENT], metrics[WRITES], metrics[FRAMES_RECEIVED]) == (3, 2, 3)


@given(st.lists(st.binary(max_size=64), max_size=20), st.integers(1, 64))
def test_any_stream_gives_frames_within_the_cap_or_frame_too_large(chunks: list[bytes],
                                                                   cap: int) -> None:
    """Whatever bytes a peer or client sends, the decoder hands out frames within its cap and
    holds at most a frame, its header and the last chunk, or refuses with FrameTooLarge."""
    decoder = FrameDecoder(frame_bytes_max=cap)
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            for frame in decoder.take_frames():
                assert len(frame) <= cap
            assert decoder.buffered_bytes <= cap + HEADER.size + len(chunk)
            assert decoder.bytes_wanted() >= 1
    except FrameTooLarge:
        pass
