"""What the per-visit speed-ups must leave alone (the fixed Python work each received frame and
each Ready cost, cut without changing a byte on the wire or in the log):

- the codec's encoders read a message's fields in one call and convert only the fields whose
  encoding is not the value itself: every message and record still encodes to exactly the
  bytes of the plain field-by-field form ([TAG, field, ...], nested dataclasses as arrays, a
  batch as one flat [origin, tag, payload, ...] array, tuples as arrays);
- a frame's messages are decoded with the valid case checked inline: a malformed frame or
  message is still refused with the same reason;
- `ReplicaConfig.peers` is made once, and `Context.sequencer` computes what
  `config.sequencer_of` does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from consensus.codec import (
    decode_messages,
    encode_message,
    encode_messages,
    encode_record,
)
from consensus.config import ReplicaConfig
from consensus.context import Context, Status
from consensus.errors import InvalidMessage
from consensus.messages import Command, Message
from consensus.prng import Prng
from consensus.records import Record
from tests.consensus.test_codec import any_message, any_record


def plain_form(value: Any) -> Any:
    """The encoding as the codec describes it, built the slow, obvious way."""
    if isinstance(value, tuple) and value and all(isinstance(item, Command) for item in value):
        return [part for command in value
                for part in (command.origin, command.tag, command.payload)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [plain_form(getattr(value, field.name)) for field in dataclasses.fields(value)]
    if isinstance(value, tuple):
        return [plain_form(item) for item in value]
    return value


def plain_bytes(value: Message | Record) -> bytes:
    packed: bytes = msgpack.packb([type(value).TAG, *plain_form(value)],
                                  use_bin_type=True)
    return packed


@given(any_message)
def test_a_message_encodes_to_its_plain_form(message: Message) -> None:
    assert encode_message(message) == plain_bytes(message)


@given(st.lists(any_message, max_size=5))
def test_a_frame_encodes_to_the_plain_form_of_its_messages(messages: list[Message]) -> None:
    expected = msgpack.packb([[type(message).TAG, *plain_form(message)] for message in messages],
                             use_bin_type=True)
    assert encode_messages(messages) == expected


@given(any_record)
def test_a_record_encodes_to_its_plain_form(record: Record) -> None:
    assert encode_record(record) == plain_bytes(record)


@pytest.mark.parametrize(("raw", "reason"), [
    ({"a": 1}, "frame: expected a list, got dict"),
    ([[]], "message: empty"),
    ([[True, 1]], "message.tag: expected an integer, got bool"),
    ([[-1, 1]], "message.tag: -1 is outside"),
    ([[10_000, 1]], "message.tag: unknown tag 10000"),
    ([["x"]], "message.tag: expected an integer, got str"),
    ([7], "message: expected a list, got int"),
])
def test_malformed_frames_are_refused_with_the_same_reason(raw: Any, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        decode_messages(msgpack.packb(raw, use_bin_type=True))


@pytest.mark.parametrize("replica_count", [3, 5, 7])
def test_peers_are_the_others_in_order_and_follow_a_replace(replica_count: int) -> None:
    for replica_id in range(replica_count):
        config = ReplicaConfig(replica_id=replica_id, replica_count=replica_count)
        assert config.peers == tuple((replica_id + step) % replica_count
                                     for step in range(1, replica_count))
        moved = dataclasses.replace(config, replica_id=(replica_id + 1) % replica_count)
        assert replica_id in moved.peers and moved.replica_id not in moved.peers
    ordered = ReplicaConfig(replica_id=0, replica_count=5, peer_order=(3, 1, 4, 2))
    assert ordered.peers == (3, 1, 4, 2)
    assert dataclasses.replace(ordered, peer_order=()).peers == (1, 2, 3, 4)
    # Not part of what a configuration is: equal configurations stay equal, repr unchanged.
    assert ordered == ReplicaConfig(replica_id=0, replica_count=5, peer_order=(3, 1, 4, 2))
    assert "peers=" not in repr(ordered)


def test_the_sequencer_is_the_configs_for_every_view() -> None:
    config = ReplicaConfig(replica_id=2, replica_count=5)
    context = Context(config, Prng(1))
    for view in range(12):
        context.view = view
        for status in Status:
            context.status = status
            assert context.sequencer == config.sequencer_of(view)
            assert context.is_sequencer == (status is Status.NORMAL
                                            and config.sequencer_of(view) == 2)
