"""Message merging: messages to one peer leave in as few frames as the cap allows, in order,
each message encoded a bounded number of times however many frames they need (halving the
list and encoding each half again cost one encoding per level, with the driver's loop
blocked meanwhile)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.codec import decode_messages, encode_messages
from consensus.messages import CAccept, Command, Message
from consensus.runtime import message_frames
from consensus.runtime.message_frames import frames_of


def accepts(sizes: list[int]) -> list[Message]:
    return [CAccept(1, 3, 0, index, 5, (Command(1, index, b"x" * size),))
            for index, size in enumerate(sizes)]


@settings(max_examples=100)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=40), st.integers(64, 20_000))
def test_frames_keep_the_order_and_the_cap(sizes: list[int], frame_bytes_max: int) -> None:
    messages = accepts(sizes)
    frames = frames_of(messages, frame_bytes_max)
    assert [message for frame in frames for message in decode_messages(frame)] == messages
    for frame in frames:  # over the cap only a message too big on its own
        assert len(frame) <= frame_bytes_max or len(decode_messages(frame)) == 1
    if len(encode_messages(messages)) <= frame_bytes_max:
        assert len(frames) == 1


def counting(function: Callable[..., bytes], counts: list[int]) -> Callable[..., bytes]:
    def counted(argument: Any) -> bytes:
        counts.append(len(argument) if isinstance(argument, list) else 1)
        return function(argument)
    return counted


def test_each_message_is_encoded_at_most_three_times(monkeypatch: pytest.MonkeyPatch) -> None:
    counts: list[int] = []
    for name in ("encode_message", "encode_messages"):
        monkeypatch.setattr(message_frames, name,
                            counting(getattr(message_frames, name), counts))
    messages = accepts([1 << 16] * 128)  # 8 MiB, to frames of at most 256 KiB
    frames = frames_of(messages, 1 << 18)
    assert sum(counts) <= 3 * len(messages)  # halving: 1 + log2(128 / 3) levels, ~6.4 each
    assert len(frames) == 43  # three whole messages to a frame (a fourth would pass the cap)
