"""The message and record codec: every type round-trips; malformed input is refused with the
field named; semantic checks catch replica ids outside the group."""

from __future__ import annotations

import dataclasses
import threading
import typing
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from consensus.codec import (
    decode_message,
    decode_messages,
    decode_record,
    encode_message,
    encode_messages,
    encode_record,
    frame_of_encoded,
    pack,
)
from consensus.errors import InvalidMessage
from consensus.messages import (
    MESSAGE_TYPES,
    TAG_EPOCH_MAX,
    Batch,
    CAccept,
    Command,
    Message,
    OAccept,
    OCommit,
    Vote,
    check_message,
)
from consensus.records import RECORD_TYPES, Record
from tests.decoding import FUZZ, near, raises_only

REPLICAS = 5
_NEGATIVE_OK = {"max_index", "c_max_index", "values", "o_values", "value", "executed_upto"}
commands = st.builds(Command, st.integers(0, REPLICAS - 1), st.integers(0, 2**63),
                     st.binary(max_size=24))
batches: st.SearchStrategy[Batch] = st.lists(commands, max_size=4).map(tuple)


def strategy_for(hint: Any, name: str) -> st.SearchStrategy[Any]:
    if hint == Batch:
        return batches
    if hint is int:
        if name in ("sender", "space", "origin"):
            return st.integers(0, REPLICAS - 1)
        if name in ("values", "o_values", "value"):
            return st.integers(-1, REPLICAS - 1)
        if name == "tag_epoch":  # a command tag carries at most TAG_EPOCH_MAX
            return st.integers(0, TAG_EPOCH_MAX)
        return st.integers(-1 if name in _NEGATIVE_OK else 0, 2**40)
    if hint is bool:
        return st.booleans()
    if hint is bytes:
        return st.binary(max_size=40)
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        size = REPLICAS if name in ("c_max_index", "c_promised", "exec_counts", "o_counts",
                                    "dedup_low", "dedup_tags") else None
        items = st.lists(strategy_for(arguments[0], name),
                         min_size=size or 0, max_size=size or 4)
        return items.map(tuple)
    if arguments and type(None) in arguments:
        inner = next(argument for argument in arguments if argument is not type(None))
        return st.none() | strategy_for(inner, name)
    if dataclasses.is_dataclass(hint):
        return strategy_for_class(hint)
    raise TypeError(hint)


def strategy_for_class(cls: Any) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    built = st.builds(cls, **{item.name: strategy_for(hints[item.name], item.name)
                              for item in dataclasses.fields(cls)})
    if cls is OCommit:  # one value per slot, as check_message demands
        return built.map(lambda commit: dataclasses.replace(
            commit, slots=commit.slots[:len(commit.values)],
            values=commit.values[:len(commit.slots)]))
    return built


any_message = st.one_of([strategy_for_class(cls) for cls in MESSAGE_TYPES])
any_record = st.one_of([strategy_for_class(cls) for cls in RECORD_TYPES])


@given(any_message)
def test_every_message_round_trips(message: Message) -> None:
    assert decode_message(encode_message(message)) == message
    assert check_message(message, REPLICAS) is None


def test_an_o_commit_without_one_value_per_slot_is_refused() -> None:
    commit = OCommit(sender=1, view=0, slots=(4, 5), values=(1,))
    assert check_message(commit, REPLICAS) == "OCommit.values: not one per slot"


@given(st.lists(any_message, max_size=5))
def test_frames_of_several_messages_round_trip(messages: list[Message]) -> None:
    assert decode_messages(encode_messages(messages)) == messages


@given(st.lists(any_message, max_size=20))
def test_a_frame_built_from_encoded_messages_is_the_same_frame(messages: list[Message]) -> None:
    encoded = [encode_message(message) for message in messages]
    assert frame_of_encoded(encoded) == encode_messages(messages)


@given(any_record)
def test_every_record_round_trips(record: Record) -> None:
    assert decode_record(encode_record(record)) == record


@given(st.binary(max_size=80))
def test_garbage_frames_are_refused_not_crashed_on(data: bytes) -> None:
    try:
        decoded = decode_messages(data)
    except InvalidMessage as error:
        assert error.reason
    else:
        assert all(isinstance(message, Message) for message in decoded)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ([999, 0, 0], "unknown tag"),
        ([], "empty"),
        ([10, 0, 0, 1, 0, 1], "expected 6 fields"),
        ([10, 0, 0, 1, -5, 1, []], "CAccept.index"),
        ([10, 0, "view", 1, 0, 1, []], "CAccept.view"),
        ([10, 0, 0, 1, 0, 1, [0, 1]], "whole number of commands"),
        ([10, 0, 0, 1, 0, 1, [0, 1, "text"]], "origin, int tag, bytes payload"),
        ([10, 0, 0, 1, 0, 1, [-1, 1, b"x"]], "out of range"),
        ([20, 0, 0, 0, [0, "one"], 0], "OAccept.values"),
        ([20, 0, 0, 0, [0, -2], 0], "OAccept.values"),
            ([20, 0, 0, 0, [0], -1], "OAccept.durable_end"),
    ],
)
def test_malformed_messages_name_what_is_wrong(raw: list[Any], reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        decode_message(pack(raw))


def test_oversized_frames_are_refused_before_decoding() -> None:
    with pytest.raises(InvalidMessage, match="more than"):
        decode_message(b"\x90" * (33 << 20))


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (CAccept(7, 0, 1, 0, 1, ()), "sender"),
        (CAccept(0, 0, 9, 0, 1, ()), "space"),
        (CAccept(0, 0, 1, 0, 1, (Command(8, 1, b""),)), "origin"),
        (OAccept(0, 0, 0, (1, 6), 0), "values"),
        (Vote(0, 1, 0, 0, (), (0, 0), 0, 0), "c_max_index"),
    ],
)
def test_check_message_catches_replicas_outside_the_group(message: Message,
                                                           reason: str) -> None:
    found = check_message(message, REPLICAS)
    assert found is not None and reason in found


def test_a_failed_pack_leaves_the_shared_packer_clean_on_every_thread() -> None:
    """`pack` reuses idle msgpack Packers; a value one cannot pack must not leave bytes behind
    for the next, and a thread packing while another does gets a packer of its own."""
    with pytest.raises(TypeError):
        pack([1, object()])
    assert pack([1, b"x", "y"]) == msgpack.packb([1, b"x", "y"], use_bin_type=True)
    results: list[bytes] = []
    worker = threading.Thread(target=lambda: results.append(pack({"k": [2, b"z"]})))
    worker.start()
    worker.join()
    assert results == [msgpack.packb({"k": [2, b"z"]}, use_bin_type=True)]


@pytest.mark.parametrize(("decode", "valid"), [
    (decode_messages, st.lists(any_message, max_size=3).map(encode_messages)),
    (decode_message, any_message.map(encode_message)),
    (decode_record, any_record.map(encode_record)),
], ids=["messages", "message", "record"])
def test_inputs_near_a_valid_encoding_are_only_ever_refused(
        decode: typing.Callable[[bytes], object], valid: st.SearchStrategy[bytes]) -> None:
    """Random bytes, valid frames and records with bytes changed, and valid ones with a node of
    their msgpack tree replaced: InvalidMessage, or a value, never another exception (a peer's
    frame that raised anything else would stop the replica)."""
    @FUZZ
    @given(near(valid))
    def check(data: bytes) -> None:
        raises_only(decode, data, InvalidMessage)

    check()
