"""A snapshot transfer that execution overtook is never finished, so its bytes must not be held:
a replica that started receiving a snapshot and then executed past its slot through the log
(a peer that still had the entries answered its fetch) kept the received bytes (up to
snapshot_bytes_max, 1 GiB) and kept asking the sender for the rest."""

from __future__ import annotations

import dataclasses

from consensus.catchup import state_digest
from consensus.messages import SnapshotChunk
from tests.consensus.test_election_edges import warmed_up
from tests.consensus.test_replica import SNAPSHOT_META


def test_a_transfer_execution_overtook_lets_its_bytes_go() -> None:
    cluster = warmed_up({0: b"w0"})
    laggard = cluster.node(2)
    slot = laggard.executed_slots + 2
    meta = dataclasses.replace(SNAPSHOT_META, slot=slot)
    state = bytes(1 << 16)
    first = SnapshotChunk(0, 0, meta, 0, len(state), state_digest(state), state[:4096])
    laggard.step(first)
    assert len(laggard._catchup._received) == 4096  # the transfer started
    for round_ in range(10):
        cluster.node(round_ % 3).propose(b"c%d" % round_)
        for _ in range(5):
            cluster.round()
    assert laggard.executed_slots > slot  # executed past the snapshot by the log
    late = SnapshotChunk(0, 0, meta, 4096, len(state), state_digest(state), state[4096:8192])
    laggard.step(late)  # and a late chunk of it arrives
    assert laggard._catchup._receiving is None
    assert len(laggard._catchup._received) == 0
