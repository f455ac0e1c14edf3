"""Messages to one peer, merged into as few frames as the frame cap allows (message merging).

The common case, everything in one frame, costs one encoding of the lot. When that frame is
over the cap, each message is encoded once on its own, consecutive messages are grouped
greedily by those sizes, and each group's frame is built from their encodings
(`codec.frame_of_encoded`): two encodings of a message at most, where halving the list and
encoding each half again cost one per level, and the driver's loop (ticks, heartbeats, client
answers) waits for all of it.

A message larger than the cap on its own goes alone in its frame (the transport drops and
counts it); a frame's own overhead, the array header that lists its messages, is at most
FRAME_OVERHEAD_BYTES.
"""

from __future__ import annotations

from consensus.codec import encode_message, encode_messages, frame_of_encoded
from consensus.messages import Message

FRAME_OVERHEAD_BYTES = 5  # msgpack's header of an array of messages, at its largest


def frames_of(messages: list[Message], frame_bytes_max: int) -> list[bytes]:
    """`messages`, in order, as frames of at most `frame_bytes_max` bytes where they fit."""
    frame = encode_messages(messages)
    if len(frame) <= frame_bytes_max or len(messages) == 1:
        return [frame]
    frames: list[bytes] = []
    group: list[bytes] = []
    group_bytes = FRAME_OVERHEAD_BYTES
    for encoded in map(encode_message, messages):
        if group and group_bytes + len(encoded) > frame_bytes_max:
            frames.append(frame_of_encoded(group))
            group, group_bytes = [], FRAME_OVERHEAD_BYTES
        group.append(encoded)
        group_bytes += len(encoded)
    frames.append(frame_of_encoded(group))
    return frames
