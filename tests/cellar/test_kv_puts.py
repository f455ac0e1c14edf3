"""PUTS, several puts in one command (a client's batch of its callers' puts): its codec keeps
its bounds and its one encoding, and the machine applies it as the same puts one by one, each
refused alone when the store is full, exactly once as one command of its session."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from cellar.kv import machine as kv_machine
from cellar.kv.codec import (
    ITEM_OVERHEAD_BYTES,
    KEY_BYTES_MAX,
    OK_REPLY,
    PUTS_BYTES_MAX,
    PUTS_MAX,
    VALUE_BYTES_MAX,
    Code,
    decode_puts,
    decode_puts_reply,
    decode_reply,
    decode_request,
    encode_put,
    encode_puts,
    encode_puts_reply,
    encode_reply,
)
from cellar.kv.machine import KvMachine
from consensus.codec import pack
from consensus.errors import InvalidMessage
from tests.cellar.test_kv_machine import envelope, get
from tests.decoding import FUZZ, near, raises_only

keys = st.binary(max_size=8)
values = st.binary(max_size=64)
pairs = st.lists(st.tuples(keys, values), min_size=1, max_size=12)


@given(pairs)
def test_puts_round_trip_in_order(batch: list[tuple[bytes, bytes]]) -> None:
    assert decode_puts(encode_puts(batch)) == batch


@given(st.lists(st.sampled_from(list(Code)), min_size=1, max_size=PUTS_MAX))
def test_a_code_for_each_put_round_trips_and_all_ok_is_the_constant(codes: list[Code]) -> None:
    reply = encode_puts_reply(codes)
    assert decode_puts_reply(reply, len(codes)) == codes
    assert (reply == OK_REPLY) == all(code is Code.OK for code in codes)


@pytest.mark.parametrize("code", [Code.BAD_REQUEST, Code.SESSIONS_FULL, Code.STALE_SEQUENCE])
def test_a_command_refused_whole_refuses_each_of_its_puts(code: Code) -> None:
    assert decode_puts_reply(encode_reply(code), 3) == [code] * 3


def test_a_reply_with_codes_for_another_count_is_refused() -> None:
    with pytest.raises(InvalidMessage, match="expected OK and 3 codes, got OK and 2"):
        decode_puts_reply(encode_puts_reply([Code.OK, Code.STORE_FULL]), 3)


def test_the_bounds_hold_at_their_edges() -> None:
    assert len(decode_puts(encode_puts([(b"k", b"")] * PUTS_MAX))) == PUTS_MAX
    largest = [(b"k" * KEY_BYTES_MAX, b"v" * VALUE_BYTES_MAX)]
    assert decode_puts(encode_puts(largest)) == largest  # the largest put fits alone
    with pytest.raises(InvalidMessage, match=r"kv\.puts: 1026 items, more than 1024"):
        decode_puts(encode_puts([(b"k", b"")] * (PUTS_MAX + 1)))
    with pytest.raises(InvalidMessage, match=f"kv puts: .* bytes, more than {PUTS_BYTES_MAX}"):
        decode_puts(encode_puts([(b"k", b"v" * VALUE_BYTES_MAX)] * 4))
    assert len(encode_puts([(b"k", b"v" * VALUE_BYTES_MAX)] * 4)) > PUTS_BYTES_MAX


@pytest.mark.parametrize(("data", "fault"), [
    (pack([3, []]), "expected key and value pairs, got 0 fields"),
    (pack([3, [b"k"]]), "expected key and value pairs, got 1 fields"),
    (pack([3, [b"k", "v"]]), "kv.value"),
    (pack([3, [b"k" * (KEY_BYTES_MAX + 1), b"v"]]), "kv.key"),
    (pack([3, b"kv"]), "kv.puts"),
    (pack([3]), "not encoded as encode_puts"),  # [3] alone: no list of puts
    (b"\xdc\x00\x02\x03" + pack([b"k", b"v"]), "not encoded as encode_puts"),  # array 16
])
def test_malformed_puts_are_refused_naming_the_fault(data: bytes, fault: str) -> None:
    with pytest.raises(InvalidMessage, match=re.escape(fault)):
        decode_puts(data)


def test_a_puts_is_no_single_request() -> None:
    with pytest.raises(InvalidMessage, match="a PUTS is read by decode_puts"):
        decode_request(encode_puts([(b"k", b"v")]))


VALID = [encode_puts([(b"k", b"v"), (b"", b"w")]), encode_puts_reply([Code.OK, Code.STORE_FULL]),
         OK_REPLY, encode_reply(Code.STALE_SEQUENCE)]


@FUZZ
@given(near(st.sampled_from(VALID)))
def test_inputs_near_valid_encodings_only_ever_give_invalid_message(data: bytes) -> None:
    raises_only(decode_puts, data, InvalidMessage)
    raises_only(lambda raw: decode_puts_reply(raw, 2), data, InvalidMessage)


@given(st.lists(st.tuples(st.integers(0, 2), pairs), max_size=20))
def test_a_batch_applies_as_its_puts_one_by_one_and_a_retry_changes_nothing(
        script: list[tuple[int, list[tuple[bytes, bytes]]]]) -> None:
    batched, one_by_one = KvMachine(), KvMachine()
    sequences = [0, 0, 0]
    singles = 0
    for session, batch in script:
        sequences[session] += 1
        command = envelope(f"s{session}", sequences[session], encode_puts(batch))
        reply = batched.apply(command)
        assert reply == OK_REPLY
        assert batched.apply(command) == reply  # a retry: the cached reply
        for key, value in batch:
            singles += 1
            assert one_by_one.apply(envelope("one", singles, encode_put(key, value))) == OK_REPLY
    assert batched.data == one_by_one.data
    assert list(batched.data) == list(one_by_one.data)  # the same order: snapshots agree
    assert batched.data_bytes == one_by_one.data_bytes


def test_a_full_store_refuses_the_puts_that_do_not_fit_and_applies_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_machine, "DATA_BYTES_MAX", 20 + 2 * ITEM_OVERHEAD_BYTES)
    machine = KvMachine()
    batch = [(b"a", b"x" * 9), (b"b", b"y" * 10), (b"a", b"x"), (b"c", b"z" * 5)]
    command = envelope("s", 1, encode_puts(batch))
    reply = machine.apply(command)
    # a: 10 bytes; b: 21 would pass 20; a again: 2 bytes; c: 2 + 6 = 8
    assert decode_puts_reply(reply, 4) == [Code.OK, Code.STORE_FULL, Code.OK, Code.OK]
    assert (get(machine, b"a"), get(machine, b"b"), get(machine, b"c")) == (b"x", None, b"z" * 5)
    assert machine.apply(command) == reply and get(machine, b"a") == b"x"  # retried: no change


@given(st.lists(pairs, max_size=8), st.integers(0, 200), st.integers(0, 12))
# b grows past the bound before a shrinks: alone, b is refused, though the batch would end
# inside it (44 bytes held, 44 + 10 - 9 <= 52)
@example([[(b"a", b"x" * 10), (b"b", b"")], [(b"b", b"y" * 10), (b"a", b"x")]],
         20 + 2 * ITEM_OVERHEAD_BYTES, 12)
def test_near_its_bounds_a_batch_decides_each_put_as_one_by_one(
        batches: list[list[tuple[bytes, bytes]]], data_bytes_max: int, keys_max: int) -> None:
    """Whether a batch's puts are stored all at once or one at a time, each put gets the code
    it would get alone, and the store ends the same."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kv_machine, "DATA_BYTES_MAX", data_bytes_max)
        patch.setattr(kv_machine, "KEYS_MAX", keys_max)
        batched, one_by_one = KvMachine(), KvMachine()
        singles = 0
        for sequence, batch in enumerate(batches, 1):
            reply = batched.apply(envelope("s", sequence, encode_puts(batch)))
            alone = []
            for key, value in batch:
                singles += 1
                alone.append(decode_reply(one_by_one.apply(
                    envelope("one", singles, encode_put(key, value))))[0])
            assert decode_puts_reply(reply, len(batch)) == alone
            assert batched.data == one_by_one.data
            assert batched.data_bytes == one_by_one.data_bytes <= data_bytes_max
            assert len(batched.data) <= keys_max


def test_a_batch_under_a_stale_sequence_is_refused_whole() -> None:
    machine = KvMachine()
    machine.apply(envelope("s", 2, encode_put(b"k", b"v")))
    reply = machine.apply(envelope("s", 1, encode_puts([(b"k", b"old"), (b"j", b"old")])))
    assert decode_puts_reply(reply, 2) == [Code.STALE_SEQUENCE] * 2
    assert get(machine, b"k") == b"v" and get(machine, b"j") is None


def test_a_puts_not_in_its_one_encoding_is_a_bad_request() -> None:
    machine = KvMachine()
    other = b"\xdc\x00\x02\x03" + pack([b"k", b"v"])  # [3, [k, v]] with a 16-bit array header
    assert decode_reply(machine.apply(envelope("s", 1, other)))[0] is Code.BAD_REQUEST
    assert get(machine, b"k") is None
