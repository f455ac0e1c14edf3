"""A data directory names the replica it belongs to (`consensus/runtime/data_identity.py`):
written at the first open, checked at every later one; another replica's directory, or a file
that is not an identity, is refused with nothing changed; a log written before the file
existed is claimed by the replica that opens it."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from consensus.records import EpochRecord, ViewRecord
from consensus.runtime.data_identity import IDENTITY_NAME, DataIdentity
from consensus.runtime.storage import LOG_NAME, DurableLog
from consensus.runtime.storage_errors import (
    EXIT_DATA_DIRECTORY_MISMATCH,
    DataDirectoryMismatch,
    DataDirectoryMissing,
    LogCorrupt,
)

ONE_OF_THREE = DataIdentity(1, 3)


def _make(directory: pathlib.Path, identity: DataIdentity | None) -> None:
    with DurableLog.open(directory, create=True, identity=identity) as log:
        log.records()
        log.append([EpochRecord(1), ViewRecord(2)])
        log.sync()


def _files(directory: pathlib.Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def test_the_first_open_writes_the_identity_and_the_next_ones_accept_it(
        tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "data"
    _make(directory, ONE_OF_THREE)
    written = json.loads((directory / IDENTITY_NAME).read_bytes())
    assert written == {"replica_id": 1, "replica_count": 3, "disk": written["disk"]}
    assert re.fullmatch("[0-9a-f]{32}", written["disk"])
    with DurableLog.open(directory, create=False, identity=ONE_OF_THREE) as log:
        assert log.records() == [EpochRecord(1), ViewRecord(2)]
        assert log.identity == DataIdentity(1, 3, disk=written["disk"])


def test_every_directory_gets_a_disk_id_of_its_own_once(tmp_path: pathlib.Path) -> None:
    """Peers tell a directory started over from the one they heard by this id
    (`peer_lives.py`): a new one per directory, kept at every later open, and added to a file
    written before it had one."""
    disks = []
    for name in ("one", "two"):
        _make(tmp_path / name, ONE_OF_THREE)
        with DurableLog.open(tmp_path / name, create=False, identity=ONE_OF_THREE) as log:
            assert log.identity is not None
            disks.append(log.identity.disk)
    assert disks[0] != disks[1]
    old = tmp_path / "old"
    _make(old, ONE_OF_THREE)
    (old / IDENTITY_NAME).write_bytes(b'{"replica_id": 1, "replica_count": 3}\n')
    with DurableLog.open(old, create=False, identity=ONE_OF_THREE) as log:
        assert log.identity is not None and log.identity.disk not in ("", *disks)
        added = log.identity.disk
    assert json.loads((old / IDENTITY_NAME).read_bytes())["disk"] == added


@pytest.mark.parametrize("other", [DataIdentity(2, 3), DataIdentity(1, 5)])
def test_another_replicas_directory_is_refused_and_left_as_it_was(
        tmp_path: pathlib.Path, other: DataIdentity) -> None:
    directory = tmp_path / "data"
    _make(directory, ONE_OF_THREE)
    before = _files(directory)
    with pytest.raises(DataDirectoryMismatch) as refused:
        DurableLog.open(directory, create=False, identity=other)
    assert refused.value.exit_code == EXIT_DATA_DIRECTORY_MISMATCH == 78
    assert f"replica 1 of 3's, but the configuration is {other}'s" in str(refused.value)
    assert _files(directory) == before
    with DurableLog.open(directory, create=False, identity=ONE_OF_THREE) as log:  # unlocked
        assert log.records() == [EpochRecord(1), ViewRecord(2)]


def test_a_log_from_before_the_identity_is_claimed_by_its_replica(
        tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "data"
    _make(directory, None)
    assert not (directory / IDENTITY_NAME).exists()
    with DurableLog.open(directory, create=False, identity=ONE_OF_THREE) as log:
        assert log.records() == [EpochRecord(1), ViewRecord(2)]
    with pytest.raises(DataDirectoryMismatch):
        DurableLog.open(directory, create=False, identity=DataIdentity(0, 3))


@pytest.mark.parametrize("content", [
    b"", b"{", b"[1, 3]", b'{"replica_id": 1}', b'{"replica_id": 1, "replica_count": 3, "x": 0}',
    b'{"replica_id": true, "replica_count": 3}', b'{"replica_id": 1.0, "replica_count": 3}',
    b'{"replica_id": 3, "replica_count": 3}', b'{"replica_id": -1, "replica_count": 3}',
    b"\xff\xfe", b" " * 5000 + b'{"replica_id": 1, "replica_count": 3}',
])
def test_a_file_that_is_not_an_identity_is_refused(tmp_path: pathlib.Path,
                                                   content: bytes) -> None:
    directory = tmp_path / "data"
    _make(directory, ONE_OF_THREE)
    (directory / IDENTITY_NAME).write_bytes(content)
    before = _files(directory)
    with pytest.raises(LogCorrupt, match="not a data directory identity"):
        DurableLog.open(directory, create=False, identity=ONE_OF_THREE)
    assert _files(directory) == before


def test_an_identity_without_a_log_is_a_lost_log_not_a_new_replica(
        tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "data"
    _make(directory, ONE_OF_THREE)
    (directory / LOG_NAME).unlink()
    with pytest.raises(DataDirectoryMissing, match="not empty"):
        DurableLog.open(directory, create=True, identity=ONE_OF_THREE)


def test_the_identity_names_the_machine_and_another_machine_is_refused(
        tmp_path: pathlib.Path) -> None:
    """A replica restarted under another `machine` had replayed its log into a machine that
    cannot read it; the directory now names its machine, and another is refused (exit 78)."""
    directory = tmp_path / "data"
    gpu = DataIdentity(1, 3, "gpu")
    _make(directory, gpu)
    assert (directory / IDENTITY_NAME).read_bytes().startswith(
        b'{"replica_id": 1, "replica_count": 3, "machine": "gpu", "disk": "')
    before = _files(directory)
    with pytest.raises(DataDirectoryMismatch) as refused:
        DurableLog.open(directory, create=False, identity=DataIdentity(1, 3, "kv"))
    assert refused.value.exit_code == EXIT_DATA_DIRECTORY_MISMATCH
    assert "replica 1 of 3 (gpu machine)'s, but the configuration is replica 1 of 3 " \
           "(kv machine)'s" in str(refused.value)
    assert _files(directory) == before
    with DurableLog.open(directory, create=False, identity=gpu) as log:
        assert log.records() == [EpochRecord(1), ViewRecord(2)]


def test_an_identity_from_before_the_machine_was_named_is_claimed_for_the_configured_one(
        tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "data"
    _make(directory, ONE_OF_THREE)
    with DurableLog.open(directory, create=False, identity=DataIdentity(1, 3, "kv")) as log:
        assert log.records() == [EpochRecord(1), ViewRecord(2)]
    assert b'"machine": "kv"' in (directory / IDENTITY_NAME).read_bytes()
    with pytest.raises(DataDirectoryMismatch):
        DurableLog.open(directory, create=False, identity=DataIdentity(1, 3, "gpu"))


@pytest.mark.parametrize("text", [
    b'{"replica_id": 1, "replica_count": 3, "machine": ""}',
    b'{"replica_id": 1, "replica_count": 3, "machine": 7}',
    b'{"replica_id": 1, "replica_count": 3, "machine": "gpu", "x": 1}',
    b'{"replica_id": 1, "replica_count": 3, "machine": "gpu", "disk": "not hex"}',
    b'{"replica_id": 1, "replica_count": 3, "machine": "gpu", "disk": 7}',
])
def test_an_identity_naming_no_machine_properly_is_refused(tmp_path: pathlib.Path,
                                                           text: bytes) -> None:
    directory = tmp_path / "data"
    _make(directory, ONE_OF_THREE)
    (directory / IDENTITY_NAME).write_bytes(text)
    with pytest.raises(LogCorrupt):
        DurableLog.open(directory, create=False, identity=DataIdentity(1, 3, "gpu"))
