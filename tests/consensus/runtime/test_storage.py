"""The durable record log on real files: records round-trip; a torn tail is cut off and
reported; damage anywhere else, a whole last record with a damaged header, a bad header or
another format version is refused with the file and offset named and nothing changed; a
version-1 log is rewritten in version 2 as it opens; creating never replaces a lost log; the
directory lock keeps a second opener out; a failed write or fsync stops the log for good;
compaction keeps a log that replays to the same replica, under a new salt.
"""

from __future__ import annotations

import errno
import os
import pathlib
import resource
import struct
import tempfile
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.codec import RECORD_BYTES_MAX, decode_record, encode_record
from consensus.messages import Command, SnapshotMeta
from consensus.prng import Prng
from consensus.record_log import compact_records
from consensus.records import (
    RECORD_TYPES,
    CAcceptRecord,
    Record,
    ReserveRecord,
    SnapshotRecord,
    ViewRecord,
)
from consensus.replica import Replica
from consensus.runtime import storage_errors
from consensus.runtime.storage import COMPACT_AFTER_BYTES, COMPACTING_NAME, LOG_NAME, DurableLog
from consensus.runtime.storage_errors import (
    DataDirectoryLocked,
    DataDirectoryMissing,
    LogCorrupt,
    LogVersionUnsupported,
    StorageError,
    StorageFailed,
)
from consensus.runtime.storage_format import (
    FRAME_OVERHEAD,
    MAGIC,
    PREFIX_SIZE,
    SALT_SIZE,
    VERSION_1_KEY,
    frame,
    frame_key,
    header,
    scan,
)
from consensus.runtime.storage_lock import LOCK_NAME, DirectoryLock
from jepsen.sim.options import SimOptions
from jepsen.sim.runner import build
from tests.consensus.runtime.workload import take
from tests.consensus.test_codec import any_record
from tests.consensus.test_record_log import raw_records, state_of

DANGER = "Do not simply delete the directory"


def write(directory: pathlib.Path, records: list[Record], *,
          compact_after_bytes: int = COMPACT_AFTER_BYTES, preallocate_bytes: int = 0) -> None:
    """A log of `records`, synced; by default with no zeros written ahead, so that its last
    frame ends the file."""
    with DurableLog.open(directory, create=True, compact_after_bytes=compact_after_bytes,
                         preallocate_bytes=preallocate_bytes) as log:
        log.append(records)
        log.sync()


def due_to_compact_at_sync(directory: pathlib.Path, records: list[Record]) -> DurableLog:
    """An open log holding `records`, every one durable but the last (not a snapshot), whose
    next `sync` compacts it: compaction's sync path, the snapshots durable before it (an
    append holding a snapshot compacts at once instead)."""
    assert not isinstance(records[-1], SnapshotRecord)
    write(directory, records[:-1])  # the default growth: nothing compacted yet
    log = DurableLog.open(directory, create=False, compact_after_bytes=1)
    log.records()
    log.append(records[-1:])
    assert log.compaction_due
    return log


def reopen(directory: pathlib.Path) -> list[Record]:
    with DurableLog.open(directory, create=False) as log:
        return log.records()


def frame_offsets(directory: pathlib.Path) -> list[int]:
    path = directory / LOG_NAME
    return [offset for offset, _ in scan(path.read_bytes(), path).payloads]


def on_disk(directory: pathlib.Path) -> list[Record]:
    """The records in the log file now, read without opening (or locking) it."""
    path = directory / LOG_NAME
    return [decode_record(payload) for _, payload in scan(path.read_bytes(), path).payloads]


def raw_frame(directory: pathlib.Path, payload: bytes) -> bytes:
    """A valid frame of the log in `directory`, whatever its payload."""
    path = directory / LOG_NAME
    return frame(payload, scan(path.read_bytes(), path).header.key)


def salt_of(directory: pathlib.Path) -> bytes:
    path = directory / LOG_NAME
    return scan(path.read_bytes(), path).header.salt


def damage(directory: pathlib.Path, offset: int, new: bytes) -> None:
    path = directory / LOG_NAME
    data = bytearray(path.read_bytes())
    data[offset:offset + len(new)] = new
    path.write_bytes(bytes(data))


def version_1_log(directory: pathlib.Path, records: list[Record]) -> bytes:
    """Write a log of format version 1 (no salt: checksums start from 0); its bytes."""
    prefix = MAGIC + struct.pack(">I", 1)
    data = prefix + struct.pack(">I", zlib.crc32(prefix)) + b"".join(
        [frame(encode_record(record), VERSION_1_KEY) for record in records])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / LOG_NAME).write_bytes(data)
    return data


# --- Round trips -------------------------------------------------------------------------------


@settings(max_examples=25)
@given(st.lists(st.lists(any_record, max_size=6), max_size=4))
def test_every_record_round_trips_through_the_disk(batches: list[list[Record]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = pathlib.Path(directory)
        write(path, [])
        for batch in batches:
            write(path, batch)
        assert reopen(path) == [record for batch in batches for record in batch]


def test_a_workload_of_every_record_type_round_trips(tmp_path: pathlib.Path) -> None:
    records = take(5, 400, snapshot_every=25)
    assert {type(record) for record in records} == set(RECORD_TYPES)
    with DurableLog.open(tmp_path, create=True) as log:
        assert log.recovery.created
        for start in range(0, len(records), 37):
            log.append(records[start:start + 37])
            log.sync()
        assert log.records() == []  # what was durable at open
    assert reopen(tmp_path) == records


def test_the_opened_records_are_handed_over_once(tmp_path: pathlib.Path) -> None:
    records = take(3, 20)
    write(tmp_path, records)
    with DurableLog.open(tmp_path, create=False) as log:
        assert log.records() == records
        with pytest.raises(RuntimeError, match="only once"):
            log.records()  # the log kept no reference to them


def test_a_large_snapshot_round_trips(tmp_path: pathlib.Path) -> None:
    meta = SnapshotMeta(9, (3, 4, 5), (3, 3, 3), (0, 0, 0), ((), (), ()))
    snapshot = SnapshotRecord(meta, os.urandom(5 << 20))
    write(tmp_path, [ViewRecord(2), snapshot, ViewRecord(3)], compact_after_bytes=64 << 20)
    assert reopen(tmp_path) == [ViewRecord(2), snapshot, ViewRecord(3)]


def test_create_makes_nested_directories_and_an_empty_log(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "a" / "b"
    with DurableLog.open(directory, create=True) as log:
        assert log.records() == []
        assert log.path == directory / LOG_NAME
    assert (directory / LOG_NAME).read_bytes()[:8] == MAGIC
    with DurableLog.open(directory, create=True) as log:  # create on an existing log: opens
        assert not log.recovery.created
        assert log.recovery.lines() == []


def test_create_makes_a_log_in_an_empty_directory(tmp_path: pathlib.Path) -> None:
    with DurableLog.open(tmp_path, create=True) as log:  # tmp_path exists, empty
        assert log.recovery.created
    assert sorted(path.name for path in tmp_path.iterdir()) == [LOCK_NAME, LOG_NAME]


@pytest.mark.parametrize("left", [[LOCK_NAME], [COMPACTING_NAME], [LOCK_NAME, COMPACTING_NAME],
                                  ["lost+found"]])
def test_create_does_not_replace_a_lost_log_in_a_used_directory(tmp_path: pathlib.Path,
                                                                left: list[str]) -> None:
    """`--init` on a directory that holds files but no log (a replica ran there: its lock
    file is left; or an unfinished compaction is) is refused, not given a new empty log that
    would make the replica forget its promises; the refusal itself adds no lock file."""
    for name in left:
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(DataDirectoryMissing) as raised, \
            DurableLog.open(tmp_path, create=True) as log:
        pytest.fail(f"opened a new empty log: {log.recovery.lines()}")
    message = str(raised.value)
    assert raised.value.exit_code == 66 and raised.value.path == tmp_path / LOG_NAME
    assert all(name in message for name in left) and "not empty" in message, message
    assert DANGER in message
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(left)


def test_create_does_not_replace_the_log_a_replica_wrote(tmp_path: pathlib.Path) -> None:
    write(tmp_path, [ViewRecord(1)])
    (tmp_path / LOG_NAME).unlink()
    with pytest.raises(DataDirectoryMissing, match="holds no record log, yet it is not empty"):
        DurableLog.open(tmp_path, create=True)
    assert not (tmp_path / LOG_NAME).exists()


def test_a_refused_open_without_create_leaves_an_empty_directory_empty(
        tmp_path: pathlib.Path) -> None:
    """Run without --init on a new replica's empty directory: refused, and --init then works
    (a lock file left behind would make it look used)."""
    with pytest.raises(DataDirectoryMissing, match="--init"):
        DurableLog.open(tmp_path, create=False)
    assert list(tmp_path.iterdir()) == []
    with DurableLog.open(tmp_path, create=True) as log:
        assert log.recovery.created


# --- Torn tails --------------------------------------------------------------------------------


@pytest.mark.parametrize("kept", [1, 4, 11, 12, 13, -1])
def test_a_torn_last_record_is_cut_off_and_reported(tmp_path: pathlib.Path, kept: int) -> None:
    records = take(1, 6)
    write(tmp_path, records)
    path = tmp_path / LOG_NAME
    last = frame_offsets(tmp_path)[-1]
    size = path.stat().st_size
    cut = size - 1 if kept == -1 else last + kept
    os.truncate(path, cut)
    with DurableLog.open(tmp_path, create=False, preallocate_bytes=0) as log:
        assert log.records() == records[:-1]
        assert (log.recovery.torn_offset, log.recovery.torn_bytes) == (last, cut - last)
        [line] = log.recovery.lines()
        assert str(path) in line and "never synced" in line
        assert path.stat().st_size == last
        log.append([ViewRecord(7)])
        log.sync()
    assert reopen(tmp_path) == [*records[:-1], ViewRecord(7)]


def test_a_bad_checksum_in_the_last_record_is_a_torn_tail(tmp_path: pathlib.Path) -> None:
    records = take(2, 5)
    write(tmp_path, records)
    path = tmp_path / LOG_NAME
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))
    with DurableLog.open(tmp_path, create=False) as log:
        assert log.records() == records[:-1]
        assert "checksum" in log.recovery.torn_reason


def test_a_zeroed_tail_is_kept_as_space_for_the_next_records(tmp_path: pathlib.Path) -> None:
    records = take(3, 5)
    write(tmp_path, records)
    path = tmp_path / LOG_NAME
    size = path.stat().st_size
    with path.open("ab") as file:
        file.write(bytes(8192))  # a file size that reached the disk before the data did
    with DurableLog.open(tmp_path, create=False, preallocate_bytes=0) as log:
        assert log.records() == records
        assert log.recovery.torn_bytes == 0 and log.recovery.lines() == []
        log.append([ViewRecord(9)])
        log.sync()
    assert path.stat().st_size == size + 8192  # the record went into the zeros
    assert reopen(tmp_path) == [*records, ViewRecord(9)]


# --- Corruption is refused ---------------------------------------------------------------------


def assert_refused(directory: pathlib.Path, error: type[StorageError], *words: str) -> None:
    path = directory / LOG_NAME
    before = path.read_bytes()
    with pytest.raises(error) as raised:
        DurableLog.open(directory, create=False)
    message = str(raised.value)
    assert str(path) in message and raised.value.path == path
    assert all(word in message for word in words), message
    assert path.read_bytes() == before  # nothing truncated or rewritten
    DirectoryLock.acquire(directory).release()  # the refusal released the lock


@pytest.mark.parametrize(("where", "delta", "xor"), [
    ("marker", 0, 0x01), ("crc", 5, 0x01), ("length", 9, 0x01), ("payload", FRAME_OVERHEAD + 2, 1),
    ("shorter length", 11, 0x04)])
def test_damage_before_valid_records_is_refused(tmp_path: pathlib.Path, where: str,
                                                delta: int, xor: int) -> None:
    write(tmp_path, take(4, 6))
    offsets = frame_offsets(tmp_path)
    path = tmp_path / LOG_NAME
    data = bytearray(path.read_bytes())
    data[offsets[2] + delta] ^= xor
    path.write_bytes(bytes(data))
    assert_refused(tmp_path, LogCorrupt, f"offset {offsets[2]}",
                   f"valid record follows at offset {offsets[3]}", DANGER, "majority")


BURST_RECORDS: list[Record] = [ViewRecord(1), CAcceptRecord(0, 0, 1, (Command(0, 1, b"x" * 100),))]


@pytest.mark.parametrize(("start", "garbage", "trailing"), [
    (11, b"\xff\xff", 3),  # 2 bytes: the length's last byte and the payload's first
    (10, b"\xff" * 4, 3),
    (8, b"\x0a\x3b\x5c\x7d\x99", 500),  # a random-looking length (171 MB) + 1 payload byte
])
def test_a_burst_over_a_middle_frames_length_and_payload_is_refused(
        tmp_path: pathlib.Path, start: int, garbage: bytes, trailing: int) -> None:
    """A few bytes of the C-accept's frame are garbled: (part of) its length, grown past the
    end of the file, and its payload's first byte; `trailing` synced records follow. Format
    version 1 looked for later frames only after the declared end, found none, and cut the
    frame and every record after it off as a write cut short by a crash."""
    records = [*BURST_RECORDS, *(ViewRecord(view) for view in range(2, 2 + trailing))]
    write(tmp_path, records)
    offsets = frame_offsets(tmp_path)
    damage(tmp_path, offsets[1] + start, garbage)
    assert_refused(tmp_path, LogCorrupt, f"offset {offsets[1]}",
                   f"valid record follows at offset {offsets[2]}")


@pytest.mark.parametrize("what", ["length shrunk by one", "length zeroed", "marker flipped"])
@pytest.mark.parametrize("version", [1, 2])
def test_a_whole_synced_last_record_with_a_damaged_header_is_refused(
        tmp_path: pathlib.Path, what: str, version: int) -> None:
    """The last frame is whole (every payload byte and its checksum intact) but its marker or
    length is damaged: a synced record, which a tear cannot leave so; it was cut off and
    reported as never synced."""
    records = take(4, 5)
    if version == 1:
        version_1_log(tmp_path, records)
    else:
        write(tmp_path, records)
    last = frame_offsets(tmp_path)[-1]
    length = (tmp_path / LOG_NAME).stat().st_size - last - FRAME_OVERHEAD
    if what == "length shrunk by one":
        damage(tmp_path, last + 8, struct.pack(">I", length - 1))
    elif what == "length zeroed":
        damage(tmp_path, last + 8, bytes(4))
    else:
        damage(tmp_path, last, b"\xc0")
    assert_refused(tmp_path, LogCorrupt, f"offset {last}", "its marker or length is damaged",
                   f"a length of {length} bytes")


def test_a_length_beyond_the_cap_is_refused_even_at_the_tail(tmp_path: pathlib.Path) -> None:
    write(tmp_path, take(5, 3))
    path = tmp_path / LOG_NAME
    marker = scan(path.read_bytes(), path).header.key.marker
    with path.open("ab") as file:
        file.write(marker + struct.pack(">II", 0, RECORD_BYTES_MAX + 1))
    assert_refused(tmp_path, LogCorrupt, "beyond the cap")


def test_a_checksummed_record_that_does_not_decode_is_refused(tmp_path: pathlib.Path) -> None:
    write(tmp_path, take(6, 3))
    path = tmp_path / LOG_NAME
    offset = path.stat().st_size
    with path.open("ab") as file:
        file.write(raw_frame(tmp_path, b"\x92\x3f\x00"))  # [63, 0]: a CAcceptRecord missing fields
    assert_refused(tmp_path, LogCorrupt, f"offset {offset}", "does not decode")


@pytest.mark.parametrize(("damage", "words"), [
    (lambda data: b"NOTCELLR" + data[8:], ("not a Cellar record log",)),
    (lambda data: data[:13] + bytes([data[13] ^ 1]) + data[14:], ("header's checksum",)),
    (lambda data: data[:5], ("shorter than any header",)),
    (lambda data: data[:20] + bytes([data[20] ^ 1]) + data[21:], ("checksum (over its salt)",)),
    (lambda data: data[:PREFIX_SIZE + SALT_SIZE], ("shorter than its 28-byte header",)),
    (lambda data: b"", ("0 bytes",)),
])
def test_a_bad_header_is_refused(tmp_path: pathlib.Path, damage, words) -> None:
    write(tmp_path, take(7, 3))
    path = tmp_path / LOG_NAME
    path.write_bytes(damage(path.read_bytes()))
    assert_refused(tmp_path, LogCorrupt, "offset 0", *words)


def test_another_format_version_is_refused(tmp_path: pathlib.Path) -> None:
    write(tmp_path, take(8, 3))
    path = tmp_path / LOG_NAME
    data = path.read_bytes()
    body = MAGIC + struct.pack(">I", 4)
    path.write_bytes(body + struct.pack(">I", zlib.crc32(body)) + data[PREFIX_SIZE:])
    assert_refused(tmp_path, LogVersionUnsupported, "version 4", "reads versions 1, 2 and 3")


# --- Format version 1 --------------------------------------------------------------------------


def test_a_version_1_log_is_rewritten_in_the_current_version_as_it_opens(
        tmp_path: pathlib.Path) -> None:
    records = take(13, 8)
    version_1_log(tmp_path, records)
    with DurableLog.open(tmp_path, create=False, preallocate_bytes=0) as log:
        assert log.records() == records
        assert log.recovery.upgraded_from == 1
        assert any("from format version 1 in version 3" in line for line in log.recovery.lines())
        assert log.statistics().size_bytes == (tmp_path / LOG_NAME).stat().st_size
        log.append([ViewRecord(9)])  # appended to the rewritten file, in its version
        log.sync()
    data = (tmp_path / LOG_NAME).read_bytes()
    assert struct.unpack(">I", data[8:12]) == (3,) and len(salt_of(tmp_path)) == SALT_SIZE
    assert not (tmp_path / COMPACTING_NAME).exists()
    with DurableLog.open(tmp_path, create=False) as log:
        assert log.records() == [*records, ViewRecord(9)]
        assert log.recovery.lines() == []


def test_a_version_2_log_is_rewritten_in_version_3_so_no_earlier_build_misreads_it(
        tmp_path: pathlib.Path) -> None:
    """Version 3 frames records as version 2 does, but may hold an own-index reservation
    (`ReserveRecord`), which a build that reads version 2 only would take for damage: told
    the version instead, it refuses the log for what it is (exit 76)."""
    records = [record for record in take(15, 8) if not isinstance(record, ReserveRecord)]
    salt = bytes(range(SALT_SIZE))
    (tmp_path / LOG_NAME).write_bytes(header(salt, 2) + b"".join(
        [frame(encode_record(record), frame_key(salt)) for record in records]))
    with DurableLog.open(tmp_path, create=False) as log:
        assert log.records() == records and log.recovery.upgraded_from == 2
        log.append([ReserveRecord(64)])
        log.sync()
    assert struct.unpack(">I", (tmp_path / LOG_NAME).read_bytes()[8:12]) == (3,)
    with DurableLog.open(tmp_path, create=False) as log:
        assert log.records() == [*records, ReserveRecord(64)]


def test_a_version_1_log_with_a_torn_tail_is_rewritten_without_it(
        tmp_path: pathlib.Path) -> None:
    records = take(14, 5)
    data = version_1_log(tmp_path, records)
    (tmp_path / LOG_NAME).write_bytes(data[:-3])
    with DurableLog.open(tmp_path, create=False) as log:
        assert log.records() == records[:-1]
        assert log.recovery.upgraded_from == 1 and log.recovery.torn_bytes > 0
    assert reopen(tmp_path) == records[:-1]


def test_a_damaged_version_1_log_is_refused_and_left_as_it_was(tmp_path: pathlib.Path) -> None:
    version_1_log(tmp_path, take(15, 6))
    offsets = frame_offsets(tmp_path)
    damage(tmp_path, offsets[2] + FRAME_OVERHEAD + 1, b"\xff")
    assert_refused(tmp_path, LogCorrupt, f"offset {offsets[2]}",
                   f"valid record follows at offset {offsets[3]}")


# --- The data directory ------------------------------------------------------------------------


def test_a_missing_directory_is_named_with_the_fix(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "absent"
    with pytest.raises(DataDirectoryMissing) as raised:
        DurableLog.open(directory, create=False)
    assert raised.value.exit_code == 66
    assert str(directory) in str(raised.value) and "--init" in str(raised.value)
    assert not directory.exists()


def test_a_directory_without_a_log_is_not_initialised_silently(tmp_path: pathlib.Path) -> None:
    with pytest.raises(DataDirectoryMissing) as raised:
        DurableLog.open(tmp_path, create=False)
    assert str(tmp_path / LOG_NAME) in str(raised.value)
    assert "--init" in str(raised.value) and DANGER in str(raised.value)
    assert not (tmp_path / LOG_NAME).exists()


def test_a_file_where_the_directory_should_be_is_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataDirectoryMissing, match="not a directory"):
        DurableLog.open(tmp_path / "file", create=True)


def test_a_second_opener_is_refused_and_told_who_holds_it(tmp_path: pathlib.Path) -> None:
    with DurableLog.open(tmp_path, create=True):
        with pytest.raises(DataDirectoryLocked) as raised:
            DurableLog.open(tmp_path, create=True)
        assert raised.value.holder == os.getpid()
        assert f"process {os.getpid()}" in str(raised.value) and str(tmp_path) in str(
            raised.value)
        assert raised.value.exit_code == 75
    with DurableLog.open(tmp_path, create=False):  # closing released it
        pass


def test_every_error_kind_has_its_own_exit_code() -> None:
    kinds: list[type[StorageError]] = [DataDirectoryMissing, DataDirectoryLocked, LogCorrupt,
                                       LogVersionUnsupported, StorageFailed]
    codes = [kind.exit_code for kind in kinds]
    assert len(set(codes)) == len(kinds)
    assert codes == [storage_errors.EXIT_DATA_DIRECTORY_MISSING,
                     storage_errors.EXIT_DATA_DIRECTORY_LOCKED, storage_errors.EXIT_LOG_CORRUPT,
                     storage_errors.EXIT_LOG_VERSION_UNSUPPORTED,
                     storage_errors.EXIT_STORAGE_FAILED]
    assert all(code not in (0, 1, 2, 3, 130) for code in codes)  # the CLI's other statuses


# --- Failed writes and syncs -------------------------------------------------------------------


def test_a_write_beyond_the_file_size_limit_stops_the_log(tmp_path: pathlib.Path) -> None:
    records = take(9, 5)
    log = DurableLog.open(tmp_path, create=True)
    log.append(records)
    log.sync()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (log.statistics().size_bytes + 100, hard))
    try:
        with pytest.raises(StorageFailed) as raised:
            log.append([SnapshotRecord(SnapshotMeta(0, (), (), (), ()), bytes(1000))])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert raised.value.errno == errno.EFBIG and "ulimit" in str(raised.value)
    assert str(tmp_path / LOG_NAME) in str(raised.value)
    with pytest.raises(StorageFailed):
        log.sync()  # never carries on after a failure
    log.close()
    assert reopen(tmp_path) == records


def test_a_failed_fsync_stops_the_log_for_good(tmp_path: pathlib.Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with DurableLog.open(tmp_path, create=True) as log:
        log.append([ViewRecord(1)])
        monkeypatch.setattr(os, "fdatasync", failing)
        with pytest.raises(StorageFailed) as raised:
            log.sync()
        assert "fdatasync failed" in str(raised.value) and "EIO" in str(raised.value)
        assert "must not go on" in str(raised.value)
        monkeypatch.undo()
        for call in (lambda: log.append([ViewRecord(2)]), log.sync):
            with pytest.raises(StorageFailed):
                call()


@pytest.mark.parametrize("path", ["append", "sync"])
def test_a_full_disk_during_compaction_stops_the_log_and_keeps_the_old_one(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    records = take(10, 80, snapshot_every=25)
    if path == "sync":
        log, old = due_to_compact_at_sync(tmp_path, records), records
    else:  # an append holding snapshots compacts at once, the old log left as it was
        log, old = DurableLog.open(tmp_path, create=True, compact_after_bytes=1), records[:5]
        log.append(old)
        log.sync()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)  # fdatasync (the append's) works; fsync does not
    with pytest.raises(StorageFailed) as raised:
        log.sync() if path == "sync" else log.append(records[5:])
    monkeypatch.undo()
    assert COMPACTING_NAME in str(raised.value) and "free space" in str(raised.value)
    assert not (tmp_path / COMPACTING_NAME).exists()
    with pytest.raises(StorageFailed):  # the log refuses every later call
        log.append([ViewRecord(9)])
    log.close()
    assert reopen(tmp_path) == old


# --- Compaction --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [3])
def test_compaction_keeps_a_log_that_replays_to_the_same_replica(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    for replica_id, records in enumerate(raw_records(seed, monkeypatch)):
        directory = tmp_path / str(replica_id)
        with DurableLog.open(directory, create=True, compact_after_bytes=2048) as log:
            for start in range(0, len(records), 40):
                log.append(records[start:start + 40])
                log.sync()
                assert compact_records(on_disk(directory)) == \
                    compact_records(records[:start + 40])
            assert log.statistics().compactions >= 2
        compacted = reopen(directory)
        assert len(compacted) < len(records)
        assert compact_records(compacted) == compact_records(records)
        config = build(SimOptions(seed=seed)).nodes[replica_id].config
        assert state_of(Replica.restore(config, Prng(1), compacted)) == \
            state_of(Replica.restore(config, Prng(1), records))


def snapshot(slot: int, state_bytes: int) -> SnapshotRecord:
    return SnapshotRecord(SnapshotMeta(slot, (slot,) * 3, (0,) * 3, (0,) * 3, ((),) * 3),
                          bytes(state_bytes))


def accepts(start: int, count: int, payload_bytes: int) -> list[Record]:
    return [CAcceptRecord(0, index, 1, (Command(0, index, bytes(payload_bytes)),))
            for index in range(start, start + count)]


def compacted_by_sync(log: DurableLog) -> bool:
    """Sync `log`; whether that compacted it, as `compaction_due` foretold (the driver runs
    such a sync off the event loop)."""
    foretold, before = log.compaction_due, log.statistics().compactions
    log.sync()
    compacted = log.statistics().compactions > before
    assert compacted == foretold
    return compacted


def test_compaction_waits_for_a_snapshot_and_for_growth(tmp_path: pathlib.Path) -> None:
    log = DurableLog.open(tmp_path, create=True, compact_after_bytes=4096)
    log.append(accepts(0, 10, 1000))  # 10 kB, no snapshot: nothing to gain
    assert not compacted_by_sync(log)
    log.append([snapshot(5, 100_000)])  # grown enough: straight into the compacted log
    assert log.statistics().compactions == 1
    assert not log.compaction_due and not compacted_by_sync(log)
    first = log.statistics()
    assert first.compactions == 1 and first.records == 6  # the snapshot and 5 uncovered
    assert 100_000 < first.size_bytes < 110_000
    log.append([*accepts(10, 20, 1000), snapshot(20, 1000)])  # grown 21 kB: less than 100 kB
    assert log.statistics().compactions == 1
    assert not compacted_by_sync(log)
    log.append(accepts(30, 90, 1000))  # grown more than the compacted size: compact at sync
    assert compacted_by_sync(log)
    assert not log.compaction_due  # nothing waits for a sync
    second = log.statistics()
    assert second.compactions == 2 and second.records == 101  # the big snapshot is gone
    log.close()
    assert reopen(tmp_path) == [snapshot(20, 1000), *accepts(20, 100, 1000)]


def test_a_reopened_log_compacts_only_for_a_snapshot_it_has_not_used(
        tmp_path: pathlib.Path) -> None:
    write(tmp_path, [*accepts(0, 10, 100), snapshot(5, 100), ViewRecord(1)],
          compact_after_bytes=1)
    with DurableLog.open(tmp_path, create=False, compact_after_bytes=1) as log:
        assert log.records() == [snapshot(5, 100), *accepts(5, 5, 100), ViewRecord(1)]
        log.append([ViewRecord(2)])
        log.sync()
        assert log.statistics().compactions == 0  # nothing to gain
        log.append([snapshot(8, 100)])
        log.sync()
        assert log.statistics().compactions == 1
    write(tmp_path / "uncompacted", [*accepts(0, 10, 100), snapshot(5, 100)])
    with DurableLog.open(tmp_path / "uncompacted", create=False, compact_after_bytes=1) as log:
        log.append([ViewRecord(2)])
        log.sync()
        assert log.statistics().compactions == 1  # the durable snapshot was never used


@pytest.mark.skipif(not pathlib.Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux)")
def test_sync_is_an_fdatasync_and_compaction_fsyncs_file_then_directory_then_zeros(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    real = {name: getattr(os, name) for name in ("fdatasync", "fsync", "replace")}

    def spy(name: str):
        def call(*arguments):
            if name == "replace":
                calls.append((name, pathlib.Path(arguments[0]).name))
            else:
                calls.append((name, pathlib.Path(os.readlink(f"/proc/self/fd/{arguments[0]}"))
                              .name))
            return real[name](*arguments)
        return call

    log = DurableLog.open(tmp_path, create=True, compact_after_bytes=1)
    for name in real:
        monkeypatch.setattr(os, name, spy(name))
    log.sync()  # nothing appended: nothing to sync
    log.append([ViewRecord(1)])
    log.sync()
    assert calls == [("fdatasync", LOG_NAME)]  # into the zeros that opening wrote
    calls.clear()
    log.append([snapshot(0, 10)])  # compacted at once: a new file, synced before its rename
    log.sync()  # nothing left to sync
    assert calls == [("fsync", COMPACTING_NAME), ("replace", COMPACTING_NAME),
                     ("fsync", tmp_path.name)]
    log.close()
    monkeypatch.undo()
    log = due_to_compact_at_sync(tmp_path / "sync", take(3, 32, snapshot_every=10))
    for name in real:
        monkeypatch.setattr(os, name, spy(name))
    calls.clear()
    log.sync()
    assert calls == [("fdatasync", LOG_NAME), ("fsync", COMPACTING_NAME),
                     ("replace", COMPACTING_NAME), ("fsync", "sync"), ("fsync", LOG_NAME)]
    log.close()


@pytest.mark.skipif(not pathlib.Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux)")
def test_opening_fdatasyncs_the_log_before_reading_it(tmp_path: pathlib.Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """What a process killed between its write and its fdatasync left in the page cache is
    made durable before it is replayed as durable."""
    write(tmp_path, [ViewRecord(1)])
    events: list[tuple[str, str]] = []
    fdatasync, read_bytes = os.fdatasync, pathlib.Path.read_bytes

    def spy_sync(fd: int) -> None:
        events.append(("fdatasync", pathlib.Path(os.readlink(f"/proc/self/fd/{fd}")).name))
        fdatasync(fd)

    def spy_read(path: pathlib.Path) -> bytes:
        events.append(("read", path.name))
        return read_bytes(path)

    monkeypatch.setattr(os, "fdatasync", spy_sync)
    monkeypatch.setattr(pathlib.Path, "read_bytes", spy_read)
    assert reopen(tmp_path) == [ViewRecord(1)]
    assert events == [("fdatasync", LOG_NAME), ("read", LOG_NAME)]


def test_a_failed_fdatasync_at_open_is_refused(tmp_path: pathlib.Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, [ViewRecord(1)])

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(StorageFailed) as raised:
        DurableLog.open(tmp_path, create=False)
    assert "fdatasync before reading the log failed" in str(raised.value)
    assert raised.value.path == tmp_path / LOG_NAME
    monkeypatch.undo()
    DirectoryLock.acquire(tmp_path).release()  # the refusal released the lock


def test_every_new_file_has_a_salt_of_its_own(tmp_path: pathlib.Path) -> None:
    """A created log, and each compaction's new file: frames of one file, or bytes a client
    chose, are never valid frames of another."""
    salts = set()
    for name in ("a", "b"):
        write(tmp_path / name, [])
        salts.add(salt_of(tmp_path / name))
    with DurableLog.open(tmp_path / "a", create=False, compact_after_bytes=1) as log:
        for slot in range(3):
            log.append([*accepts(slot * 10, 10, 10), snapshot(slot * 10 + 5, 10)])
            log.sync()
            salts.add(salt_of(tmp_path / "a"))
        assert log.statistics().compactions == 3
    assert len(salts) == 5 and all(len(salt) == SALT_SIZE for salt in salts)
    assert reopen(tmp_path / "a")[0] == snapshot(25, 10)


def test_an_unfinished_compaction_left_behind_is_removed(tmp_path: pathlib.Path) -> None:
    write(tmp_path, take(12, 10))
    (tmp_path / COMPACTING_NAME).write_bytes(b"half of a new log")
    with DurableLog.open(tmp_path, create=False) as log:
        assert log.records() == take(12, 10)
        assert any("unfinished compaction" in line for line in log.recovery.lines())
    assert not (tmp_path / COMPACTING_NAME).exists()


def test_close_twice_is_harmless_and_use_after_close_is_a_bug(tmp_path: pathlib.Path) -> None:
    log = DurableLog.open(tmp_path, create=True)
    log.close()
    log.close()
    with pytest.raises(AssertionError, match="after close"):
        log.append([ViewRecord(1)])


def test_an_unsynced_log_writes_without_fdatasync_and_still_reopens(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`synced=False` (benchmarks against stores that do not sync): records reach the file,
    and a clean reopen finds them, but no fdatasync is ever asked for on the appends."""
    calls: list[int] = []
    records = [ViewRecord(1), ViewRecord(2)]
    with DurableLog.open(tmp_path, create=True, synced=False) as log:  # (opening does sync)
        monkeypatch.setattr(os, "fdatasync", calls.append)
        log.append(records)
        log.sync()
    assert calls == []
    monkeypatch.undo()
    assert reopen(tmp_path) == records
