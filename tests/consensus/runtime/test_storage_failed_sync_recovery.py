"""A replica whose fdatasync failed stops, and a restart on the same data directory recovers
exactly what it acknowledged.

After a failed fdatasync Linux may mark the pages it could not write clean (the "fsyncgate"
lesson): the records of that batch stay readable from the page cache, and the fdatasync of the
next open, on a new descriptor, reports success without writing them. So the restart must not
replay them as durable (they were never acknowledged: the driver stops before the messages
that promised them leave), and a page of them evicted and read back from the disk (a hole
before valid frames) must not make the log refused as corrupt. Every synced record is kept.
Here the failure is injected by replacing `os.fdatasync`; the reopen's own fdatasync then
succeeds, as the kernel's would."""

from __future__ import annotations

import errno
import os
import pathlib
import threading
from collections.abc import Callable

import pytest

from cellar import replica_cli
from cellar.cli import main
from cellar.local_cluster import Layout
from consensus.codec import decode_messages
from consensus.config import ReplicaConfig
from consensus.messages import Heartbeat, Message
from consensus.prng import Prng
from consensus.ready import Ready
from consensus.records import EpochRecord, Record, ViewRecord
from consensus.replica import Replica
from consensus.runtime.driver import Driver
from consensus.runtime.metrics import Metrics
from consensus.runtime.storage import LOG_NAME, DurableLog
from consensus.runtime.storage_errors import EXIT_STORAGE_FAILED, StorageFailed
from consensus.runtime.storage_format import scan
from tests.consensus.runtime.kv_machine import SessionKv
from tests.consensus.runtime.workload import take

REAL_FDATASYNC = os.fdatasync


def failing_at(call: int, calls: list[int]) -> Callable[[int], None]:
    """An fdatasync that fails with EIO from its `call`-th call on (1 is the first)."""

    def fdatasync(fd: int) -> None:
        calls.append(fd)
        if len(calls) >= call:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        REAL_FDATASYNC(fd)

    return fdatasync


def reopen(directory: pathlib.Path) -> list[Record]:
    with DurableLog.open(directory, create=False) as log:
        return log.records()


@pytest.mark.parametrize("failing_sync", [1, 2, 4])
def test_what_was_synced_is_recovered_and_what_failed_is_not_replayed(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, failing_sync: int) -> None:
    batches = [take(seed, 4) for seed in range(1, 6)]
    acknowledged: list[Record] = []
    calls: list[int] = []
    with DurableLog.open(tmp_path, create=True) as log:
        monkeypatch.setattr(os, "fdatasync", failing_at(failing_sync, calls))
        for batch in batches:
            log.append(batch)
            try:
                log.sync()
            except StorageFailed as error:
                failed = error
                break
            acknowledged.extend(batch)
        else:
            raise AssertionError("the injected fdatasync never failed")
        assert len(calls) == failing_sync  # never retried
        assert failed.exit_code == EXIT_STORAGE_FAILED == 74
        assert str(tmp_path / LOG_NAME) in str(failed)
        assert "fdatasync failed" in str(failed) and "EIO" in str(failed)
        assert "must not go on" in str(failed) and "recovers every record" in str(failed)
        for call in (lambda: log.append(take(9, 1)), log.sync):
            with pytest.raises(StorageFailed):
                call()
        assert len(calls) == failing_sync
    monkeypatch.undo()
    assert reopen(tmp_path) == acknowledged


def test_a_page_of_the_failed_batch_read_back_as_a_hole_does_not_refuse_the_log(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failed batch's first page evicted and read back from the disk (zeros), its later
    ones still in the page cache: a hole before valid frames, which the reader must refuse
    as damage if the file still holds them."""
    synced, failed_batch = take(1, 3), take(2, 6)
    path = tmp_path / LOG_NAME
    with DurableLog.open(tmp_path, create=True) as log:
        log.append(synced)
        log.sync()
        synced_size = log.statistics().size_bytes
        log.append(failed_batch)
        monkeypatch.setattr(os, "fdatasync", failing_at(1, []))
        with pytest.raises(StorageFailed):
            log.sync()
    monkeypatch.undo()
    data = bytearray(path.read_bytes())
    if len(data) > synced_size:  # the failed batch is still in the file: evict its first frame
        frames = [offset for offset, _ in scan(bytes(data), path).payloads]
        second = next(offset for offset in frames if offset > synced_size)
        data[synced_size:second] = bytes(second - synced_size)
        path.write_bytes(bytes(data))
    assert reopen(tmp_path) == synced


BEFORE = Heartbeat(sender=0, view=0, commit_prefix=0, lease_round=1)


def _ready(view: int) -> Ready:
    after: list[tuple[int, Message]] = [
        (1, Heartbeat(sender=0, view=0, commit_prefix=0, lease_round=view + 1))]
    return Ready(records=[ViewRecord(view=view)], must_sync=True, messages=[(1, BEFORE)],
                 messages_after_persist=after)


class Recording(Replica):
    advanced = 0

    def advance(self) -> None:
        self.advanced += 1
        super().advance()


@pytest.mark.anyio
@pytest.mark.parametrize("threaded", [False, True])
async def test_the_driver_stops_on_a_failed_fdatasync_and_the_restart_keeps_what_it_promised(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, threaded: bool) -> None:
    sent: list[int] = []

    def send(peer: int, frame: bytes) -> bool:
        sent.extend(message.lease_round for message in decode_messages(frame)
                    if isinstance(message, Heartbeat))
        return True

    replica = Recording(ReplicaConfig(replica_id=0, replica_count=3), Prng(0))
    log = DurableLog.open(tmp_path, create=True)
    driver = Driver(replica, log, SessionKv(), send, Metrics())
    driver._inputs_last_turn = 2 if threaded else 1
    monkeypatch.setattr(os, "fdatasync", failing_at(2, []))
    await driver._handle(_ready(1))  # persisted, and its promise sent
    assert sent == [1, 2] and replica.advanced == 1
    with pytest.raises(StorageFailed) as raised:
        await driver._handle(_ready(2))
    assert raised.value.exit_code == EXIT_STORAGE_FAILED
    assert sent == [1, 2, 1] and replica.advanced == 1  # nothing that promised view 2 left
    log.close()
    monkeypatch.undo()
    assert reopen(tmp_path) == [ViewRecord(view=1)]


def test_a_replica_whose_fdatasync_fails_exits_74_and_restarts_on_what_it_synced(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`cellar replica` alone (its peers down): the open's fdatasync and its start's epoch
    succeed, the core's first synced Ready (its view change's promise) fails."""
    monkeypatch.setattr(replica_cli, "start_logging", lambda args: None)  # this process's
    layout = Layout(tmp_path / "cluster", 3, insecure=True, loop="asyncio")
    layout.write()
    calls: list[int] = []
    monkeypatch.setattr(os, "fdatasync", failing_at(3, calls))
    # Bounded: a replica that never failed would otherwise run until signalled.
    timer = threading.Timer(60, lambda: os.kill(os.getpid(), 15))
    timer.start()
    try:
        status = main(["replica", "--config", str(layout.config_path(0)), "--init"])
    finally:
        timer.cancel()
    monkeypatch.undo()
    assert status == EXIT_STORAGE_FAILED
    error = capsys.readouterr().err
    log = layout.data_dir(0) / LOG_NAME
    assert error.startswith(f"cellar replica: {log}: fdatasync failed: ")
    assert "(EIO)" in error and "Traceback" not in error
    assert len(calls) == 3
    records = reopen(layout.data_dir(0))  # the epoch was synced; the failed promise is not
    assert [type(record) for record in records] == [EpochRecord]
