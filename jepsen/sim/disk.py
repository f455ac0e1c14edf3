"""A simulated disk: records are written, and survive a crash only once synced.

A crash keeps every synced record and, like a real page cache written back in order, a prefix
of the unsynced ones of the simulator's choosing (a torn tail). Once a snapshot record is
synced the log is compacted the way the runtime compacts it (`consensus.record_log`).
"""

from __future__ import annotations

from consensus.prng import Prng
from consensus.record_log import compact_records
from consensus.records import Record, SnapshotRecord

COMPACT_AFTER_RECORDS = 2000


class Disk:
    __slots__ = ("_since_compaction", "synced", "unsynced")

    def __init__(self) -> None:
        self.synced: list[Record] = []
        self.unsynced: list[Record] = []
        self._since_compaction = 0

    def write(self, records: list[Record]) -> None:
        self.unsynced.extend(records)

    def sync(self) -> None:
        had_snapshot = any(isinstance(record, SnapshotRecord) for record in self.unsynced)
        self.synced.extend(self.unsynced)
        self._since_compaction += len(self.unsynced)
        self.unsynced.clear()
        if had_snapshot or self._since_compaction > COMPACT_AFTER_RECORDS:
            self.synced = compact_records(self.synced)
            self._since_compaction = 0

    def crash(self, prng: Prng, *, torn: bool) -> int:
        """Lose unsynced records (all, or all but a prefix when torn); returns how many."""
        kept = prng.below(len(self.unsynced) + 1) if torn and self.unsynced else 0
        lost = len(self.unsynced) - kept
        self.synced.extend(self.unsynced[:kept])
        self.unsynced.clear()
        return lost

    def records(self) -> list[Record]:
        return list(self.synced)
