"""A replica that forgot is refused by the peers that heard it, and stops itself
(`consensus/runtime/peer_lives.py`).

Goal: a replica started over on an empty (or another) data directory, or on an older copy of
its own, is refused by every peer that heard its earlier life, and stops with exit 78 when a
peer tells it so; a replica restarted on its own directory is heard as before, and what each
replica heard survives its own restart. The lives file and the hello are validated before use.

Method: pure checks of `Life` and `PeerLives`, then meshes on loopback (plain TCP: the check
is the hello's, not the certificate's) given lives files in temporary directories."""

from __future__ import annotations

import json
import pathlib
import shutil

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from consensus.config import ReplicaConfig
from consensus.prng import Prng
from consensus.replica import Replica
from consensus.runtime.data_identity import DataIdentity, new_disk_id
from consensus.runtime.framing import LIFE_REFUSED
from consensus.runtime.peer_lives import (
    LIVES_NAME,
    UNKNOWN_LIFE,
    Life,
    PeerLives,
    new_start_id,
)
from consensus.runtime.peers import Hello, LinkTiming, PeerMesh
from consensus.runtime.storage import DurableLog
from consensus.runtime.storage_errors import (
    EXIT_DATA_DIRECTORY_MISMATCH,
    DataDirectoryForgotten,
    LogCorrupt,
)
from tests.consensus.runtime.test_peers import (
    TIME_LIMIT_S,
    Inbox,
    eventually,
    free_ports,
    mesh_of,
    start,
)
from tests.consensus.runtime.test_storage import accepts, snapshot

DISK_A, DISK_B = "a" * 32, "b" * 32

CONFIG = ReplicaConfig(replica_id=0, replica_count=3).validate()

disks = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)
starts = st.text(alphabet="0123456789abcdef", min_size=16, max_size=16)
lives = st.builds(Life, disks, st.integers(min_value=0, max_value=2**40), starts)


def test_a_life_forgot_another_disk_or_an_older_start_and_nothing_else() -> None:
    heard = Life(DISK_A, 5)
    assert Life(DISK_A, 5).forgot(heard) is None  # a reconnection of the same life
    assert Life(DISK_A, 6).forgot(heard) is None  # a restart on its own directory
    assert "started over on an empty or another directory" in str(Life(DISK_B, 9).forgot(heard))
    assert "restored from an older copy" in str(Life(DISK_A, 4).forgot(heard))
    process = Life(DISK_A, 5, "1" * 16)
    assert process.forgot(process) is None
    assert "copy taken before its last start" in str(Life(DISK_A, 5, "2" * 16).forgot(process))
    assert Life(DISK_A, 6, "2" * 16).forgot(process) is None
    assert UNKNOWN_LIFE.forgot(heard) is None  # an older build, or a test of the runtime
    assert Life(DISK_B, 1).forgot(UNKNOWN_LIFE) is None  # never heard


def test_lives_are_news_once_and_survive_a_reload(tmp_path: pathlib.Path) -> None:
    lives = PeerLives.load(tmp_path)
    assert lives.of(1) == UNKNOWN_LIFE
    assert lives.hear(1, Life(DISK_A, 1))
    assert not lives.hear(1, Life(DISK_A, 1))
    assert not lives.hear(2, UNKNOWN_LIFE)
    assert lives.hear(2, Life(DISK_B, 3))
    lives.save()
    again = PeerLives.load(tmp_path)
    assert (again.of(1), again.of(2), again.of(0)) == (Life(DISK_A, 1), Life(DISK_B, 3),
                                                        UNKNOWN_LIFE)


@pytest.mark.parametrize("text", [
    b"[]", b"{", b'{"x": {"disk": "' + DISK_A.encode() + b'", "epoch": 1}}',
    b'{"1": {"disk": "short", "epoch": 1}}',
    b'{"1": {"disk": "' + DISK_A.encode() + b'", "epoch": -1}}',
    b'{"1": {"disk": "' + DISK_A.encode() + b'", "epoch": 1.0}}',
    b'{"1": {"disk": "' + DISK_A.encode() + b'", "epoch": 1, "more": 2}}',
    "{\"\u00b2\": {\"disk\": \"" .encode() + DISK_A.encode() + b'", "epoch": 1}}',
    b"{" + b" " * 70_000 + b"}",
    json.dumps({"9" * 5000: {"disk": DISK_A, "epoch": 1}}).encode(),  # past int()'s digits
    json.dumps({"1": {"disk": DISK_A, "epoch": 9}, "01": {"disk": DISK_A, "epoch": 1}}).encode(),
    json.dumps({"1": {"disk": DISK_A, "epoch": 1, "start": "xyz"}}).encode(),
])
def test_a_lives_file_that_is_not_ours_is_refused(tmp_path: pathlib.Path, text: bytes) -> None:
    (tmp_path / LIVES_NAME).write_bytes(text)
    with pytest.raises(LogCorrupt):
        PeerLives.load(tmp_path)


@given(lives, lives, st.integers(min_value=0, max_value=6))
def test_a_hello_carries_both_lives(life: Life, yours: Life, replica_id: int) -> None:
    hello = Hello(replica_id, LinkTiming(), life, yours)
    assert Hello.parse(hello.encode()) == hello


def test_a_hello_with_a_malformed_life_is_none() -> None:
    encoded = Hello(1, LinkTiming(), Life(DISK_A, 2), Life(DISK_B, 3)).encode()
    for garbage in (encoded.replace(DISK_A.encode(), b"A" * 32),
                    encoded.replace(b'"epoch": 2', b'"epoch": -2'),
                    encoded.replace(b'"epoch": 2', b'"epoch": "2"'),
                    encoded.replace(b'"your_disk"', b'"their_disk"')):
        assert Hello.parse(garbage) is None, garbage


class MeshReplica:
    """A mesh with its own life and a lives file in its own directory."""

    def __init__(self, tmp_path: pathlib.Path, replica_id: int, ports: dict[int, int],
                 life: Life) -> None:
        self.directory = tmp_path / f"replica-{replica_id}"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.inbox = Inbox()
        self.mesh: PeerMesh = mesh_of(None, replica_id, ports, self.inbox, life=life,
                                      lives=PeerLives.load(self.directory))


async def _exchange(first: MeshReplica, second: MeshReplica) -> None:
    """Both meshes up until each got a frame from the other."""
    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            for replica in (first, second):
                await start(group, replica.mesh)
            assert first.mesh.send(1, b"to 1") and second.mesh.send(0, b"to 0")
            await eventually(lambda: bool(first.inbox.frames and second.inbox.frames))
            for replica in (first, second):
                await replica.mesh.wait_connected()
            group.cancel_scope.cancel()


async def _met_forgetful(peer: MeshReplica, forgetful: MeshReplica) -> BaseException:
    """Run both until the forgetful one stops; what it stopped with."""
    stopped: list[BaseException] = []

    async def run_forgetful(*, task_status: anyio.abc.TaskStatus[tuple[str, int]],
                            ) -> None:
        try:
            await forgetful.mesh.run(task_status=task_status)
        except DataDirectoryForgotten as error:
            stopped.append(error)

    with anyio.fail_after(TIME_LIMIT_S):
        async with anyio.create_task_group() as group:
            await start(group, peer.mesh)
            await group.start(run_forgetful)
            assert forgetful.mesh.send(0, b"forgotten promise")
            await eventually(lambda: bool(stopped) and peer.mesh.metrics[LIFE_REFUSED] > 0)
            group.cancel_scope.cancel()
    assert peer.inbox.frames == []
    return stopped[0]


@pytest.mark.anyio
@pytest.mark.parametrize("later", [Life(DISK_B, 1), Life(DISK_A, 1)],
                         ids=["started-over", "restored-copy"])
async def test_a_replica_that_forgot_is_refused_and_stops(tmp_path: pathlib.Path,
                                                          later: Life) -> None:
    ports = dict(enumerate(free_ports(2)))
    await _exchange(MeshReplica(tmp_path, 0, ports, Life(DISK_B, 1)),
                    MeshReplica(tmp_path, 1, ports, Life(DISK_A, 2)))
    # replica 0 restarts on its own directory; replica 1 comes back having forgotten
    peer = MeshReplica(tmp_path, 0, ports, Life(DISK_B, 2))
    assert peer.mesh.lives is not None and peer.mesh.lives.of(1) == Life(DISK_A, 2)
    forgetful = MeshReplica(tmp_path / "replaced", 1, ports, later)
    stopped = await _met_forgetful(peer, forgetful)
    assert isinstance(stopped, DataDirectoryForgotten)
    assert stopped.exit_code == EXIT_DATA_DIRECTORY_MISMATCH == 78
    assert "replica 0 heard this replica before" in str(stopped)
    assert "--rejoin on a new, empty one" in str(stopped) and "identity.json" in str(stopped)
    assert "forgotten promises" in peer.mesh.refused[1]


@pytest.mark.anyio
async def test_a_replica_restarted_on_its_own_directory_is_heard_and_written_down(
        tmp_path: pathlib.Path) -> None:
    ports = dict(enumerate(free_ports(2)))
    first_disk, second_disk = new_disk_id(), new_disk_id()
    await _exchange(MeshReplica(tmp_path, 0, ports, Life(first_disk, 1)),
                    MeshReplica(tmp_path, 1, ports, Life(second_disk, 1)))
    restarted = [MeshReplica(tmp_path, 0, ports, Life(first_disk, 2)),
                 MeshReplica(tmp_path, 1, ports, Life(second_disk, 7))]
    await _exchange(*restarted)
    assert [replica.mesh.metrics[LIFE_REFUSED] for replica in restarted] == [0, 0]
    assert PeerLives.load(restarted[0].directory).of(1) == Life(second_disk, 7)
    assert PeerLives.load(restarted[1].directory).of(0) == Life(first_disk, 2)


def _opened(directory: pathlib.Path, *, create: bool = False) -> tuple[DurableLog, Replica]:
    """A replica started on `directory` as `cellar replica` starts one: its first Ready
    (this start's EpochRecord) durable."""
    log = DurableLog.open(directory, create=create, compact_after_bytes=4096,
                          identity=DataIdentity(0, 3))
    replica = Replica.restore(CONFIG, Prng(1), log.records())
    log.append(replica.ready().records)
    log.sync()
    replica.advance()
    return log, replica


def test_the_epoch_grows_by_one_a_start_across_compactions(tmp_path: pathlib.Path) -> None:
    """A restart on the own directory is never refused: its epoch is above every earlier
    start's, compactions in between too."""
    log, replica = _opened(tmp_path, create=True)
    epochs, compactions = [replica.epoch], 0
    for round_ in range(4):
        log.append(accepts(round_ * 100, 60, 1000))
        log.append([snapshot(round_ * 100 + 50, 100)])
        log.sync()
        log.append(accepts(round_ * 100 + 60, 20, 1000))
        log.sync()
        compactions += log.statistics().compactions
        log.close()
        log, replica = _opened(tmp_path)
        epochs.append(replica.epoch)
    log.close()
    assert compactions >= 3
    assert epochs == list(range(epochs[0], epochs[0] + len(epochs)))


def test_a_copy_taken_at_a_stop_and_restored_after_the_next_start_forgot_that_start(
        tmp_path: pathlib.Path) -> None:
    """The usual backup: stop, copy, start again. Restored after that start, the copy comes
    back at the very epoch the peers heard; only the process's start id tells them apart."""
    own, backup = tmp_path / "data", tmp_path / "backup"
    log, _ = _opened(own, create=True)
    log.close()
    shutil.copytree(own, backup)
    log, replica = _opened(own)
    assert log.identity is not None
    heard = Life(log.identity.disk, replica.epoch, new_start_id())
    log.close()
    shutil.rmtree(own)
    shutil.copytree(backup, own)
    log, replica = _opened(own)
    assert log.identity is not None
    restored = Life(log.identity.disk, replica.epoch, new_start_id())
    log.close()
    assert restored.epoch == heard.epoch
    assert "copy taken before its last start" in str(restored.forgot(heard))


@pytest.mark.anyio
async def test_a_copy_restored_at_the_epoch_heard_is_refused_and_stops(
        tmp_path: pathlib.Path) -> None:
    ports = dict(enumerate(free_ports(2)))
    await _exchange(MeshReplica(tmp_path, 0, ports, Life(DISK_B, 1, new_start_id())),
                    MeshReplica(tmp_path, 1, ports, Life(DISK_A, 2, new_start_id())))
    peer = MeshReplica(tmp_path, 0, ports, Life(DISK_B, 2, new_start_id()))
    restored = MeshReplica(tmp_path / "restored", 1, ports, Life(DISK_A, 2, new_start_id()))
    stopped = await _met_forgetful(peer, restored)
    assert "copy taken before its last start" in str(stopped)
    assert "copy taken before its last start" in peer.mesh.refused[1]


@pytest.mark.anyio
async def test_a_process_that_reconnects_is_heard_again(tmp_path: pathlib.Path) -> None:
    ports = dict(enumerate(free_ports(2)))
    both = Life(DISK_B, 1, new_start_id()), Life(DISK_A, 2, new_start_id())
    await _exchange(*(MeshReplica(tmp_path, i, ports, life) for i, life in enumerate(both)))
    again = [MeshReplica(tmp_path, i, ports, life) for i, life in enumerate(both)]
    await _exchange(*again)
    assert [replica.mesh.metrics[LIFE_REFUSED] for replica in again] == [0, 0]
