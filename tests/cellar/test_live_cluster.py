"""Live clusters: real `cellar replica` processes on loopback, real sockets, real disks, real
`kill -9`. Each test runs with the replicas on trio and on asyncio (and the test's own client
on the matching anyio backend)."""

from __future__ import annotations

import pathlib
import shutil
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import anyio
import pytest

from cellar.dev.spec import dev_spec, inventory
from cellar.local_cluster import HOST, Layout, ProcessCluster
from consensus.runtime.certs import identities, init_directory
from consensus.runtime.client import ClientConfig
from consensus.runtime.connect import ConnectRefused, connector
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig
from statemachine.errors import Code, Rejection
from statemachine.results import GroupStatus, NodeRegistered
from statemachine.store import GpuStore

pytestmark = [pytest.mark.live, pytest.mark.anyio]
NODES = ("node-00", "node-01", "node-02", "node-03")
FAST = ClientConfig(attempt_timeout_s=1.0, deadline_s=30.0, sessions=16)



@contextmanager
def running(tmp_path: pathlib.Path, loop: str, **layout: object) -> Iterator[ProcessCluster]:
    cluster_layout = Layout(tmp_path / "cluster", 3, loop="trio" if loop == "trio" else
                            "asyncio", **layout)  # type: ignore[arg-type]
    cluster_layout.write(admins=["root"], schedulers=["sched"], nodes=NODES)
    cluster = ProcessCluster(cluster_layout)
    cluster.start()
    try:
        cluster.wait_ports()
        yield cluster
    finally:
        cluster.stop()


@asynccontextmanager
async def store(cluster: ProcessCluster, role: IdentityRole, name: str
                ) -> AsyncIterator[GpuStore]:
    async with cluster.layout.client(role, name, FAST) as client:
        yield GpuStore(client)


async def configured(cluster: ProcessCluster) -> None:
    async with store(cluster, IdentityRole.ADMIN, "root") as admin:
        assert not isinstance(await admin.apply_config(0, dev_spec(4)), Rejection)
    for node in NODES:
        async with store(cluster, IdentityRole.NODE, node) as agent:
            assert isinstance(await agent.register_node(node, "boot", inventory(node)),
                              NodeRegistered)


async def submit_many(cluster: ProcessCluster, count: int, prefix: str) -> list[str]:
    placed = []
    async with store(cluster, IdentityRole.SCHEDULER, "sched") as scheduler:
        for index in range(count):
            result = await scheduler.submit_gang(f"{prefix}-{index}", "batch", -1, [(1, 1)])
            assert isinstance(result, GroupStatus), result
            placed.append(f"{prefix}-{index}")
    return placed


async def gangs_known(cluster: ProcessCluster) -> set[str]:
    async with store(cluster, IdentityRole.ADMIN, "root") as admin:
        answer = await admin.gangs(limit=1000)
    assert not isinstance(answer, Rejection)
    return {gang["group"] for gang in answer["groups"]}


async def test_a_cluster_serves_commands_and_reads_under_load(tmp_path: pathlib.Path,
                                                              anyio_backend: str) -> None:
    with running(tmp_path, anyio_backend) as cluster, anyio.fail_after(90):
        await configured(cluster)
        async with anyio.create_task_group() as tasks:
            for worker in range(4):
                tasks.start_soon(submit_many, cluster, 15, f"w{worker}")
        assert len(await gangs_known(cluster)) == 60


async def test_kill_9_of_every_replica_loses_nothing_acknowledged(tmp_path: pathlib.Path,
                                                                  anyio_backend: str) -> None:
    with running(tmp_path, anyio_backend) as cluster, anyio.fail_after(120):
        await configured(cluster)
        acknowledged = await submit_many(cluster, 20, "before")
        for process in cluster.processes:
            process.kill()
        cluster.start()
        cluster.wait_ports()
        acknowledged += await submit_many(cluster, 5, "after")
        assert set(acknowledged) <= await gangs_known(cluster)


async def test_the_sequencer_is_killed_and_commits_resume(tmp_path: pathlib.Path,
                                                          anyio_backend: str) -> None:
    with running(tmp_path, anyio_backend) as cluster, anyio.fail_after(120):
        await configured(cluster)
        async with cluster.layout.client(IdentityRole.ADMIN, "root", FAST) as client:
            statuses = [await client.status(endpoint) for endpoint in cluster.layout.endpoints]
        sequencer = next(status["replica_id"] for status in statuses if status["is_sequencer"])
        cluster.processes[sequencer].kill()
        killed_at = time.monotonic()
        await submit_many(cluster, 1, "failover")
        failover_s = time.monotonic() - killed_at
        print(f"commits resumed {failover_s * 1000:.0f} ms after the sequencer was killed")
        cluster.processes[sequencer].start()
        cluster.wait_ports()
        assert "failover-0" in await gangs_known(cluster)


async def test_a_replica_restarted_after_truncation_catches_up_from_a_snapshot(
        tmp_path: pathlib.Path, anyio_backend: str) -> None:
    # Small peer queues: what the others send while replica 2 is down is mostly dropped, so
    # it cannot catch up by replay and must fetch, then take a snapshot.
    with running(tmp_path, anyio_backend, snapshot_every_slots=40,
                 limits={"peer_queue_frames_max": 8}) as cluster, anyio.fail_after(150):
        await configured(cluster)
        cluster.processes[2].stop()
        await submit_many(cluster, 120, "while-away")
        cluster.processes[2].start()
        cluster.wait_ports()
        async with cluster.layout.client(IdentityRole.ADMIN, "root", FAST) as client:
            while True:
                statuses = [await client.status(endpoint)
                            for endpoint in cluster.layout.endpoints]
                if statuses[2]["executed_slots"] >= statuses[0]["executed_slots"] >= 120:
                    break
                await anyio.sleep(0.2)
        assert statuses[2]["metrics"].get("driver.snapshots_installed", 0) >= 1


async def test_a_replica_started_over_on_an_empty_directory_is_refused_and_stops(
        tmp_path: pathlib.Path, anyio_backend: str) -> None:
    """A replaced disk (or `--init` again): the replica forgot promises the others may count
    on. Its peers heard its earlier life, refuse it, and tell it so; it stops with exit 78
    and says why, and the others serve on."""
    with running(tmp_path, anyio_backend) as cluster, anyio.fail_after(60):
        await configured(cluster)
        replaced = cluster.processes[1]
        replaced.stop()
        shutil.rmtree(cluster.layout.data_dir(1))
        replaced.started_before = False  # what an operator does for a new replica: --init
        replaced.start()
        while replaced.running:
            await anyio.sleep(0.05)
        assert replaced.process is not None and replaced.process.returncode == 78
        said = replaced.log_path.read_text()
        assert "heard this replica before" in said and "--rejoin" in said
        assert "Traceback" not in said
        assert await submit_many(cluster, 2, "after-the-refusal")


async def test_a_replica_whose_directory_was_lost_rejoins_and_counts_in_quorums_again(
        tmp_path: pathlib.Path, anyio_backend: str) -> None:
    """The same loss, started with `--rejoin`: its peers take its new directory, it asks them
    what it promised, catches up, and serves; with another replica down it is part of the
    quorum every later command needs, and nothing acknowledged before the loss is lost."""
    with running(tmp_path, anyio_backend) as cluster, anyio.fail_after(120):
        await configured(cluster)
        before = await submit_many(cluster, 5, "before-the-loss")
        lost = cluster.processes[1]
        lost.stop()
        shutil.rmtree(cluster.layout.data_dir(1))
        after_loss = await submit_many(cluster, 3, "while-it-is-gone")
        lost.start(rejoin=True)
        cluster.wait_ports()
        async with cluster.layout.client(IdentityRole.ADMIN, "root", FAST) as client:
            while True:
                statuses = [await client.status(endpoint)
                            for endpoint in cluster.layout.endpoints]
                if statuses[1]["counters"].get("rejoin.cleared", 0) and \
                        statuses[1]["executed_slots"] >= statuses[0]["executed_slots"]:
                    break
                await anyio.sleep(0.2)
        assert sum(status["transport"].get("transport.peers_rejoined", 0)
                   for status in (statuses[0], statuses[2])) == 2
        cluster.processes[2].stop()  # from here on every command needs the rejoined replica
        later = await submit_many(cluster, 3, "with-it-in-the-quorum")
        assert {*before, *after_loss, *later} <= await gangs_known(cluster)
        said = lost.log_path.read_text()
        assert "Traceback" not in said and "heard this replica before" not in said


async def test_a_certificate_from_another_authority_is_refused(tmp_path: pathlib.Path,
                                                                anyio_backend: str) -> None:
    with running(tmp_path, anyio_backend) as cluster, anyio.fail_after(60):
        stranger = tmp_path / "stranger"
        init_directory(stranger, identities(replicas=0, admins=["root"]))
        connect = connector(TlsConfig.in_directory(stranger, Identity(IdentityRole.ADMIN,
                                                                      "root")))
        with pytest.raises(ConnectRefused):
            await connect(cluster.layout.endpoints[0])
        with socket.create_connection((HOST, cluster.layout.client_ports[0])) as raw:
            raw.sendall(b"GET / HTTP/1.0\r\n\r\n")  # plain TCP at a TLS port
            raw.settimeout(5)
            with pytest.raises((ConnectionError, OSError)):
                if not raw.recv(100):  # closed by the server, which also counts it
                    raise ConnectionError("closed")
        await configured(cluster)  # still serving


async def test_a_node_agent_cannot_act_for_another_node(tmp_path: pathlib.Path,
                                                        anyio_backend: str) -> None:
    with running(tmp_path, anyio_backend) as cluster, anyio.fail_after(60):
        await configured(cluster)
        async with store(cluster, IdentityRole.NODE, "node-00") as agent:
            refused = await agent.register_node("node-01", "boot-2", inventory("node-01"))
            assert isinstance(refused, Rejection) and refused.code is Code.UNAUTHORIZED
            refused = await agent.cordon("node-00")
            assert isinstance(refused, Rejection) and refused.code is Code.UNAUTHORIZED


async def test_garbage_and_oversized_frames_are_dropped_while_serving(
        tmp_path: pathlib.Path, anyio_backend: str) -> None:
    with running(tmp_path, anyio_backend) as cluster, anyio.fail_after(60):
        layout = cluster.layout
        for port in (layout.peer_ports[0], layout.client_ports[0]):
            with socket.create_connection((HOST, port)) as raw:
                raw.sendall(b"\x16\x03\x01 garbage that is no TLS record \xff" * 10)
        tls = layout.tls_for(Identity(IdentityRole.ADMIN, "root"))
        assert tls is not None
        context = tls.client_context()
        with socket.create_connection((HOST, layout.client_ports[0])) as raw, \
                context.wrap_socket(raw) as secured:
            secured.sendall(struct.pack(">I", 1 << 30))  # a frame far past the cap
            secured.settimeout(5)
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                while secured.recv(100):
                    pass
                raise ConnectionError("closed")
        await configured(cluster)
        async with layout.client(IdentityRole.ADMIN, "root", FAST) as client:
            status = await client.status(layout.endpoints[0])
        refused = status["transport"]
        assert refused.get("transport.tls_refused", 0) >= 2
        assert refused.get("transport.frames_refused_oversized", 0) >= 1
