"""A snapshot the driver accepts must fit one log record with its metadata.

driver.py says so (SNAPSHOT_STATE_BYTES_MAX = RECORD_BYTES_MAX - 1 MiB): a larger record could
not be written (storage_format.frame asserts) and every replica would stop at the same slot at
every start. In Multi-Paxos mode the metadata carries each origin's dedup window (65,536 tags
of 9 bytes once the epoch is past 0): 1.7 MiB for 3 replicas, 2.8 MiB for 5, more than the
1 MiB margin. A state the driver lets through then makes a record over the cap."""

from __future__ import annotations

import pytest

from consensus.codec import RECORD_BYTES_MAX, encode_record
from consensus.config import Mode, ReplicaConfig
from consensus.messages import SnapshotMeta
from consensus.records import SnapshotRecord
from consensus.runtime import driver as driver_module

STATE_PROBE = 100_000  # a bin32 header, as at the cap


def _largest_meta(count: int, window: int) -> SnapshotMeta:
    big = 1 << 62
    return SnapshotMeta(slot=big, exec_counts=(big,) * count, o_counts=(big,) * count,
                        dedup_low=(big,) * count,
                        dedup_tags=tuple(tuple(big + i for i in range(window))
                                         for _ in range(count)))


@pytest.mark.parametrize("count", [3, 5])
def test_the_largest_state_the_driver_snapshots_fits_one_record(count: int) -> None:
    config = ReplicaConfig(replica_id=0, replica_count=count, mode=Mode.MULTIPAXOS)
    meta = _largest_meta(count, config.dedup_window_per_origin)
    around = len(encode_record(SnapshotRecord(meta, bytes(STATE_PROBE)))) - STATE_PROBE
    state_bytes_max = getattr(driver_module, "snapshot_state_bytes_max",  # the fix's, if any
                              lambda config: config.snapshot_bytes_max)
    limit = min(driver_module.SNAPSHOT_STATE_BYTES_MAX, state_bytes_max(config))
    assert limit + around <= RECORD_BYTES_MAX, (
        f"a state of {limit} bytes (allowed) makes a record of {limit + around} bytes, "
        f"over RECORD_BYTES_MAX by {limit + around - RECORD_BYTES_MAX}")
