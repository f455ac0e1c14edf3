"""A synced log keeps zeros written ahead of its records (consensus/runtime/storage.py, "Space
written ahead"): records land in them, a reopened log keeps them, a crash inside them loses
nothing synced, and a log that does not sync writes none."""

from __future__ import annotations

import errno
import os
import pathlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus.messages import Command
from consensus.records import CAcceptRecord, Record, ViewRecord
from consensus.runtime import storage
from consensus.runtime.storage import LOG_NAME, ZEROS_BATCH_BYTES_MAX, DurableLog
from consensus.runtime.storage_errors import StorageFailed
from consensus.runtime.storage_format import scan
from tests.consensus.runtime.workload import take

AHEAD = 64 << 10


def accept(index: int, payload_bytes: int) -> CAcceptRecord:
    """A C-accept of one command of `payload_bytes` bytes, none of them zero."""
    return CAcceptRecord(0, index, 1, (Command(0, index, b"\x07" * payload_bytes),))


def open_log(directory: pathlib.Path, *, create: bool = False,
             ahead: int = AHEAD) -> DurableLog:
    return DurableLog.open(directory, create=create, preallocate_bytes=ahead)


def reopened(directory: pathlib.Path) -> list[Record]:
    with open_log(directory) as log:
        return log.records()


def records_end(directory: pathlib.Path) -> int:
    """Where the valid frames of the log end, read without opening it."""
    path = directory / LOG_NAME
    return scan(path.read_bytes(), path).end


def file_size(directory: pathlib.Path) -> int:
    return (directory / LOG_NAME).stat().st_size


def zeros_after_records(directory: pathlib.Path) -> bool:
    data = (directory / LOG_NAME).read_bytes()
    return not any(data[records_end(directory):])


def test_opening_writes_zeros_ahead_and_the_records_go_into_them(
        tmp_path: pathlib.Path) -> None:
    with open_log(tmp_path, create=True) as log:
        end = records_end(tmp_path)  # the header
        assert file_size(tmp_path) == end + AHEAD and zeros_after_records(tmp_path)
        log.append(take(1, 4))
        assert not log.sync_is_long
        log.sync()
        assert records_end(tmp_path) == log.statistics().size_bytes > end
        assert file_size(tmp_path) == end + AHEAD  # written into the zeros: no longer
        assert zeros_after_records(tmp_path)
    assert reopened(tmp_path) == take(1, 4)


def test_more_zeros_are_written_once_less_than_half_is_left(tmp_path: pathlib.Path) -> None:
    with open_log(tmp_path, create=True) as log:
        log.append([ViewRecord(1)])
        log.sync()
        first_end = file_size(tmp_path)
        longs = 0
        view = 2
        while file_size(tmp_path) == first_end:
            log.append([ViewRecord(view), *take(view, 8)])
            longs += log.sync_is_long
            left = first_end - log.statistics().size_bytes
            assert log.sync_is_long == (left < AHEAD // 2)
            log.sync()
            view += 1
        assert longs == 1
        assert file_size(tmp_path) == log.statistics().size_bytes + AHEAD
        assert zeros_after_records(tmp_path)


def test_a_record_larger_than_the_zeros_left_extends_the_file(tmp_path: pathlib.Path) -> None:
    big = [accept(5, 3 * AHEAD)]
    with open_log(tmp_path, create=True) as log:
        log.append([ViewRecord(1)])
        log.sync()
        log.append(big)
        log.sync()  # a large batch: no zeros after it
        assert file_size(tmp_path) == log.statistics().size_bytes
        log.append([ViewRecord(2)])
        log.sync()
        assert file_size(tmp_path) == log.statistics().size_bytes + AHEAD
    assert reopened(tmp_path) == [ViewRecord(1), *big, ViewRecord(2)]


def test_a_large_batch_writes_no_zeros_and_the_next_small_one_does(
        tmp_path: pathlib.Path) -> None:
    large = [accept(index, 4096) for index in range(ZEROS_BATCH_BYTES_MAX // 4096 + 1)]
    with open_log(tmp_path, create=True, ahead=4 * ZEROS_BATCH_BYTES_MAX) as log:
        zeroed = file_size(tmp_path)
        for _ in range(5):  # past half of the zeros, and past their end
            log.append(large)
            assert not log.sync_is_long
            log.sync()
        assert file_size(tmp_path) == log.statistics().size_bytes > zeroed  # extended
        log.append([ViewRecord(1)])
        assert log.sync_is_long
        log.sync()
        assert file_size(tmp_path) == log.statistics().size_bytes + 4 * ZEROS_BATCH_BYTES_MAX
    assert reopened(tmp_path) == [*large * 5, ViewRecord(1)]


def test_a_reopened_log_keeps_its_zeros_and_reports_nothing(tmp_path: pathlib.Path) -> None:
    with open_log(tmp_path, create=True) as log:
        log.append(take(3, 6))
        log.sync()
    size = file_size(tmp_path)
    with open_log(tmp_path) as log:
        assert log.records() == take(3, 6)
        assert log.recovery.lines() == [] and log.recovery.torn_bytes == 0
        log.append([ViewRecord(4)])
        log.sync()
    assert file_size(tmp_path) == size
    assert reopened(tmp_path) == [*take(3, 6), ViewRecord(4)]


@settings(max_examples=40, deadline=None)
@given(synced_batches=st.integers(1, 3), unsynced_batches=st.integers(1, 3),
       kept=st.floats(0, 1))
def test_a_crash_inside_the_zeros_keeps_every_synced_record(
        tmp_path_factory: pytest.TempPathFactory, synced_batches: int, unsynced_batches: int,
        kept: float) -> None:
    """Records appended but not synced when the machine stopped: any prefix of their bytes
    reached the disk, the rest of the file is the zeros it had. Reopening gives every synced
    record and then whole unsynced ones, in order; the next records land after them."""
    directory = tmp_path_factory.mktemp("log")
    batches = [take(seed, 3) for seed in range(1, synced_batches + unsynced_batches + 1)]
    synced: list[Record] = []
    with open_log(directory, create=True) as log:
        for batch in batches[:synced_batches]:
            log.append(batch)
            log.sync()
            synced.extend(batch)
        synced_end = log.statistics().size_bytes
        for batch in batches[synced_batches:]:
            log.append(batch)
        written_end = log.statistics().size_bytes
    path = directory / LOG_NAME
    data = bytearray(path.read_bytes())
    cut = synced_end + round(kept * (written_end - synced_end))
    data[cut:written_end] = bytes(written_end - cut)  # what had not reached the disk
    path.write_bytes(bytes(data))
    everything = [record for batch in batches for record in batch]
    with open_log(directory) as log:
        recovered = log.records()
        assert recovered[:len(synced)] == synced
        assert recovered == everything[:len(recovered)]
        log.append([ViewRecord(99)])
        log.sync()
    assert reopened(directory) == [*recovered, ViewRecord(99)]


def test_a_torn_record_inside_the_zeros_is_cut_off_with_them(tmp_path: pathlib.Path) -> None:
    with open_log(tmp_path, create=True) as log:
        log.append(take(6, 3))
        log.sync()
        end = log.statistics().size_bytes
        log.append([accept(7, 200)])
    path = tmp_path / LOG_NAME
    data = bytearray(path.read_bytes())
    data[end + 40:end + 400] = bytes(360)  # the record's first 40 bytes reached the disk
    path.write_bytes(bytes(data))
    with open_log(tmp_path) as log:
        assert log.records() == take(6, 3)
        assert log.recovery.torn_offset == end and log.recovery.torn_bytes == len(data) - end
        assert records_end(tmp_path) == end and zeros_after_records(tmp_path)  # cut, zeroed
        log.append([ViewRecord(8)])
        log.sync()
        assert file_size(tmp_path) == end + AHEAD
    assert reopened(tmp_path) == [*take(6, 3), ViewRecord(8)]


def test_a_log_that_does_not_sync_writes_no_zeros(tmp_path: pathlib.Path) -> None:
    with DurableLog.open(tmp_path, create=True, synced=False, preallocate_bytes=AHEAD) as log:
        log.append(take(9, 4))
        assert not log.sync_is_long
        log.sync()
        assert file_size(tmp_path) == log.statistics().size_bytes


def failing_with(error: BaseException) -> Callable[..., None]:
    def write_zeros(*arguments: object) -> None:
        raise error
    return write_zeros


def test_a_failure_to_write_the_zeros_stops_the_log(tmp_path: pathlib.Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with open_log(tmp_path, create=True) as log:
        log.append([accept(1, AHEAD // 2)])
        assert log.sync_is_long
        monkeypatch.setattr(storage, "write_zeros",
                            failing_with(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
        with pytest.raises(StorageFailed, match="writing zeros ahead of the records"):
            log.sync()  # the records' fdatasync came first: they are durable
        monkeypatch.undo()
        with pytest.raises(StorageFailed):
            log.append([ViewRecord(1)])  # refused for good, as after any failed write
    with open_log(tmp_path) as log:
        assert log.records() == [accept(1, AHEAD // 2)]


def test_a_failure_to_write_the_zeros_at_open_releases_the_log(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open_log(tmp_path, create=True, ahead=0) as log:
        log.append(take(11, 3))
        log.sync()
    monkeypatch.setattr(storage, "write_zeros", failing_with(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        open_log(tmp_path)
    monkeypatch.setattr(storage, "write_zeros",
                        failing_with(OSError(errno.EIO, os.strerror(errno.EIO))))
    with pytest.raises(StorageFailed, match="writing zeros ahead of the records"):
        open_log(tmp_path)
    monkeypatch.undo()
    with open_log(tmp_path) as log:  # the lock was released both times
        assert log.records() == take(11, 3)
