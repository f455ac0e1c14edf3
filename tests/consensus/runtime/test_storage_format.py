"""Reading the record log's frames: a torn tail is told from damage, whatever the payloads hold.

Goal: a crash mid-append leaves a prefix of a valid log, and every prefix opens by cutting the
tail, even when the commands in it carry bytes that form valid frames (a client chooses them:
before, one inside the torn frame made the tear look like damage, and the replica refused to
restart); a byte flipped anywhere in a frame with valid frames after it is still refused,
a damaged length included (which the search after the declared end alone would take for a
tear, dropping the records after it).

Method: Hypothesis builds logs of C-accept records whose command bodies mix random bytes with
valid-looking frames (single, or back to back), then cuts them at any byte, or flips any byte
of any frame but the last; `scan` reads the result as opening does."""

from __future__ import annotations

import itertools
import pathlib
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.codec import encode_record
from consensus.messages import Command
from consensus.records import CAcceptRecord, Record, ViewRecord
from consensus.runtime.crc import crc32_combine
from consensus.runtime.storage_errors import LogCorrupt
from consensus.runtime.storage_format import (
    DAMAGE_ENDS_MAX,
    HEADER_SIZE,
    frame,
    header,
    scan,
)

PATH = pathlib.Path("records.log")


def fake_frame(payload: bytes) -> bytes:
    """A valid-looking frame, as any client can put in a command's body."""
    length = struct.pack(">I", len(payload))
    return b"\xc1rec" + struct.pack(">I", zlib.crc32(length + payload)) + length + payload


SEGMENTS = st.one_of(
    st.binary(max_size=300),
    st.binary(min_size=1, max_size=60).map(fake_frame),
    st.lists(st.binary(min_size=1, max_size=20).map(fake_frame), min_size=2, max_size=6)
    .map(b"".join))
BODIES = st.lists(SEGMENTS, max_size=5).map(b"".join)
RECORDS = st.lists(st.one_of(
    st.builds(lambda index, body: CAcceptRecord(space=0, index=index, ballot=1,
                                                batch=(Command(0, index + 1, body),)),
              st.integers(0, 1000), BODIES),
    st.integers(0, 50).map(lambda view: ViewRecord(view=view))), min_size=1, max_size=6)


def log_of(records: list[Record]) -> tuple[bytes, list[int]]:
    """The log's bytes and where each frame starts (the file's size last)."""
    data, starts = bytearray(header()), []
    for record in records:
        starts.append(len(data))
        data += frame(encode_record(record))
    return bytes(data), [*starts, len(data)]


@settings(max_examples=200)
@given(RECORDS, st.data())
def test_every_prefix_of_a_valid_log_opens_by_cutting_the_tail(records: list[Record],
                                                               data: st.DataObject) -> None:
    log, starts = log_of(records)
    cut = data.draw(st.integers(HEADER_SIZE, len(log)), label="cut")
    scanned = scan(log[:cut], PATH)
    whole = [start for start, end in itertools.pairwise(starts) if end <= cut]
    assert [offset for offset, _ in scanned.payloads] == whole
    torn_at = starts[len(whole)]
    assert scanned.end == min(torn_at, cut)
    assert bool(scanned.torn) == (cut > torn_at)


@settings(max_examples=200)
@given(RECORDS.filter(lambda records: len(records) >= 2), st.data())
def test_a_byte_flipped_in_a_frame_with_frames_after_it_is_refused(
        records: list[Record], data: st.DataObject) -> None:
    log, starts = log_of(records)
    damaged = data.draw(st.integers(0, len(records) - 2), label="frame")
    position = data.draw(st.integers(starts[damaged], starts[damaged + 1] - 1), label="byte")
    flipped = bytearray(log)
    flipped[position] ^= data.draw(st.integers(1, 255), label="xor")
    with pytest.raises(LogCorrupt) as refused:
        scan(bytes(flipped), PATH)
    assert refused.value.offset == starts[damaged]


def test_a_torn_frame_full_of_valid_looking_frames_is_cut() -> None:
    """The reviewer's case: a crafted body torn in half opens, as a plain one does."""
    body = fake_frame(b"\x01") * 40 + b"A" * 4000
    record = frame(encode_record(CAcceptRecord(space=0, index=0, ballot=1,
                                               batch=(Command(0, 1, body),))))
    log = header() + frame(encode_record(ViewRecord(view=1))) + record[:len(record) // 2]
    scanned = scan(log, PATH)
    assert len(scanned.payloads) == 1 and "cut short" in scanned.torn


def test_a_last_frame_whole_but_for_its_length_is_refused() -> None:
    """Its true length ends it at the end of the file: a damaged record, not a tear."""
    last = bytearray(frame(b"\x92\x01\x02"))
    last[8:12] = struct.pack(">I", 300)
    log = header() + frame(encode_record(ViewRecord(view=1))) + bytes(last)
    with pytest.raises(LogCorrupt, match="its length is damaged"):
        scan(log, PATH)


def test_too_many_valid_looking_frames_to_judge_are_refused_not_guessed() -> None:
    body = fake_frame(b"\x01") * (DAMAGE_ENDS_MAX + 1)
    record = frame(encode_record(CAcceptRecord(space=0, index=0, ballot=1,
                                               batch=(Command(0, 1, body),))))
    log = header() + record[:-1]
    with pytest.raises(LogCorrupt, match="cannot be told"):
        scan(log, PATH)


@settings(max_examples=100)
@given(st.binary(max_size=2000), st.binary(max_size=5000))
def test_crc32_combine_is_the_crc_of_the_concatenation(first: bytes, second: bytes) -> None:
    assert crc32_combine(zlib.crc32(first), zlib.crc32(second), len(second)) == \
        zlib.crc32(first + second)
