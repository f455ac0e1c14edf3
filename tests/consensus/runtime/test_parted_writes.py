"""A snapshot record written without a copy of its state: `encode_records_parted` hands the
state back as a part of its own, `frame_parts` frames a payload given as parts as if it were
their concatenation, and `write_parts` writes parts one after another (os.writev) through
whatever short writes the kernel makes."""

from __future__ import annotations

import os
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.codec import encode_records, encode_records_parted
from consensus.messages import SnapshotMeta
from consensus.records import Record, SnapshotRecord
from consensus.runtime import durable_file
from consensus.runtime.durable_file import write_parts
from consensus.runtime.storage_format import frame_key, frame_parts, frames
from tests.consensus.test_codec import any_record

KEY = frame_key(bytes.fromhex("5a17c0ffee5a17ed"))
# State sizes about each of msgpack's bin heads (8, 16 and 32-bit lengths)
STATE_BYTES = [0, 1, 255, 256, 65_535, 65_536, 70_000]


def snapshot(state: bytes) -> SnapshotRecord:
    return SnapshotRecord(SnapshotMeta(7, (3, 4), (1, 2), (0, 0), ((), (5,))), state)


any_snapshot = st.sampled_from(STATE_BYTES).map(lambda size: snapshot(os.urandom(size)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(any_record, any_snapshot), max_size=6))
def test_parted_encodings_join_to_the_plain_ones(records: list[Record]) -> None:
    parted = encode_records_parted(records)
    joined = [b"".join(payload) if isinstance(payload, list) else payload for payload in parted]
    assert joined == encode_records(records)
    assert frames(joined, KEY) == b"".join(frame_parts(parted, KEY))


@pytest.mark.parametrize("state_bytes", STATE_BYTES)
def test_a_snapshots_state_is_its_own_part_not_a_copy(state_bytes: int) -> None:
    record = snapshot(os.urandom(state_bytes))
    [payload] = encode_records_parted([record])
    assert isinstance(payload, list) and payload[-1] is record.state


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(st.binary(max_size=300), max_size=40),
       cuts=st.lists(st.integers(1, 500), min_size=1, max_size=20),
       iov_max=st.integers(1, 8))
def test_write_parts_writes_every_byte_in_order_through_short_writes(
        tmp_path_factory: pytest.TempPathFactory, parts: list[bytes], cuts: list[int],
        iov_max: int) -> None:
    """The kernel may write less than asked (a signal, a full pipe, a 2 GiB cap): here each
    writev writes at most the next of `cuts` bytes, and takes at most `iov_max` parts."""
    path = tmp_path_factory.mktemp("parts") / "file"
    writev, calls = os.writev, [0]

    def short_writev(fd: int, buffers: list[bytes]) -> int:
        assert len(buffers) <= iov_max
        limit = cuts[calls[0] % len(cuts)]
        calls[0] += 1
        data = b"".join(bytes(buffer) for buffer in buffers)[:limit]
        return writev(fd, [data])

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    patch = pytest.MonkeyPatch()
    patch.setattr(os, "writev", short_writev)
    patch.setattr(durable_file, "IOV_MAX", iov_max)
    try:
        write_parts(fd, parts)
    finally:
        patch.undo()
        os.close(fd)
    assert pathlib.Path(path).read_bytes() == b"".join(parts)


def test_write_parts_takes_more_parts_than_one_writev_may() -> None:
    parts = [bytes([index % 251]) * (index % 7) for index in range(3 * durable_file.IOV_MAX + 5)]
    read, write = os.pipe()
    try:
        write_parts(write, parts)
        os.close(write)
        received = b""
        while chunk := os.read(read, 1 << 16):
            received += chunk
    finally:
        os.close(read)
    assert received == b"".join(parts)
