"""A replica started with `--rejoin` on a new directory after its old one was lost
(`consensus.rejoin`): its hello says so, its peers take the new directory (and still refuse
one that does not say so), it hears from them how far its old life went instead of stopping,
and the node makes the rejoin durable before anything else."""

from __future__ import annotations

import pathlib

import anyio
import pytest

from consensus.config import ReplicaConfig
from consensus.records import RejoinRecord
from consensus.runtime.data_identity import DataIdentity, new_disk_id
from consensus.runtime.framing import LIFE_REFUSED, PEER_REJOINED
from consensus.runtime.node import start_replica
from consensus.runtime.peer_lives import Life, PeerLives
from consensus.runtime.peers import Hello, LinkTiming
from consensus.runtime.storage import DurableLog
from consensus.runtime.storage_errors import DataDirectoryForgotten
from tests.consensus.runtime.test_peer_lives import DISK_A, DISK_B, MeshReplica, _exchange
from tests.consensus.runtime.test_peers import (
    certificates,  # noqa: F401  (fixture)
    free_ports,
    mesh_of,
)

pytestmark = pytest.mark.anyio


def test_only_a_rejoining_hello_says_so() -> None:
    plain = Hello(1, LinkTiming(), Life(DISK_A, 2), Life(DISK_B, 3))
    rejoining = Hello(1, LinkTiming(), Life(DISK_A, 0), Life(DISK_B, 3), rejoining=True)
    assert b"rejoining" not in plain.encode()  # read by builds from before the field
    assert Hello.parse(plain.encode()) == plain
    assert Hello.parse(rejoining.encode()) == rejoining
    for garbage in (b'"rejoining": false', b'"rejoining": 1', b'"rejoining": "yes"'):
        assert Hello.parse(rejoining.encode().replace(b'"rejoining": true', garbage)) is None


class TlsMeshReplica(MeshReplica):
    """A mesh of a group with certificates: only there is a rejoin taken."""

    def __init__(self, tmp_path: pathlib.Path, replica_id: int, ports: dict[int, int],
                 life: Life, authority: pathlib.Path | None) -> None:
        super().__init__(tmp_path, replica_id, ports, life)
        self.mesh = mesh_of(authority, replica_id, ports, self.inbox, life=life,
                            lives=PeerLives.load(self.directory))


def rejoiner(tmp_path: pathlib.Path, ports: dict[int, int], life: Life,
             old_lives: list[Life], authority: pathlib.Path | None) -> MeshReplica:
    replica = TlsMeshReplica(tmp_path / "new-directory", 1, ports, life, authority)
    replica.mesh.rejoining = lambda: True
    replica.mesh.on_old_life = old_lives.append
    return replica


async def test_a_rejoining_replica_is_taken_on_its_new_directory_and_learns_its_old_life(
        tmp_path: pathlib.Path, certificates: pathlib.Path) -> None:  # noqa: F811
    ports = dict(enumerate(free_ports(2)))
    await _exchange(TlsMeshReplica(tmp_path, 0, ports, Life(DISK_B, 1), certificates),
                    TlsMeshReplica(tmp_path, 1, ports, Life(DISK_A, 5), certificates))
    peer = TlsMeshReplica(tmp_path, 0, ports, Life(DISK_B, 2), certificates)
    taken_back: list[tuple[int, Life]] = []
    peer.mesh.on_peer_rejoined = lambda replica, old: taken_back.append((replica, old))
    new_disk, old_lives = new_disk_id(), list[Life]()
    back = rejoiner(tmp_path, ports, Life(new_disk, 0), old_lives, certificates)
    await _exchange(peer, back)  # frames both ways: nobody refused, nobody stopped
    assert peer.mesh.metrics[PEER_REJOINED] == 1 and peer.mesh.metrics[LIFE_REFUSED] == 0
    assert PeerLives.load(peer.directory).of(1) == Life(new_disk, 0)
    # The peer's core hears how far the lost life went; the rejoiner hears it too where the
    # peer dialed it before it heard the new directory (which of the two dials first varies).
    assert [(replica, old.disk, old.epoch) for replica, old in taken_back] == [(1, DISK_A, 5)]
    assert all((life.disk, life.epoch) == (DISK_A, 5) for life in old_lives)


@pytest.mark.parametrize("says_it_rejoins", [False, True], ids=["plain", "insecure-rejoin"])
async def test_a_new_directory_is_refused_unless_it_rejoins_with_tls(
        tmp_path: pathlib.Path, says_it_rejoins: bool) -> None:
    """Without TLS a hello proves nothing: a forged "rejoining" one taken would make the peer
    refuse the real replica's directory from then on."""
    ports = dict(enumerate(free_ports(2)))
    await _exchange(MeshReplica(tmp_path, 0, ports, Life(DISK_B, 1)),
                    MeshReplica(tmp_path, 1, ports, Life(DISK_A, 5)))
    peer = MeshReplica(tmp_path, 0, ports, Life(DISK_B, 2))
    plain = MeshReplica(tmp_path / "new-directory", 1, ports, Life(new_disk_id(), 0))
    plain.mesh.rejoining = lambda: says_it_rejoins
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await group.start(peer.mesh.run)
            group.start_soon(_run_quietly, plain)
            plain.mesh.send(0, b"forgotten promise")
            while not peer.mesh.metrics[LIFE_REFUSED]:
                await anyio.sleep(0.01)
            group.cancel_scope.cancel()
    assert peer.inbox.frames == [] and peer.mesh.metrics[PEER_REJOINED] == 0
    assert ("a rejoin needs TLS" in peer.mesh.refused[1]) is says_it_rejoins
    assert PeerLives.load(peer.directory).of(1) == Life(DISK_A, 5)


async def _run_quietly(replica: MeshReplica) -> None:
    try:
        await replica.mesh.run()
    except DataDirectoryForgotten:  # told it forgot: the subject of test_peer_lives.py
        return


def test_the_node_makes_a_rejoin_durable_before_the_core_starts(
        tmp_path: pathlib.Path) -> None:
    """A crash before the core's first Ready must leave a log that still asks, whatever flag
    the next start is given."""
    config = ReplicaConfig(replica_id=1, replica_count=3)
    identity = DataIdentity(1, 3, "kv")
    with DurableLog.open(tmp_path, create=True, identity=identity) as log:
        replica = start_replica(config, log, rejoin=True)
        assert replica.rejoining_now
    with DurableLog.open(tmp_path, create=False, identity=identity) as log:
        assert log.records() == [RejoinRecord(False, 0, ())]
    with DurableLog.open(tmp_path, create=False, identity=identity) as log:
        again = start_replica(config, log, rejoin=False)
        assert again.rejoining_now
