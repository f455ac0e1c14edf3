"""Compacting a replica's record log after a snapshot, without forgetting a single promise.

Durable storage appends records forever; once a snapshot is durable, everything it covers can
go, but not everything written before it: the highest view and epoch, each space's highest
promised ballot, the own indexes reserved, and acceptances of slots and indexes the snapshot
does not cover must survive, or a restarted replica could accept what it promised to refuse.
`compact_records` returns a shorter list that replays to the same replica state (tests check
that).
"""

from __future__ import annotations

from collections.abc import Sequence

from consensus.records import (
    CAcceptRecord,
    CCommitRecord,
    CPromiseRecord,
    EpochRecord,
    InstallRecord,
    OAcceptRecord,
    OCommitRecord,
    Record,
    RejoinRecord,
    ReserveRecord,
    SnapshotRecord,
    ViewRecord,
)

# Records that only promise (a view, an epoch, a ballot, a reservation, what a replica that
# lost its disk may not report yet): compaction keeps the highest (the latest rejoin) of each.
PROMISE_RECORDS = (EpochRecord, ViewRecord, CPromiseRecord, ReserveRecord, RejoinRecord)


def holds_snapshot(records: Sequence[Record]) -> bool:
    """Whether a snapshot record is among `records` (a Ready's, an append's)."""
    for record in records:  # noqa: SIM110 - a loop, not any() over a generator: every Ready
        if type(record) is SnapshotRecord:
            return True
    return False


def compact_records(records: Sequence[Record]) -> list[Record]:
    """An equivalent, shorter record list: the latest snapshot, the promises, and what the
    snapshot does not cover, in their original order."""
    last = max((position for position, record in enumerate(records)
                if isinstance(record, SnapshotRecord)), default=None)
    if last is None:
        return list(records)
    snapshot = records[last]
    assert isinstance(snapshot, SnapshotRecord)
    kept: list[Record] = [*_promises(records[:last]), snapshot]
    for record in records[:last]:
        trimmed = _uncovered(record, snapshot)
        if trimmed is not None:
            kept.append(trimmed)
    kept = _newest_covered_install_only(kept, snapshot.meta.slot)
    kept.extend(records[last + 1:])
    return kept


def _newest_covered_install_only(kept: list[Record], snapshot_slot: int) -> list[Record]:
    """Of the installs the snapshot covers whole (their end at or below its slot), only the
    newest view's last one still rules: it sets the installed view and end, and forgets the
    older views' values from its end on, which takes in everything an older covered install
    forgot past the snapshot. (Kept all, one per view change and one per re-install, the log
    grew with the replica's whole history.)"""
    covered = [position for position, record in enumerate(kept)
               if isinstance(record, InstallRecord) and not record.values
               and record.start <= snapshot_slot]
    if len(covered) < 2:
        return kept
    newest = max(covered, key=lambda position: (_view_of(kept[position]), position))
    dropped = set(covered) - {newest}
    return [record for position, record in enumerate(kept) if position not in dropped]


def _view_of(record: Record) -> int:
    assert isinstance(record, InstallRecord)
    return record.view


def _promises(records: Sequence[Record]) -> list[Record]:
    epoch = max((record.epoch for record in records if isinstance(record, EpochRecord)),
                default=None)
    view = max((record.view for record in records if isinstance(record, ViewRecord)),
               default=None)
    ballots: dict[int, int] = {}
    for record in records:
        if isinstance(record, CPromiseRecord):
            ballots[record.space] = max(ballots.get(record.space, 0), record.ballot)
    kept: list[Record] = []
    if epoch is not None:
        kept.append(EpochRecord(epoch))
    if view is not None:
        kept.append(ViewRecord(view))
    kept.extend(CPromiseRecord(space, ballots[space]) for space in sorted(ballots))
    reserved = max((record.upto for record in records if isinstance(record, ReserveRecord)),
                   default=None)
    if reserved is not None:
        kept.append(ReserveRecord(reserved))
    rejoins = [record for record in records if isinstance(record, RejoinRecord)]
    if rejoins:
        kept.append(rejoins[-1])
    return kept


def _uncovered(record: Record, snapshot: SnapshotRecord) -> Record | None:
    """The part of an acceptance or commit the snapshot does not cover, if any."""
    meta = snapshot.meta
    if isinstance(record, CAcceptRecord | CCommitRecord):
        return record if record.index >= meta.exec_counts[record.space] else None
    if isinstance(record, OAcceptRecord):
        skip = max(0, meta.slot - record.start)
        if skip >= len(record.values):
            return None
        return OAcceptRecord(record.view, record.start + skip, record.values[skip:])
    if isinstance(record, InstallRecord):  # kept even when covered: its end still rules
        skip = min(max(0, meta.slot - record.start), len(record.values))
        return InstallRecord(record.view, record.start + skip, record.values[skip:])
    if isinstance(record, OCommitRecord):
        pairs = [(slot, value) for slot, value in zip(record.slots, record.values, strict=True)
                 if slot >= meta.slot]
        if not pairs:
            return None
        return OCommitRecord(tuple(slot for slot, _ in pairs),
                             tuple(value for _, value in pairs))
    return None
