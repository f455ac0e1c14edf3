"""Compacting the record log keeps every promise: replaying the compacted records rebuilds
exactly the replica that replaying all of them does."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from consensus.config import ReplicaConfig
from consensus.messages import SnapshotMeta
from consensus.order_log import OrderLog
from consensus.prng import Prng
from consensus.record_log import compact_records
from consensus.records import (
    CAcceptRecord,
    CPromiseRecord,
    EpochRecord,
    InstallRecord,
    OAcceptRecord,
    OCommitRecord,
    Record,
    ReserveRecord,
    SnapshotRecord,
    ViewRecord,
)
from consensus.replica import Replica
from jepsen.sim import disk
from jepsen.sim.options import SimOptions, swarm
from jepsen.sim.runner import build, heal


def state_of(replica: Replica) -> Any:
    ctx = replica._ctx  # white-box: the test compares whole replica states
    spaces = [(space.promised, space.base, space.max_index,
               sorted((index, slot.ballot, slot.batch, slot.committed)
                      for index, slot in space.slots.items()))
              for space in ctx.clog.spaces]
    olog = ctx.olog
    slots = sorted((slot, entry.value, entry.view, entry.committed)
                   for slot, entry in olog.slots.items())
    return ctx.view, ctx.epoch, spaces, slots, olog.base, olog.count_base, \
        replica.executed_slots, olog.installed_view, olog.installed_end, \
        replica._leader.reserved_upto


def raw_records(seed: int, monkeypatch: pytest.MonkeyPatch) -> list[list[Record]]:
    monkeypatch.setattr(disk, "compact_records", list)
    options = swarm(seed, SimOptions(seed=seed, safety_ms=600, liveness_ms=600))
    options = dataclasses.replace(options, snapshot_every_slots=25)
    cluster = build(options)
    for client in range(options.clients):
        cluster.add_client(client, client * 137)
    cluster.run_until(options.safety_ms * 1000)
    heal(cluster)
    cluster.run_until((options.safety_ms + options.liveness_ms) * 1000)
    return [node.disk.records() for node in cluster.nodes]


@pytest.mark.parametrize("seed", [3, 8])
def test_compacted_records_replay_to_the_same_replica(seed: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for replica_id, records in enumerate(raw_records(seed, monkeypatch)):
        assert any(isinstance(record, SnapshotRecord) for record in records)
        compacted = compact_records(records)
        assert len(compacted) < len(records)
        config = build(SimOptions(seed=seed)).nodes[replica_id].config
        whole = Replica.restore(config, Prng(1), records)
        short = Replica.restore(config, Prng(1), compacted)
        assert state_of(short) == state_of(whole)


def meta(slot: int, exec_counts: tuple[int, ...]) -> SnapshotMeta:
    return SnapshotMeta(slot, exec_counts, (slot, 0, 0), (0, 0, 0), ((), (), ()))


def test_promises_and_uncovered_acceptances_survive_compaction() -> None:
    records: list[Record] = [
        EpochRecord(1), ViewRecord(3), CPromiseRecord(1, 17),
        CAcceptRecord(0, 4, 0, ()), CAcceptRecord(0, 9, 0, ()),
        OAcceptRecord(3, 0, (0, 0, 0, 0, 0, 0)), OCommitRecord((2, 5), (0, 0)),
        SnapshotRecord(meta(5, (5, 0, 0)), b"state"), ViewRecord(4),
    ]
    assert compact_records(records) == [
        EpochRecord(1), ViewRecord(3), CPromiseRecord(1, 17),
        SnapshotRecord(meta(5, (5, 0, 0)), b"state"),
        CAcceptRecord(0, 9, 0, ()), OAcceptRecord(3, 5, (0,)), OCommitRecord((5,), (0,)),
        ViewRecord(4),
    ]


def test_the_highest_reservation_survives_compaction_and_replays() -> None:
    records: list[Record] = [
        ReserveRecord(128), CAcceptRecord(1, 4, 0, ()), ReserveRecord(192),
        SnapshotRecord(meta(5, (0, 5, 0)), b"state"), ReserveRecord(160),
    ]
    compacted = compact_records(records)
    assert compacted == [ReserveRecord(192), SnapshotRecord(meta(5, (0, 5, 0)), b"state"),
                         ReserveRecord(160)]
    config = ReplicaConfig(replica_id=1, replica_count=3)
    for kept in (records, compacted):
        assert Replica.restore(config, Prng(1), kept)._leader.reserved_upto == 192


def test_without_a_snapshot_nothing_is_dropped() -> None:
    records: list[Record] = [ViewRecord(1), CAcceptRecord(0, 0, 0, ())]
    assert compact_records(records) == records


def test_an_installed_view_log_survives_compaction_as_its_end_when_covered() -> None:
    records: list[Record] = [
        OAcceptRecord(0, 0, (1,) * 8), ViewRecord(2), InstallRecord(2, 2, (0, 0)),
        SnapshotRecord(meta(5, (0, 5, 0)), b"state"),
    ]
    assert compact_records(records) == [
        ViewRecord(2), SnapshotRecord(meta(5, (0, 5, 0)), b"state"),
        OAcceptRecord(0, 5, (1, 1, 1)), InstallRecord(2, 4, ()),  # replayed: 5..7 forgotten
    ]


def test_a_restarted_replica_forgets_again_what_an_installed_view_log_ruled_out() -> None:
    """Slots 1 and 2, accepted in view 0, lie past view 2's log (it ends at slot 1): they were
    forgotten when it was installed, and stay forgotten after a restart, so a later vote does
    not report them."""
    config = build(SimOptions(seed=1)).nodes[1].config
    records: list[Record] = [OAcceptRecord(0, 0, (1, 1, 1)), OCommitRecord((2,), (1,)),
                             ViewRecord(2), InstallRecord(2, 0, (0,))]
    olog = Replica.restore(config, Prng(1), records)._ctx.olog
    assert {slot: (entry.value, entry.view) for slot, entry in olog.slots.items()} == {
        0: (0, 2), 2: (1, 0)}  # a slot known committed stays
    assert (olog.installed_view, olog.installed_end) == (2, 1)


def test_compaction_keeps_only_the_newest_of_the_installs_it_covers_whole() -> None:
    """One install per view change (and per re-install) would otherwise stay for good."""
    records: list[Record] = []
    for view in range(1, 1001):
        records += [ViewRecord(view), InstallRecord(view, view - 1, (1,)),
                    OCommitRecord((view - 1,), (1,))]
    for _ in range(3):  # compacted again and again, as the storage does
        records = compact_records([*records, SnapshotRecord(meta(1000, (0, 1000, 0)), b"s")])
    assert [record for record in records if isinstance(record, InstallRecord)] == [
        InstallRecord(1000, 1000, ())]


def slots_from(olog: OrderLog, start: int) -> dict[int, tuple[int, int, bool]]:
    return {slot: (entry.value, entry.view, entry.committed)
            for slot, entry in olog.slots.items() if slot >= start}


def test_a_compacted_log_with_installs_replays_to_the_same_replica() -> None:
    """Older views' values past each install's end, installs covered whole and in part: the
    compacted records rebuild the same O-log and installed view as all of them."""
    config = build(SimOptions(seed=1)).nodes[1].config
    records: list[Record] = [
        OAcceptRecord(0, 0, (1,) * 12), ViewRecord(2), InstallRecord(2, 0, (0, 0)),
        OAcceptRecord(2, 2, (2, 2, 2)), OCommitRecord((0, 1, 2), (0, 0, 2)),
        OAcceptRecord(1, 6, (1, 1)),  # a late accept of view 1, ruled out by the next install
        ViewRecord(3), InstallRecord(3, 3, (2, 2)), OAcceptRecord(3, 5, (0,)),
        ViewRecord(4), InstallRecord(4, 3, (2, 2, 0, 1)),
    ]
    compacted = compact_records([*records, SnapshotRecord(meta(4, (2, 1, 1)), b"state")])
    assert [record for record in compacted if isinstance(record, InstallRecord)] == [
        InstallRecord(2, 2, ()), InstallRecord(3, 4, (2,)), InstallRecord(4, 4, (2, 0, 1))]
    whole = Replica.restore(config, Prng(1), records)._ctx.olog
    short = Replica.restore(config, Prng(1), compacted)._ctx.olog
    assert slots_from(short, 4) == slots_from(whole, 4)
    assert (short.installed_view, short.installed_end) == (whole.installed_view,
                                                           whole.installed_end) == (4, 7)
