"""Durable records: what a replica must write before it may act on a promise or acceptance.

The core hands these to the runtime in `Ready.records`; the runtime appends them in order and,
when `Ready.must_sync` is set, syncs them before any message of `Ready.messages_after_persist`
leaves. A restarted replica is rebuilt by replaying them (`consensus.restart`), so it never
forgets a view it promised, a ballot it promised or a value it accepted.

Records marked `sync=False` (commit knowledge) speed recovery but could be re-learned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from consensus.messages import Batch, SnapshotMeta


@dataclass(frozen=True, slots=True)
class Record:
    TAG: ClassVar[int] = 0
    SYNC: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class EpochRecord(Record):
    """A new process incarnation: command tags carry it, so they never repeat after a crash."""

    TAG: ClassVar[int] = 60
    epoch: int


@dataclass(frozen=True, slots=True)
class ViewRecord(Record):
    """The replica promised `view`: it will accept nothing from an older view."""

    TAG: ClassVar[int] = 61
    view: int


@dataclass(frozen=True, slots=True)
class CPromiseRecord(Record):
    TAG: ClassVar[int] = 62
    space: int
    ballot: int


@dataclass(frozen=True, slots=True)
class CAcceptRecord(Record):
    TAG: ClassVar[int] = 63
    space: int
    index: int
    ballot: int
    batch: Batch


@dataclass(frozen=True, slots=True)
class CCommitRecord(Record):
    """C(space, index) is chosen; `batch` is None when an accept record already holds it."""

    TAG: ClassVar[int] = 64
    SYNC: ClassVar[bool] = False
    space: int
    index: int
    ballot: int
    batch: Batch | None


@dataclass(frozen=True, slots=True)
class OAcceptRecord(Record):
    TAG: ClassVar[int] = 65
    view: int
    start: int
    values: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class InstallRecord(Record):
    """The replica installed view `view`'s rebuilt O-log, slots [start, start + len(values)):
    it accepted those values in `view`, and no value of an older view past that end can be
    chosen any more (the view's voters would have reported it), so it forgot its own. Replayed
    the same way, so those stale values do not come back after a restart (`OrderLog.install`)."""

    TAG: ClassVar[int] = 68
    view: int
    start: int
    values: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OCommitRecord(Record):
    TAG: ClassVar[int] = 66
    SYNC: ClassVar[bool] = False
    slots: tuple[int, ...]
    values: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SnapshotRecord(Record):
    """The executed prefix up to `meta.slot` is replaced by this state-machine snapshot; the
    runtime may drop every record that came before it."""

    TAG: ClassVar[int] = 67
    meta: SnapshotMeta
    state: bytes


@dataclass(frozen=True, slots=True)
class ReserveRecord(Record):
    """This replica's own C-indexes below `upto` may be in use: a C-accept for one may have
    reached an acceptor. It is on disk before any such C-accept leaves, so a restarted leader
    knows every index it may have sent, even one whose own acceptance was lost in the crash:
    it decides them all before proposing anew, and never puts a new command at an index a
    later view may order for an older proposal (the paper's invariant 7)."""

    TAG: ClassVar[int] = 69
    upto: int


@dataclass(frozen=True, slots=True)
class RejoinRecord(Record):
    """This log was started over on a replica that had lived before on a lost disk
    (`consensus.rejoin`). Until `reported`, it has heard from too few replicas and takes part
    in nothing; after, it answers no prepare and casts no vote that would report indexes below
    `c_ends` (per space) or slots below `o_end` before it knows them decided."""

    TAG: ClassVar[int] = 70
    reported: bool
    o_end: int
    c_ends: tuple[int, ...]


RECORD_TYPES: tuple[type[Record], ...] = (
    EpochRecord, ViewRecord, CPromiseRecord, CAcceptRecord, CCommitRecord, OAcceptRecord,
    OCommitRecord, SnapshotRecord, InstallRecord, ReserveRecord, RejoinRecord,
)
