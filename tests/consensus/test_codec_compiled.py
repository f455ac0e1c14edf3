"""The codec's straight-line paths (`consensus.codec_compiled`, the batch decoder, the record
framing loop, `check_message`'s per-class pass) pinned to the generic ones they stand in for:
the same bytes out, the same objects or the same refusal (same text) in, the same verdicts."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from consensus import codec
from consensus.errors import InvalidMessage
from consensus.messages import (
    MESSAGE_TYPES,
    Command,
    Message,
    check_message,
    check_message_fully,
)
from consensus.records import RECORD_TYPES, Record
from consensus.runtime.storage_format import frame, frame_key, frames
from consensus.validation import UINT64_MAX
from tests.consensus.test_codec import any_message, any_record, strategy_for_class

ODD_VALUES = [-2, -1, 0, 1, 7, True, False, None, b"", b"x", "x", [], [1], [-2], [True],
              [None], [1, 2, 3], [0, 0, b"p"], [0, -1, b"p"], [0, 1, "p"], [[0, 1, b"p"]],
              2**63 - 1, 2**63, 2**64 - 1, [2**63], {"a": 1}, 1.5]
replicas = st.integers(1, 7)


def generic_encoding(value: Any, table: dict[int, tuple[type, Any, Any]]) -> list[Any]:
    tag = type(value).TAG
    return [tag, *table[tag][1](value)]


def generic_decoding(raw: list[Any], table: dict[int, tuple[type, Any, Any]]) -> Any:
    cls, _, decode = table[raw[0]]
    return decode(raw[1:], cls.__name__)


def outcome(decode: Any, raw: Any) -> tuple[str, Any]:
    try:
        return "decoded", decode(raw)
    except InvalidMessage as error:
        return "refused", str(error)


def mutated(encoding: list[Any], data: st.DataObject) -> list[Any]:
    raw = list(encoding)
    for _ in range(data.draw(st.integers(1, 3))):
        position = data.draw(st.integers(1, len(raw) - 1)) if len(raw) > 1 else 0
        raw[position] = data.draw(st.sampled_from(ODD_VALUES))
    if data.draw(st.booleans()):
        raw = raw[:-1] if data.draw(st.booleans()) else [*raw, 0]
    return raw


@given(any_message)
def test_message_encodings_are_the_generic_ones_byte_for_byte(message: Message) -> None:
    encoded = codec._MESSAGE_ENCODERS[type(message)](message)
    assert encoded == generic_encoding(message, codec._MESSAGES)
    assert codec.encode_message(message) == msgpack.packb(encoded, use_bin_type=True)
    assert codec.encode_messages([message, message]) == msgpack.packb(
        [encoded, encoded], use_bin_type=True)


@given(st.lists(any_record, min_size=1, max_size=4))
def test_record_encodings_and_frames_are_the_generic_ones_byte_for_byte(
        records: list[Record]) -> None:
    payloads = codec.encode_records(records)
    assert payloads == [msgpack.packb(generic_encoding(record, codec._RECORDS),
                                      use_bin_type=True) for record in records]
    assert payloads == [codec.encode_record(record) for record in records]
    key = frame_key(b"saltsalt")
    assert frames(payloads, key) == b"".join(frame(payload, key) for payload in payloads)


@given(any_message, st.data())
def test_message_decoding_matches_the_generic_decoder(message: Message,
                                                      data: st.DataObject) -> None:
    encoding = generic_encoding(message, codec._MESSAGES)
    for made in (encoding, mutated(encoding, data)):
        raw = msgpack.unpackb(msgpack.packb(made, use_bin_type=True))  # as a peer's arrive
        compiled = outcome(lambda item: codec._decode_tagged(
            item, codec._MESSAGES, codec._MESSAGE_DECODERS, "message"), raw)
        assert compiled == outcome(lambda item: generic_decoding(item, codec._MESSAGES), raw)
        framed = outcome(codec.decode_messages, msgpack.packb([raw], use_bin_type=True))
        assert framed == (compiled[0], [compiled[1]] if compiled[0] == "decoded"
                          else compiled[1])
        if compiled[0] == "decoded":
            assert type(compiled[1]) is type(message)


@given(any_record, st.data())
def test_record_decoding_matches_the_generic_decoder(record: Record,
                                                     data: st.DataObject) -> None:
    encoding = generic_encoding(record, codec._RECORDS)
    for made in (encoding, mutated(encoding, data)):
        raw = msgpack.unpackb(msgpack.packb(made, use_bin_type=True))
        assert outcome(codec.decode_record, msgpack.packb(raw, use_bin_type=True)) == \
            outcome(lambda item: generic_decoding(item, codec._RECORDS), raw)


def old_decode_batch(flat: list[Any], where: str) -> Any:
    """The batch decoder as it was, with a frame per item."""
    if len(flat) % 3:
        raise InvalidMessage(f"{where}: {len(flat)} items is not a whole number of commands")
    origins, tags, payloads = flat[0::3], flat[1::3], flat[2::3]
    if not (all(type(item) is int for item in origins) and all(type(item) is int for item in tags)
            and all(type(item) is bytes for item in payloads)):
        raise InvalidMessage(f"{where}: commands must be (int origin, int tag, bytes payload)")
    if origins and (min(origins) < 0 or min(tags) < 0 or max(tags) > UINT64_MAX
                    or max(len(payload) for payload in payloads) > codec.ENVELOPE_BYTES_MAX):
        raise InvalidMessage(f"{where}: a command's origin, tag or payload size is out of range")
    return tuple(map(Command, origins, tags, payloads))


@given(st.lists(st.sampled_from([0, 1, -1, 2**64, 2**64 - 1, True, b"", b"ab", "s", None]),
                max_size=9))
def test_batch_decoding_matches_the_old_decoder(flat: list[Any]) -> None:
    assert outcome(lambda raw: codec._decode_batch(raw, "b"), flat) == \
        outcome(lambda raw: old_decode_batch(raw, "b"), flat)
    decoded = outcome(lambda raw: codec._decode_batch(raw, "b"), flat)
    if decoded[0] == "decoded":
        assert all(type(command) is Command for command in decoded[1])


odd_field = st.sampled_from([-2, -1, 0, 1, 5, 9, True, None, (), (0,), (-1, 3), (9,),
                             (Command(0, 1, b""),), (Command(8, 1, b""),), 2**31, 2**31 - 1])


@given(st.sampled_from(MESSAGE_TYPES).flatmap(strategy_for_class), replicas, st.data())
def test_check_message_matches_the_full_checks(message: Message, replica_count: int,
                                               data: st.DataObject) -> None:
    assert check_message(message, replica_count) == check_message_fully(message,
                                                                        replica_count)
    names = [item.name for item in dataclasses.fields(message)]
    changes = data.draw(st.dictionaries(st.sampled_from(names), odd_field, max_size=2))
    changed = message
    for name, value in changes.items():
        object.__setattr__(changed := dataclasses.replace(changed), name, value)
    assert verdict(check_message, changed, replica_count) == \
        verdict(check_message_fully, changed, replica_count)


def verdict(check: Any, message: Message, replica_count: int) -> Any:
    """The reason, or the kind of error a value of the wrong type raises (both raise alike)."""
    try:
        return check(message, replica_count)
    except (TypeError, AttributeError) as error:
        return type(error)


def test_every_class_has_a_compiled_codec() -> None:
    assert set(codec._MESSAGE_ENCODERS) == set(MESSAGE_TYPES)
    assert set(codec._RECORD_ENCODERS) == set(RECORD_TYPES)
    assert set(codec._MESSAGE_DECODERS) == {cls.TAG for cls in MESSAGE_TYPES}
    assert set(codec._RECORD_DECODERS) == {cls.TAG for cls in RECORD_TYPES}
