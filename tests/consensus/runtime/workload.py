"""A deterministic, endless stream of a replica's records, shared by the tests and the child
processes they kill: the same seed gives the same records, so a parent can tell exactly what
a killed child wrote.

Values grow the way a replica's do (views, ballots, indexes and snapshot slots never go back),
so `compact_records` has real work: snapshots cover earlier acceptances and commits.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

from consensus.messages import Command, SnapshotMeta
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

SPACES = 3


def stream(seed: int, *, snapshot_every: int = 0) -> Iterator[Record]:
    """Records without end; every `snapshot_every`-th one is a snapshot (never when 0)."""
    prng = random.Random(seed)
    indexes = [0] * SPACES
    covered = (0,) * SPACES
    slot = view = epoch = 0
    for position in itertools.count(1):
        if snapshot_every and position % snapshot_every == 0:
            covered = tuple(max(done, index - prng.randrange(3))
                            for done, index in zip(covered, indexes, strict=True))
            yield SnapshotRecord(SnapshotMeta(max(0, slot - 2), covered, (0,) * SPACES,
                                              (0,) * SPACES, ((),) * SPACES),
                                 prng.randbytes(prng.randrange(2_000)))
            continue
        kind = prng.randrange(11)
        space = prng.randrange(SPACES)
        if kind == 0:
            epoch += 1
            yield EpochRecord(epoch)
        elif kind == 1:
            view += prng.randrange(2)
            yield ViewRecord(view)
        elif kind == 2:
            yield CPromiseRecord(space, view + prng.randrange(3))
        elif kind in (3, 4, 5):
            commands = tuple(Command(space, prng.randrange(1 << 40),
                                     prng.randbytes(prng.randrange(200)))
                             for _ in range(prng.randrange(1, 4)))
            indexes[space] += 1
            yield CAcceptRecord(space, indexes[space] - 1, view, commands)
        elif kind == 6:
            yield CCommitRecord(space, max(0, indexes[space] - 1), view, None)
        elif kind in (7, 8):
            values = tuple(prng.randrange(-1, SPACES) for _ in range(prng.randrange(1, 5)))
            slot += len(values)
            kind_of = OAcceptRecord if kind == 7 else InstallRecord
            yield kind_of(view, slot - len(values), values)
        elif kind == 9:
            yield OCommitRecord((max(0, slot - 1),), (prng.randrange(SPACES),))
        elif prng.randrange(8):
            yield ReserveRecord(max(indexes) + prng.randrange(64))
        else:  # what a replica that lost its disk may not report on yet
            yield RejoinRecord(True, slot + prng.randrange(8),
                               tuple(index + prng.randrange(8) for index in indexes))


def take(seed: int, count: int, *, snapshot_every: int = 0) -> list[Record]:
    return list(itertools.islice(stream(seed, snapshot_every=snapshot_every), count))
