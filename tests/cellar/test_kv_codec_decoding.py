"""The key-value codec refuses any malformed input with InvalidMessage, and nothing else: a
snapshot's item that is not a [key, value] pair, random bytes, and inputs near valid requests,
replies and snapshots (the store's machine turns InvalidMessage into BAD_REQUEST, and a replica
restoring a snapshot expects it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellar.kv.codec import (
    Code,
    decode_reply,
    decode_request,
    decode_snapshot,
    encode_get,
    encode_put,
    encode_reply,
    encode_snapshot,
)
from consensus.codec import pack
from consensus.errors import InvalidMessage
from tests.decoding import FUZZ, near, raises_only


@pytest.mark.parametrize("item", [[], [b"k"]])
def test_a_snapshot_item_short_of_a_pair_is_refused(item: list[bytes]) -> None:
    with pytest.raises(InvalidMessage, match=r"kv\.item: expected 2 fields"):
        decode_snapshot(pack([[item], [], 0]))


VALID = [encode_put(b"k", b"v"), encode_get(b"k"), encode_reply(Code.OK, b"v"),
         encode_reply(Code.STORE_FULL),
         encode_snapshot({b"a": b"b", b"c": b""}, [("node:n0/s", 3, b"r", 5, 7)], 9)]


@FUZZ
@given(near(st.sampled_from(VALID)))
def test_inputs_near_valid_encodings_only_ever_give_invalid_message(data: bytes) -> None:
    for decode in (decode_request, decode_reply, decode_snapshot):
        raises_only(decode, data, InvalidMessage)
