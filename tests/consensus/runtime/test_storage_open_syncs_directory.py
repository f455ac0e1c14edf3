"""Opening a log fsyncs its directory before it hands the records over.

A process killed between a rename and the directory's fsync (a compaction's rename over
`records.log`, the identity file's) leaves the new name in the page cache only. The restarted
replica then appended and synced records to the new file with its name still not durable: a
power failure brought the old file back and the acknowledged records were gone with the new
one's name. Opening fdatasynced the log's data for the same reason, but never the directory.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Callable

import pytest

from consensus.runtime import durable_file, storage
from consensus.runtime.data_identity import DataIdentity
from consensus.runtime.storage import DurableLog
from tests.consensus.runtime.test_storage_crash_points import Crash, crash_at, die
from tests.consensus.runtime.workload import take


def spy_directory_syncs(monkeypatch: pytest.MonkeyPatch) -> list[pathlib.Path]:
    synced: list[pathlib.Path] = []
    for module in (storage, durable_file):  # storage imports fsync_directory by name
        real = module.fsync_directory

        def spy(directory: pathlib.Path,
                real: Callable[[pathlib.Path], None] = real) -> None:
            synced.append(pathlib.Path(directory))
            real(directory)

        monkeypatch.setattr(module, "fsync_directory", spy)
    return synced


def test_a_compaction_killed_after_its_rename_has_its_directory_fsynced_at_open(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = DurableLog.open(tmp_path, create=True, compact_after_bytes=1)
    log.records()
    crash_at(monkeypatch, storage, "fsync_directory", 0)  # killed right after os.replace
    with contextlib.suppress(Crash):
        log.append(take(10, 120, snapshot_every=25))  # holds snapshots: compacts at once
    monkeypatch.undo()
    die(tmp_path)
    log._fd = log._lock._fd = -1  # white-box: closed by die()
    assert not (tmp_path / storage.COMPACTING_NAME).exists()  # the rename was made
    synced = spy_directory_syncs(monkeypatch)
    with DurableLog.open(tmp_path, create=False) as reopened:
        assert tmp_path in synced, "the compaction's rename is replayed, never made durable"
        assert reopened.records()


def test_an_identity_written_without_its_directory_fsync_is_made_durable_at_open(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    identity = DataIdentity(0, 3, "kv")
    DurableLog.open(tmp_path, create=True).close()  # a log from before the identity file
    crash_at(monkeypatch, durable_file, "fsync_directory", 0)
    with contextlib.suppress(Crash):
        DurableLog.open(tmp_path, create=False, identity=identity).close()
    monkeypatch.undo()
    die(tmp_path)
    assert (tmp_path / "identity.json").exists()
    synced = spy_directory_syncs(monkeypatch)
    with DurableLog.open(tmp_path, create=False, identity=identity) as reopened:
        assert tmp_path in synced, "the identity's rename is relied on, never made durable"
        assert reopened.identity is not None
