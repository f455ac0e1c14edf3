"""`sync = false` (benchmarks only) skips the fdatasync of the records the core hands over, but
not of the two a node writes itself before the core starts: the rejoin record (on disk before
anything else, or a power failure leaves a log that restarts as a replica that never lived)
and this start's epoch (on disk before any hello names it, or a power failure brings the next
start back at an epoch its peers heard from another process: `peer_lives.py`)."""

from __future__ import annotations

import os
import pathlib

import pytest

from cellar.kv.machine import KvMachine
from cellar.local_cluster import Layout
from consensus.config import ReplicaConfig
from consensus.records import EpochRecord, RejoinRecord
from consensus.runtime.data_identity import DataIdentity
from consensus.runtime.node import ReplicaNode, start_replica
from consensus.runtime.node_config import load_node_config
from consensus.runtime.storage import DurableLog


def spy_fdatasync(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    synced: list[str] = []
    real = os.fdatasync

    def spy(fd: int) -> None:
        synced.append(pathlib.Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", spy)
    return synced


def test_the_rejoin_record_is_synced_with_sync_off(tmp_path: pathlib.Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with DurableLog.open(tmp_path, create=True, synced=False,
                         identity=DataIdentity(1, 3, "kv")) as log:
        synced = spy_fdatasync(monkeypatch)
        assert start_replica(ReplicaConfig(replica_id=1, replica_count=3), log,
                             rejoin=True).rejoining_now
        assert synced == ["records.log"]


def test_the_start_epoch_is_synced_before_any_hello_with_sync_off(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = Layout(tmp_path / "cluster", 3, insecure=True, loop="asyncio", machine="kv",
                    sync=False)
    layout.write()
    config = load_node_config(layout.config_path(1))
    assert not config.sync
    with DurableLog.open(config.data_dir, create=True, synced=config.sync,
                         identity=DataIdentity(1, 3, "kv")) as log:
        synced = spy_fdatasync(monkeypatch)
        ReplicaNode(config, log, KvMachine())
        assert synced == ["records.log"]
    with DurableLog.open(config.data_dir, create=False,
                         identity=DataIdentity(1, 3, "kv")) as log:
        assert log.records()[-1] == EpochRecord(1)


def test_a_rejoin_cut_short_before_its_record_can_be_started_again(
        tmp_path: pathlib.Path) -> None:
    """A crash between `--rejoin` creating the log and its rejoin record reaching it leaves an
    empty log. `--rejoin` again had been refused ("holds this replica's log: start without
    it"), and without it the replica starts on a new directory its peers refuse: only
    emptying the directory by hand got it back. An empty log never said hello (its start's
    epoch is on disk first), so nothing of it was counted on: it rejoins."""
    config = ReplicaConfig(replica_id=1, replica_count=3)
    identity = DataIdentity(1, 3, "kv")
    with DurableLog.open(tmp_path, create=True, identity=identity) as log:
        pass  # the crash: start_replica never ran
    with DurableLog.open(tmp_path, create=True, identity=identity) as log:
        assert start_replica(config, log, rejoin=True).rejoining_now
    with DurableLog.open(tmp_path, create=False, identity=identity) as log:
        assert log.records() == [RejoinRecord(False, 0, ())]
