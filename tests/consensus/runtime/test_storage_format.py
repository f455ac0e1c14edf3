"""Reading the record log's frames: a torn tail is told from damage, whatever the payloads hold.

Goal, in both format versions: a crash mid-append leaves a prefix of a valid log, and every
prefix opens by cutting the tail, even when the commands in it carry bytes that form valid
version-1 frames (a client chooses them: before, one inside the torn frame made the tear look
like damage, and the replica refused to restart); a byte flipped anywhere in a frame with valid
frames after it is still refused, a damaged length included (which the search after the
declared end alone would take for a tear, dropping the records after it); a last frame that is
whole but for its marker or length is refused. In version 2, whose checksums start from the
file's salt, a burst of damage anywhere before the last frame is refused, or changes nothing.

Method: Hypothesis builds logs of C-accept records whose command bodies mix random bytes with
valid-looking version-1 frames (single, or back to back), then cuts them at any byte, flips any
byte of any frame but the last, or garbles a run of bytes; `scan` reads the result as opening
does."""

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
from consensus.runtime import storage_format
from consensus.runtime.crc import crc32_combine
from consensus.runtime.storage_errors import LogCorrupt
from consensus.runtime.storage_format import (
    DAMAGE_ENDS_MAX,
    FRAME_OVERHEAD,
    HEADER_SIZE,
    MAGIC,
    PREFIX_SIZE,
    VERSION_1_KEY,
    FrameKey,
    frame,
    frame_key,
    header,
    scan,
)

PATH = pathlib.Path("records.log")
SALT = bytes.fromhex("5a17c0ffee5a17ed")


def fake_frame(payload: bytes) -> bytes:
    """A valid-looking frame, as any client can put in a command's body: a valid frame of a
    version-1 log (whose checksums start from 0, not from a salt)."""
    length = struct.pack(">I", len(payload))
    return b"\xc1rec" + struct.pack(">I", zlib.crc32(length + payload)) + length + payload


def header_of(version: int, salt: bytes = SALT) -> bytes:
    if version > 1:
        return header(salt, version)
    prefix = MAGIC + struct.pack(">I", version)
    return prefix + struct.pack(">I", zlib.crc32(prefix))


def frame_of(payload: bytes, version: int, salt: bytes = SALT) -> bytes:
    return frame(payload, frame_key(salt) if version > 1 else VERSION_1_KEY)


def header_size(version: int) -> int:
    return HEADER_SIZE if version > 1 else PREFIX_SIZE


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


def log_of(records: list[Record], version: int = 2,
           salt: bytes = SALT) -> tuple[bytes, list[int]]:
    """The log's bytes and where each frame starts (the file's size last)."""
    data, starts = bytearray(header_of(version, salt)), []
    for record in records:
        starts.append(len(data))
        data += frame_of(encode_record(record), version, salt)
    return bytes(data), [*starts, len(data)]


def accept(body: bytes) -> bytes:
    return encode_record(CAcceptRecord(space=0, index=0, ballot=1,
                                       batch=(Command(0, 1, body),)))


VERSIONS = pytest.mark.parametrize("version", [1, 2, 3])


@VERSIONS
@settings(max_examples=200)
@given(records=RECORDS, data=st.data())
def test_every_prefix_of_a_valid_log_opens_by_cutting_the_tail(
        version: int, records: list[Record], data: st.DataObject) -> None:
    log, starts = log_of(records, version)
    cut = data.draw(st.integers(header_size(version), len(log)), label="cut")
    scanned = scan(log[:cut], PATH)
    whole = [start for start, end in itertools.pairwise(starts) if end <= cut]
    assert [offset for offset, _ in scanned.payloads] == whole
    torn_at = starts[len(whole)]
    assert scanned.end == min(torn_at, cut)
    assert bool(scanned.torn) == (cut > torn_at)


@VERSIONS
@settings(max_examples=200)
@given(records=RECORDS.filter(lambda records: len(records) >= 2), data=st.data())
def test_a_byte_flipped_in_a_frame_with_frames_after_it_is_refused(
        version: int, records: list[Record], data: st.DataObject) -> None:
    log, starts = log_of(records, version)
    damaged = data.draw(st.integers(0, len(records) - 2), label="frame")
    position = data.draw(st.integers(starts[damaged], starts[damaged + 1] - 1), label="byte")
    flipped = bytearray(log)
    flipped[position] ^= data.draw(st.integers(1, 255), label="xor")
    with pytest.raises(LogCorrupt) as refused:
        scan(bytes(flipped), PATH)
    assert refused.value.offset == starts[damaged]


def test_garbage_that_repeats_the_bytes_it_overwrites_is_judged_by_what_it_changed() -> None:
    """Hypothesis found it: zeros written from the last byte of frame 0 (a zero already) on
    change frames 1 and 2 only, a tear of the last two frames' append: frame 0 reads back."""
    records: list[Record] = [CAcceptRecord(0, 0, 1, (Command(0, 1, b"\x00"),)),
                             CAcceptRecord(0, 0, 1, (Command(0, 1, b""),)),
                             CAcceptRecord(0, 0, 1, (Command(0, 1, b""),))]
    log, starts = log_of(records, salt=bytes(8))
    garbled = bytearray(log)
    garbled[starts[1] - 1:starts[2] + 1] = bytes(starts[2] + 2 - starts[1])
    assert garbled[starts[1] - 1] == log[starts[1] - 1]  # the run's first byte changed nothing
    scanned = scan(bytes(garbled), PATH)
    assert [payload for _, payload in scanned.payloads] == [encode_record(records[0])]
    assert scanned.torn


@settings(max_examples=300)
@given(records=RECORDS, salt=st.binary(min_size=8, max_size=8), data=st.data())
def test_a_garbled_run_of_bytes_before_the_last_frame_is_refused_or_harmless(
        records: list[Record], salt: bytes, data: st.DataObject) -> None:
    """Version 2: 1 to 64 bytes anywhere (the header included) overwritten with anything.
    Unless the run lies wholly inside the last frame (a torn tail's place), the log is refused
    or reads back whole: never are records before the last frame cut off as a tear. A run that
    reaches into the last frame from an earlier one looks like an unsynced append of several
    frames torn by a power loss: then the log may also read back as every frame before the
    first one the run touches."""
    log, starts = log_of(records, salt=salt)
    last = starts[-2]
    size = data.draw(st.integers(1, 64), label="size")
    start = data.draw(st.integers(0, max(0, min(last - 1, len(log) - size))), label="start")
    garbage = data.draw(st.binary(min_size=size, max_size=size), label="garbage")
    garbled = bytearray(log)
    garbled[start:start + size] = garbage
    try:
        scanned = scan(bytes(garbled), PATH)
    except LogCorrupt:
        return
    payloads = [payload for _, payload in scanned.payloads]
    every = [encode_record(record) for record in records]
    if payloads == every:
        return
    # Judged by the bytes the run changed: garbage may repeat the bytes it overwrites.
    changed = [offset for offset in range(start, start + size) if garbled[offset] != log[offset]]
    first, end = changed[0], changed[-1] + 1
    assert end > last, "damage before the last frame was taken for a torn tail"
    first_touched = max(index for index, offset in enumerate(starts[:-1]) if offset <= first) \
        if first >= starts[0] else 0
    assert payloads == every[:first_touched] and scanned.torn


@VERSIONS
def test_a_torn_frame_full_of_valid_looking_frames_is_cut(version: int) -> None:
    """The reviewer's case: a crafted body torn in half opens, as a plain one does."""
    record = frame_of(accept(fake_frame(b"\x01") * 40 + b"A" * 4000), version)
    log = header_of(version) + frame_of(encode_record(ViewRecord(view=1)), version) + \
        record[:len(record) // 2]
    scanned = scan(log, PATH)
    assert len(scanned.payloads) == 1 and "cut short" in scanned.torn


@VERSIONS
@pytest.mark.parametrize("damage", ["length grown", "length shrunk", "length zeroed",
                                    "marker"])
def test_a_last_frame_whole_but_for_its_marker_or_length_is_refused(version: int,
                                                                    damage: str) -> None:
    """Every payload byte and the checksum are there: its true length ends it at the end of
    the file, a damaged record, not a tear (which cannot leave the checksum and payload
    whole)."""
    last = bytearray(frame_of(b"\x92\x01\x02", version))
    if damage == "marker":
        last[0] ^= 0x01
    else:
        last[8:12] = struct.pack(">I", {"length grown": 300, "length shrunk": 2,
                                       "length zeroed": 0}[damage])
    log = header_of(version) + frame_of(encode_record(ViewRecord(view=1)), version) + \
        bytes(last)
    with pytest.raises(LogCorrupt, match="its marker or length is damaged"):
        scan(log, PATH)


@pytest.mark.parametrize(("start", "garbage", "trailing"), [
    (11, b"\xff\xff", 3),  # 2 bytes: the length's last byte and the payload's first
    (10, b"\xff" * 4, 3),
    (8, b"\x0a\x3b\x5c\x7d\x99", 500),  # a random-looking length (171 MB) + 1 payload byte
])
def test_a_burst_over_a_middle_frames_length_and_payload_is_refused(
        start: int, garbage: bytes, trailing: int) -> None:
    """Version 2: a middle frame's length grown past the end of the file and its payload's
    first byte damaged, valid frames after it. Version 1 looked for later frames only after
    the declared end, past the file, and found no other length that validates the damaged
    payload: it cut off the frame and every synced record after it as a torn tail."""
    records = [ViewRecord(1), CAcceptRecord(0, 0, 1, (Command(0, 1, b"x" * 100),)),
               *(ViewRecord(view) for view in range(2, 2 + trailing))]
    log, starts = log_of(records)
    garbled = bytearray(log)
    garbled[starts[1] + start:starts[1] + start + len(garbage)] = garbage
    with pytest.raises(LogCorrupt) as refused:
        scan(bytes(garbled), PATH)
    assert refused.value.offset == starts[1]
    assert f"a valid record follows at offset {starts[2]}" in refused.value.problem


def test_frames_a_client_made_are_not_frames_of_a_version_2_log() -> None:
    """Valid-looking frames in a payload do not validate under the salt: a crafted torn frame
    full of them is cut (where version 1 cannot tell), and one damaged in its length before
    such a frame is not taken for a record ending there."""
    body = fake_frame(b"\x01") * (DAMAGE_ENDS_MAX + 1)
    log = header_of(2) + frame_of(accept(body), 2)[:-1]
    scanned = scan(log, PATH)
    assert scanned.payloads == [] and "cut short" in scanned.torn
    inner = frame_of(encode_record(ViewRecord(view=1)), 2, salt=bytes(8))  # another file's
    assert scan(header_of(2) + inner, PATH).payloads == []


def test_too_many_valid_looking_frames_to_judge_are_refused_not_guessed_in_version_1() -> None:
    body = fake_frame(b"\x01") * (DAMAGE_ENDS_MAX + 1)
    log = header_of(1) + frame_of(accept(body), 1)[:-1]
    with pytest.raises(LogCorrupt, match="cannot be told"):
        scan(log, PATH)


def test_each_header_version_is_read_with_its_salt() -> None:
    assert scan(header_of(1), PATH).header.key == VERSION_1_KEY
    for version in (2, 3):
        salted = scan(header_of(version), PATH).header
        assert (salted.version, salted.salt, salted.size) == (version, SALT, HEADER_SIZE)
        assert salted.key == FrameKey(b"\xc1" + SALT[:3], zlib.crc32(SALT))
    assert FRAME_OVERHEAD == 12 and (PREFIX_SIZE, HEADER_SIZE) == (16, 28)


@pytest.mark.parametrize(("damage", "words"), [
    (lambda data: data[:16] + bytes([data[16] ^ 1]) + data[17:], "checksum (over its salt)"),
    (lambda data: data[:27], "shorter than its 28-byte header"),
    (lambda data: data[:15], "shorter than any header"),
])
def test_a_damaged_version_2_header_is_refused(damage, words: str) -> None:
    with pytest.raises(LogCorrupt, match=words.replace("(", r"\(").replace(")", r"\)")):
        scan(damage(header_of(2) + frame_of(b"\x01", 2)), PATH)


@settings(max_examples=100)
@given(st.binary(max_size=2000), st.binary(max_size=5000))
def test_crc32_combine_is_the_crc_of_the_concatenation(first: bytes, second: bytes) -> None:
    assert crc32_combine(zlib.crc32(first), zlib.crc32(second), len(second)) == \
        zlib.crc32(first + second)


def test_a_torn_tail_of_client_placed_markers_checks_none_of_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A command body of fake frame headers (version 1's marker, a length of half the body),
    cut short by a crash: with markers a client can place, each one found after the bad frame
    cost a crc32 over its length (seconds for 600 kB at every restart). A version-2 marker
    holds 3 bytes of the salt, so no byte of that body is a candidate."""
    one = b"\xc1rec" + b"\0\0\0\0" + struct.pack(">I", 300_000)
    body = one * (600_000 // len(one))
    key = frame_key(SALT)
    first = frame(encode_record(CAcceptRecord(0, 0, 1, (Command(0, 1, b"a"),))), key)
    torn = frame(encode_record(CAcceptRecord(0, 1, 1, (Command(0, 2, body),))), key)
    checked: list[int] = []
    judge = storage_format.frame_problem

    def counted(data: bytes, offset: int, path: pathlib.Path, key: FrameKey) -> str:
        checked.append(offset)
        return judge(data, offset, path, key)

    monkeypatch.setattr(storage_format, "frame_problem", counted)
    scanned = scan(header(SALT) + first + torn[:-50], PATH)
    assert len(scanned.payloads) == 1 and scanned.torn
    assert checked == [scanned.end]  # the bad frame itself, nothing inside it
