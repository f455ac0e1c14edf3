"""A replica process's start over its data directory: a new one sequences view 0 at once, with
the record that it has run synced first; a restarted one is restored and waits for an
election rather than take up view 0's sequencing again."""

from __future__ import annotations

import pathlib

from consensus.config import ReplicaConfig
from consensus.prng import Prng
from consensus.records import EpochRecord
from consensus.runtime.node import boot
from consensus.runtime.storage import DurableLog

CONFIG = ReplicaConfig(replica_id=0, replica_count=3)


def test_a_new_replica_syncs_its_first_record_and_sequences_view_0(tmp_path: pathlib.Path
                                                                   ) -> None:
    with DurableLog.open(tmp_path, create=True) as log:
        replica = boot(CONFIG, Prng(1), log)
        assert replica.inspect.is_sequencer and replica.inspect.view == 0
        assert not replica.has_ready()
    with DurableLog.open(tmp_path, create=False) as log:
        assert log.records() == [EpochRecord(0)]


def test_a_restarted_replica_is_restored_and_waits_for_an_election(tmp_path: pathlib.Path
                                                                  ) -> None:
    with DurableLog.open(tmp_path, create=True) as log:
        boot(CONFIG, Prng(1), log)
    with DurableLog.open(tmp_path, create=False) as log:
        replica = boot(CONFIG, Prng(1), log)
        assert not replica.inspect.is_sequencer
        assert replica.status().status == "awaiting"
        assert replica.ready().records == [EpochRecord(1)]  # its second life's tags differ
