"""A snapshot's transfer over links slower than a window per repair period completes, each
byte sent once.

The laggard asked again every repair period while a window's chunks were still coming in;
each peer serving it sent the window's rest again, behind the chunks on their way. The copies
piled up ahead of the next window until no new chunk came for TRANSFER_PATIENCE_REPAIRS
periods; the laggard then gave the transfer up and started over from the first byte at
another peer, whose link filled the same way: the snapshot never arrived."""

from __future__ import annotations

from consensus.config import ReplicaConfig
from consensus.messages import FetchRequest, Heartbeat, SnapshotChunk
from consensus.prng import Prng
from consensus.records import SnapshotRecord
from consensus.replica import Replica
from tests.consensus.test_replica import SNAPSHOT_META

CHUNK_BYTES, WINDOW_BYTES = 4, 16
STATE = bytes(range(160))  # ten windows of four chunks
TICKS_PER_CHUNK = 15  # a window takes 60 ticks on each link, two repair periods
STEPS_MAX = 20 * len(STATE) // CHUNK_BYTES * TICKS_PER_CHUNK  # twenty times what it needs


def _config(replica_id: int) -> ReplicaConfig:
    return ReplicaConfig(replica_id=replica_id, replica_count=3,
                         snapshot_chunk_bytes=CHUNK_BYTES, snapshot_window_bytes=WINDOW_BYTES)


def test_a_snapshot_arrives_over_slow_links_each_byte_sent_once() -> None:
    servers = {replica: Replica.restore(_config(replica), Prng(replica),
                                        [SnapshotRecord(SNAPSHOT_META, STATE)])
               for replica in (0, 1)}
    for server in servers.values():
        server.ready()
        server.advance()
    assert servers[0].config.repair_ticks < WINDOW_BYTES // CHUNK_BYTES * TICKS_PER_CHUNK
    laggard = Replica(_config(2), Prng(2))
    links: dict[int, list[SnapshotChunk]] = {replica: [] for replica in servers}  # FIFO
    bytes_sent = 0
    for step in range(STEPS_MAX):
        laggard.step(Heartbeat(0, 0, SNAPSHOT_META.slot, 0))  # behind, and stays in view
        laggard.tick()
        ready = laggard.ready()
        laggard.advance()
        if ready.snapshot_to_install is not None:
            assert ready.snapshot_to_install.state == STATE
            break
        for target, message in ready.messages:
            if isinstance(message, FetchRequest) and target in servers:
                servers[target].step(message)
        for replica, server in servers.items():
            server.tick()
            sent = [message for target, message in server.ready().messages
                    if target == 2 and isinstance(message, SnapshotChunk)]
            server.advance()
            bytes_sent += sum(len(message.data) for message in sent)
            links[replica].extend(sent)
            if step % TICKS_PER_CHUNK == 0 and links[replica]:
                laggard.step(links[replica].pop(0))
    else:
        raise AssertionError(f"the snapshot never arrived: {bytes_sent} bytes sent for "
                             f"{len(STATE)}")
    assert bytes_sent == len(STATE)
